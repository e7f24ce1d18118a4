"""Configuration: one loader and validator for the CLI, the Snakefile and the Python API.

``load_config(path)`` reads YAML, fills defaults from the JSON schema
(``mcfl/schema/config.schema.yaml``), validates it, then checks what a schema cannot: each method
entry against its algorithm's ``Params`` dataclass, each data ``prepare`` block against its source
function's signature, each ``model`` block against its builder's, and K against the number of
clients. Every error is a :class:`ConfigError` naming the key (``methods[2].K``,
``datasets.digits.train.lr``) and, where there is a list, the allowed values. Nothing is run before
the whole config passes.

``expand_runs(cfg)`` turns the config into the list of runs, one per (dataset, method entry, K,
seed); each run is a plain dict that fully determines the training job (it is the job's Snakemake
``params`` value and its MLflow params).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).parent / "schema" / "config.schema.yaml"


class ConfigError(ValueError):
    pass


def _schema() -> dict:
    from mcfl import algorithms, models
    from mcfl.data import SOURCES

    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    schema["$defs"]["method"]["properties"]["method"]["enum"] = sorted(algorithms.ALGORITHMS)
    ds = schema["properties"]["datasets"]["additionalProperties"]["properties"]
    ds["prepare"]["properties"]["source"]["enum"] = sorted(SOURCES)
    ds["model"]["properties"]["name"]["enum"] = sorted(models.MODELS)
    return schema


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _fill_defaults(node: Any, schema: dict, root: dict) -> None:
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].split("/")[-1]]
    if not isinstance(node, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if "$ref" in sub:
            sub = root["$defs"][sub["$ref"].split("/")[-1]]
        if key not in node:
            if "default" in sub:
                node[key] = copy.deepcopy(sub["default"])
            elif sub.get("type") == "object" and any("default" in s for s in sub.get("properties", {}).values()):
                node[key] = {}
        if key in node:
            _fill_defaults(node[key], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in node.items():
            if key not in schema.get("properties", {}):
                _fill_defaults(value, extra, root)


def _check_kwargs(where: str, fn, kwargs: dict, skip: tuple[str, ...] = ()) -> None:
    sig = inspect.signature(fn)
    allowed = [n for n, p in sig.parameters.items()
               if p.kind == p.KEYWORD_ONLY or (p.default is not p.empty)]
    for key in kwargs:
        if key not in allowed and key not in skip:
            raise ConfigError(f"{where}.{key}: unknown parameter; allowed: {', '.join(allowed)}")


def _source_fn(source: str):
    from mcfl.data import SOURCES

    module, fn = SOURCES[source].split(":")
    return getattr(importlib.import_module(module), fn)


def method_params(entry: dict, where: str, K: int | None = None):
    """Build the algorithm's Params from a method entry (type- and value-checked)."""
    from mcfl import algorithms

    cls = algorithms.get(entry["method"])
    fields = {f.name: f for f in dataclasses.fields(cls.Params)}
    kw = {k: v for k, v in entry.items() if k not in ("method", "name", "train", "K", "datasets")}
    if K is not None:
        if not cls.clustered:
            raise ConfigError(f"{where}.K: {cls.name} does not take K (it is not a clustered method)")
        kw["K"] = K
    for key, value in kw.items():
        if key not in fields:
            raise ConfigError(f"{where}.{key}: unknown parameter of {cls.name}; allowed: "
                              f"{', '.join(fields) or '(none)'}")
        typ = fields[key].type if isinstance(fields[key].type, str) else fields[key].type.__name__
        ok = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool)}
        if typ in ok and not ok[typ](value):
            raise ConfigError(f"{where}.{key}: expected {typ}, got {value!r}")
        if typ == "float":
            kw[key] = float(value)
    try:
        return cls.Params(**kw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e


def validate(cfg: dict, source: str = "config") -> dict:
    """Fill defaults and validate ``cfg`` in place; return it. Raises ConfigError."""
    import jsonschema

    from mcfl import models

    schema = _schema()
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: top level must be a mapping")
    _fill_defaults(cfg, schema, schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(cfg),
                    key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        e = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"{source}: {_path(e.absolute_path)}: {e.message}{more}")
    for name, ds in cfg["datasets"].items():
        prep = ds["prepare"]
        _check_kwargs(f"datasets.{name}.prepare", _source_fn(prep["source"]), prep, skip=("source",))
        _check_kwargs(f"datasets.{name}.model", models.MODELS[ds["model"]["name"]],
                      ds["model"], skip=("name",))
    for i, entry in enumerate(cfg["methods"]):
        for name in entry.get("datasets", []):
            if name not in cfg["datasets"]:
                raise ConfigError(f"{source}: methods[{i}].datasets: unknown dataset {name!r}; "
                                  f"known: {', '.join(cfg['datasets'])}")
        Ks = entry.get("K")
        for K in (Ks if isinstance(Ks, list) else [Ks]):
            params = method_params(entry, f"methods[{i}]", K)
            k = getattr(params, "K", None)
            for name, ds in cfg["datasets"].items():
                if name not in entry.get("datasets", cfg["datasets"]):
                    continue
                n = ds["prepare"].get("clients")
                if k is not None and isinstance(n, int) and k > n:
                    raise ConfigError(f"{source}: methods[{i}].K: K={k} is larger than the number "
                                      f"of clients of dataset {name!r} (datasets.{name}.prepare."
                                      f"clients = {n})")
    runs = expand_runs(cfg)
    seen: dict[tuple, int] = {}
    for r in runs:
        key = (r["dataset"], r["run_id"], r["seed"])
        if key in seen:
            raise ConfigError(f"{source}: methods: two entries both make run {r['run_id']!r}; give "
                              f"one of them a distinct `name`")
        seen[key] = 1
    return cfg


def load_config(path: str | Path) -> dict:
    path = Path(path)
    try:
        cfg = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    try:
        return validate(cfg, str(path))
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def expand_runs(cfg: dict) -> list[dict[str, Any]]:
    """One run dict per (dataset, method entry, K, seed), in config order."""
    from mcfl import algorithms

    runs = []
    for dname, ds in cfg["datasets"].items():
        for i, entry in enumerate(cfg["methods"]):
            if dname not in entry.get("datasets", [dname]):
                continue
            cls = algorithms.get(entry["method"])
            Ks = entry.get("K")
            for K in (Ks if isinstance(Ks, list) else [Ks]):
                params = dataclasses.asdict(method_params(entry, f"methods[{i}]", K))
                base = entry.get("name", cls.name)
                k = params.get("K") if cls.clustered else None
                label, run_id = (f"{base}({k})", f"{base}-K{k}") if k is not None else (base, base)
                train = {**ds["train"], **entry.get("train", {})}
                for seed in cfg["seeds"]:
                    runs.append({"dataset": dname, "method": cls.name, "label": label,
                                 "run_id": run_id, "seed": int(seed), "params": params,
                                 "model": dict(ds["model"]), "train": train,
                                 "data": dict(ds["prepare"]), "experiment": cfg["experiment"],
                                 "needs_centres": cls.needs_centres})
    return runs
