"""Validating a config, and the runs it makes (:func:`expand_runs`: one plain dict per dataset,
method entry, K and seed, which fully determines a training job: its Snakemake ``params`` value and
its MLflow params). Validation: defaults from the JSON schema (``mcfl/schema/config.schema.yaml``), then
what a schema cannot check: each method entry against its algorithm's ``Params``, each data
``prepare`` block against its source function's signature, each ``model`` block against its
builder's, K against the number of clients. Every error is a :class:`ConfigError` naming the key.

Values of source, model and method parameters are checked against the function's or ``Params``'
type annotations with pydantic (strict: no string-to-number coercion), including ``Literal``
choices and ``Annotated`` bounds (``Annotated[int, Ge(1)]``, from ``annotated_types``); a parameter
without an annotation must have the type of its default.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import math
import struct
import types
import typing
from pathlib import Path
from typing import Any

from mcfl import methods
from mcfl.cluster.spec import select_k_settings
from mcfl.config.compose import compose
from mcfl.config.files import MAX_DEPTH, MAX_RUNS, ConfigError, _path
from mcfl.data import SOURCES, source_fn
from mcfl.data.repartition import label as partition_label
from mcfl.data.repartition import resolve
from mcfl.paths import plain_name
from mcfl.replication import ReplicationError, add_draws
from mcfl.trainspec import read_schema

SCHEMA_PATH = Path(__file__).parents[1] / "schema" / "config.schema.yaml"


#: top-level config blocks that belong to one paper (``fedgsp:``): "module:function" giving key ->
#: the registered paper (:func:`mcfl.papers.sections`), whose schema fragment validates the block and
#: whose check runs after the rest of the config validated (it may expand runs; it raises
#: ConfigError). Named, not imported: the papers' planners import this package.
SECTIONS = "mcfl.papers:sections"


def _paper_sections() -> dict:
    """Config key -> the paper that owns it; a paper that cannot be loaded is a ConfigError."""
    module, fn = SECTIONS.split(":")
    try:
        return getattr(importlib.import_module(module), fn)()
    except ValueError as e:             # mcfl.papers.PaperError: a plugin paper that cannot be used
        raise ConfigError(str(e)) from None


#: integers larger than this are rejected anywhere in a config (keys naming a seed excepted): no
#: count (rounds, clients, K, widths, ...) is meant to be that large, and some allocate memory
SIZE_LIMIT = 10**9


#: the largest finite float32 and the smallest positive one (subnormal): a config's float outside
#: this range would be inf or 0 once training casts it to float32 (``lr: 1e300``)
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45


def _fits_float32(x: float) -> bool:
    """``x`` cast to float32 (round to nearest, as ``torch.tensor(x)`` does) is finite, and not 0
    unless ``x`` is."""
    try:
        y = struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return False
    return math.isfinite(y) and (y != 0 or x == 0)


def _check_numbers(node: Any, parts: list) -> None:
    """Every number of the config is finite (YAML's .nan/.inf pass JSON-schema bounds) and a float
    in float32's range (:func:`_fits_float32`: the precision training uses its hyper-parameters in),
    and no integer is unreasonably large; the error names the key."""
    if len(parts) > MAX_DEPTH:
        raise ConfigError(f"{_path(parts)}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(node, dict):
        for k, v in node.items():
            if not isinstance(k, str):
                raise ConfigError(f"{_path(parts + [repr(k)])}: keys must be strings, found "
                                  f"{type(k).__name__} {k!r:.40} (quote it)")
            _check_numbers(v, parts + [k])
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_numbers(v, parts + [i])
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{_path(parts)}: {node} is not allowed: numbers must be finite")
    elif isinstance(node, float) and not _fits_float32(node):
        raise ConfigError(f"{_path(parts)}: {node} is not allowed: it is "
                          f"{'inf' if abs(node) > 1 else '0'} as a float32, the precision "
                          f"models train in (magnitudes from {FLOAT32_TINY:.1e} to {FLOAT32_MAX:.1e})")
    elif (isinstance(node, int) and not isinstance(node, bool) and abs(node) > SIZE_LIMIT
          and not any("seed" in str(p) for p in parts)):
        raise ConfigError(f"{_path(parts)}: {node} is not allowed: larger than {SIZE_LIMIT:.0e}")


def model_zoo() -> dict:
    """The model builders by name (:data:`mcfl.models.MODELS`)."""
    from mcfl import models     # deferred: PyTorch, which checking a config needs nowhere else

    return models.MODELS


def _schema() -> dict:
    schema = read_schema()
    schema["$defs"]["method"]["properties"]["model"]["properties"]["name"]["enum"] = sorted(model_zoo())
    ds = schema["properties"]["datasets"]["additionalProperties"]["properties"]
    ds["prepare"]["properties"]["source"]["enum"] = sorted(SOURCES)
    ds["model"]["properties"]["name"]["enum"] = sorted(model_zoo())
    for key, paper in _paper_sections().items():      # a plugin paper's block
        if paper.schema:
            schema["properties"].setdefault(key, paper.load("schema"))
    return schema


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


def _hints(obj) -> dict[str, Any]:
    try:
        return typing.get_type_hints(obj, include_extras=True)
    except Exception:  # noqa: BLE001 - an annotation that cannot be resolved: fall back to defaults
        return {}


#: plain annotations a value of exactly the type satisfies under pydantic's strict mode
_PLAIN = (int, float, str, bool)


def _plainly_fits(value: Any, hint: Any) -> bool:
    """``value`` fits ``hint`` without asking pydantic: ``hint`` is int, float, str or bool (or such
    a type or None, ``int | None``) and ``value`` is of exactly that type (a bool is no int). What
    is not this plain, pydantic checks; so a training job that validates its ``--run`` does not
    import pydantic for the usual hyperparameters."""
    if hint in _PLAIN:
        return type(value) is hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = typing.get_args(hint)
        return all(a in _PLAIN or a is type(None) for a in args) and type(value) in args
    return False


def _check_value(where: str, value: Any, hint: Any) -> None:
    """Raise ConfigError naming ``where`` unless ``value`` fits the type annotation ``hint``."""
    if _plainly_fits(value, hint):
        return
    from pydantic import TypeAdapter, ValidationError

    adapter = TypeAdapter(hint)
    try:
        try:
            adapter.validate_python(value, strict=True)
        except ValidationError:
            if not isinstance(value, list):   # YAML has no tuples: a list may fill a tuple parameter
                raise
            adapter.validate_python(tuple(value), strict=True)
    except ValidationError as e:
        err = e.errors()[0]
        loc = "".join(f"[{p}]" if isinstance(p, int) else "" for p in err["loc"])
        raise ConfigError(f"{where}{loc}: {value!r} is not allowed: {err['msg']}") from None


def _param_hint(par: inspect.Parameter, hints: dict) -> Any:
    if par.name in hints:
        return hints[par.name]
    d = par.default
    return list if isinstance(d, (list, tuple)) else (type(d) if d not in (None, par.empty) else Any)


def _check_kwargs(where: str, fn, kwargs: dict, skip: tuple[str, ...] = ()) -> None:
    sig = inspect.signature(fn)
    hints = _hints(fn)
    allowed = [n for n, p in sig.parameters.items()
               if p.kind == p.KEYWORD_ONLY or (p.default is not p.empty)]
    missing = [n for n, p in sig.parameters.items()
               if p.kind == p.KEYWORD_ONLY and p.default is p.empty and n not in kwargs]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: required (no default)")
    for key, value in kwargs.items():
        if key in skip:
            continue
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown parameter; allowed: {', '.join(allowed)}")
        _check_value(f"{where}.{key}", value, _param_hint(sig.parameters[key], hints))


def method_params(entry: dict, where: str, K: int | None = None):
    """Build the algorithm's Params from a method entry (type- and value-checked)."""
    try:
        cls = methods.get(entry["method"])
        name = methods.plain_name(entry["method"])
    except methods.MethodError as e:
        raise ConfigError(f"{where}.method: {e}") from None
    return params_of(cls, name, entry, where, K)


def params_of(cls, name: str, entry: dict, where: str, K: int | None = None):
    """The Params of algorithm class ``cls`` (called ``name`` in errors) from a method entry."""
    fields = {f.name: f for f in dataclasses.fields(cls.Params)}
    kw = {k: v for k, v in entry.items()
          if k not in ("method", "name", "label", "train", "model", "K", "select_k", "datasets", "seeds")}
    if K == "auto":                     # chosen later by the select_k rule (mcfl.select_k)
        if not hasattr(cls.Params(), "K"):
            raise ConfigError(f"{where}.K: {name} does not take K, so K cannot be 'auto'")
    elif K is not None:
        if not cls.clustered:
            raise ConfigError(f"{where}.K: {name} does not take K (it is not a clustered method)")
        kw["K"] = K
    hints = _hints(cls.Params)
    for key, value in kw.items():
        if key not in fields:
            raise ConfigError(f"{where}.{key}: unknown parameter of {name}; allowed: "
                              f"{', '.join(fields) or '(none)'}")
        hint = hints.get(key, Any)
        _check_value(f"{where}.{key}", value, hint)
        if float in (hint, *typing.get_args(hint)[:1]) and isinstance(value, int):
            kw[key] = float(value)
    try:
        return cls.Params(**kw)
    except (TypeError, ValueError, AssertionError) as e:    # Params' own checks: name the field they are about
        key = next((k for k in fields if str(e).startswith(f"{k} ")), None)
        raise ConfigError(f"{where}.{key}: {e}" if key else f"{where}: {e}") from e


def validate(cfg: dict, source: str = "config") -> dict:
    """Fill defaults and validate ``cfg`` in place; return it. Raises ConfigError."""
    try:
        return _validate(cfg, source)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(f"{source}: ") else f"{source}: {msg}") from None


def _validate(cfg: dict, source: str) -> dict:
    import jsonschema
    from jsonschema.exceptions import best_match

    schema = _schema()
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: top level must be a mapping")
    compose(cfg)                                # vars: and method sets, before the schema sees them
    _check_numbers(cfg, [])
    _fill_defaults(cfg, schema, schema)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(cfg))
    if errors:
        e = best_match(errors)                  # descends into oneOf: "K[0]: 0 is less than ..."
        msg = e.message
        if e.validator == "additionalProperties":
            msg += f"; allowed: {', '.join(e.schema.get('properties', {}))}"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"{source}: {_path(e.absolute_path)}: {msg}{more}")
    try:                                    # `replication:` draws become datasets: check them too
        if add_draws(cfg, expand_runs):
            return _validate(cfg, source)
    except ReplicationError as e:
        raise ConfigError(f"{source}: {e}") from None
    n_runs = sum(len(e["K"]) if isinstance(e.get("K"), list) else 1 for name in cfg["datasets"]
                 for e in cfg["methods"] if name in e.get("datasets", [name])) * len(cfg["seeds"])
    if n_runs > MAX_RUNS:                   # before any per-run work (an upper bound: seeds subsets)
        raise ConfigError(f"{source}: methods: the config makes up to {n_runs} runs; at most "
                          f"{MAX_RUNS} (split it into several configs)")
    for name, ds in cfg["datasets"].items():
        prep = ds["prepare"]
        fn = source_fn(prep["source"])
        _check_kwargs(f"datasets.{name}.prepare", fn, prep, skip=("source",))
        if hasattr(fn, "check"):                # the source's own option rules (e.g. LEAF's)
            defaults = {n: p.default for n, p in inspect.signature(fn).parameters.items()
                        if p.default is not p.empty}
            try:
                fn.check(**{**defaults, **{k: v for k, v in prep.items() if k != "source"}})
            except ValueError as e:
                raise ConfigError(f"{source}: datasets.{name}.prepare: {e}") from None
        _check_partition(name, ds.get("partition"))
        _check_kwargs(f"datasets.{name}.model", model_zoo()[ds["model"]["name"]],
                      ds["model"], skip=("name",))
    for i, entry in enumerate(cfg["methods"]):
        unknown = [d for d in entry.get("datasets", []) if d not in cfg["datasets"]]
        if unknown:
            raise ConfigError(f"{source}: methods[{i}].datasets: unknown dataset {unknown[0]!r}; "
                              f"known: {', '.join(cfg['datasets'])}")
        if "model" in entry:
            _check_kwargs(f"methods[{i}].model", model_zoo()[entry["model"]["name"]], entry["model"],
                          skip=("name",))
        other = [s for s in entry.get("seeds", []) if s not in cfg["seeds"]]
        if other:
            raise ConfigError(f"{source}: methods[{i}].seeds: seed {other[0]} is not one of the config's "
                              f"seeds {cfg['seeds']}; an entry's seeds are a subset of them")
        Ks = entry.get("K")
        for K in (Ks if isinstance(Ks, list) else [Ks]):
            params = method_params(entry, f"methods[{i}]", K)
            k = getattr(params, "K", None) if K != "auto" else None
            if "label" in entry and isinstance(Ks, list) and len(Ks) > 1:
                raise ConfigError(f"{source}: methods[{i}].label: one label for {len(Ks)} values of K; "
                                  f"give each K its own entry")
            if "select_k" in entry and K != "auto":
                raise ConfigError(f"{source}: methods[{i}].select_k: only used with K: auto")
            if K == "auto":
                try:
                    sk = select_k_settings(entry)
                except (TypeError, ValueError) as e:
                    raise ConfigError(f"{source}: methods[{i}].select_k: {e}") from None
                k = max(sk.K)
            for name, ds in cfg["datasets"].items():
                if name not in entry.get("datasets", [name]):
                    continue
                n = n_clients(ds)
                if k is not None and isinstance(n, int) and k > n:
                    raise ConfigError(f"{source}: methods[{i}].K: K={k} is larger than the number "
                                      f"of clients of dataset {name!r} ({n} clients)")
    for name, ds in cfg["datasets"].items():              # clients per round vs clients
        n = n_clients(ds)
        trains = [(f"datasets.{name}.train", ds["train"])] + [
            (f"methods[{i}].train", e["train"]) for i, e in enumerate(cfg["methods"]) if "train" in e]
        for where, t in trains:
            c = t.get("clients_per_round")
            if isinstance(n, int) and isinstance(c, int) and c > n:
                raise ConfigError(f"{source}: {where}.clients_per_round: {c} is larger than the "
                                  f"number of clients of dataset {name!r} ({n} clients); use null "
                                  f"for all clients")
    runs = expand_runs(cfg)
    for r in runs:                                      # per-cluster sampling: clustered methods only
        c = r["train"].get("clients_per_cluster")
        if not c:
            continue
        where = f"methods: {r['label']} on {r['dataset']}: train.clients_per_cluster"
        if not methods.get(r["method"]).clustered:
            raise ConfigError(f"{source}: {where}: {r['method']} has no clusters to sample from; use "
                              f"clients_per_round")
        if r["train"].get("clients_per_round") is not None:
            raise ConfigError(f"{source}: {where}: {c} needs clients_per_round: null beside it (got "
                              f"{r['train']['clients_per_round']}): a round trains {c} clients of each cluster")
    seen: dict[tuple, int] = {}
    for r in runs:
        for k in ("dataset", "label", "run_id"):       # parts of the run's paths (mcfl.paths)
            try:
                plain_name(r[k], k)
            except ValueError as e:
                raise ConfigError(f"{source}: methods: {e}") from None
        key = (r["dataset"], r["run_id"], r["seed"])
        if key in seen:
            raise ConfigError(f"{source}: methods: two entries both make run {r['run_id']!r}; give "
                              f"one of them a distinct `name`")
        seen[key] = 1
        key = (r["dataset"], "label", r["label"], r["seed"])
        if key in seen:
            raise ConfigError(f"{source}: methods: two entries both have the label {r['label']!r}; "
                              f"give one of them a distinct `name` or `label`")
        seen[key] = 1
    for key, paper in _paper_sections().items():      # a paper's own block, e.g. `fedgsp:`
        if key in cfg and paper.check:
            paper.load("check")(cfg, source)
    used = {r["dataset"] for r in runs} | ({cfg["fedgsp"]["dataset"]} if "fedgsp" in cfg else set())
    for name in cfg["datasets"]:
        if name not in used:
            raise ConfigError(f"{source}: datasets.{name}: no method entry runs on it (their "
                              f"`datasets` lists leave it out), so it would never be prepared; "
                              f"remove it or add it to an entry's `datasets`")
    return cfg


def _check_partition(name: str, block: dict | None) -> None:
    try:
        r = resolve(block)
    except ValueError as e:
        raise ConfigError(f"datasets.{name}.partition: {e}") from None
    if r["scheme"] == "natural" and (block or {}).get("clients") is not None:
        raise ConfigError(f"datasets.{name}.partition.clients: scheme natural keeps the dataset's "
                          f"clients; remove clients or pick another scheme")


def n_clients(ds: dict) -> int | None:
    """A dataset's number of training clients as far as the config says (None if unknown)."""
    part = ds.get("partition") or {}
    if part.get("scheme", "natural") != "natural" and part.get("clients") is not None:
        return int(part["clients"])
    n = ds["prepare"].get("clients")
    return n if isinstance(n, int) else None


#: the keys of a run (``expand_runs``) that training reads, and of a centre spec (``centre_spec``)


def expand_runs(cfg: dict) -> list[dict[str, Any]]:
    """One run dict per (dataset, method entry, K, seed), in config order."""
    runs = []
    for dname, ds in cfg["datasets"].items():
        for i, entry in enumerate(cfg["methods"]):
            if dname not in entry.get("datasets", [dname]):
                continue
            cls = methods.get(entry["method"])
            Ks = entry.get("K")
            for K in (Ks if isinstance(Ks, list) else [Ks]):
                params = dataclasses.asdict(method_params(entry, f"methods[{i}]", K))
                base = entry.get("name", methods.plain_name(entry["method"]))
                if K == "auto":
                    params["K"] = "auto"
                k = params.get("K") if cls.clustered else None
                label, run_id = (f"{base}({k})", f"{base}-K{k}") if k is not None else (base, base)
                label = entry.get("label", label)
                train = {**ds["train"], **entry.get("train", {})}
                if train.get("precision") == "fp32":     # the default: the same run as leaving it out
                    del train["precision"]
                if params.get("warmup", 0) >= train["rounds"]:       # FeSEM's warm-up must end
                    raise ConfigError(f"methods[{i}].warmup: {params['warmup']} warm-up rounds leave none "
                                      f"of {dname}'s {train['rounds']} rounds to the K clusters; use fewer")
                for seed in entry.get("seeds", cfg["seeds"]):
                    runs.append({"dataset": dname, "method": methods.canonical(entry["method"]), "label": label,
                                 "run_id": run_id, "seed": int(seed), "params": params,
                                 "model": dict(entry.get("model", ds["model"])), "train": train,
                                 "data": dict(ds["prepare"]), "experiment": cfg["experiment"],
                                 "partition": partition_label(ds.get("partition")),
                                 "needs_centres": cls.uses_centres(params),
                                 **({"draw": ds["draw"]} if "draw" in ds else {}),      # mcfl.replication
                                 "select_k": _select_k(entry) if K == "auto" else None})
    return runs


def _select_k(entry: dict) -> dict:
    return dataclasses.asdict(select_k_settings(entry))
