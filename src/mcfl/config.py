"""Configuration: one loader and validator for the CLI, the Snakefile and the Python API.

``load_config(path)`` reads YAML, fills defaults from the JSON schema
(``mcfl/schema/config.schema.yaml``), validates it, then checks what a schema cannot: each method
entry against its algorithm's ``Params`` dataclass, each data ``prepare`` block against its source
function's signature, each ``model`` block against its builder's, and K against the number of
clients. Every error is a :class:`ConfigError` naming the key (``methods[2].K``,
``datasets.digits.train.lr``) and, where there is a list, the allowed values. Nothing is run before
the whole config passes.

Values of source, model and method parameters are checked against the function's or ``Params``'
type annotations with pydantic (strict: no string-to-number coercion), including ``Literal``
choices and ``Annotated`` bounds (``Annotated[int, Ge(1)]``, from ``annotated_types``); a parameter
without an annotation must have the type of its default.

``expand_runs(cfg)`` turns the config into the list of runs, one per (dataset, method entry, K,
seed); each run is a plain dict that fully determines the training job (it is the job's Snakemake
``params`` value and its MLflow params).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).parent / "schema" / "config.schema.yaml"


class ConfigError(ValueError):
    pass


#: top-level config blocks that belong to one paper: key -> "module:function(cfg, source)", run
#: after the rest of the config validated (the hook may expand runs; it raises ConfigError)
SECTIONS = {"fedgsp": "mcfl.fedgsp.config:check_fedgsp"}


#: integers larger than this are rejected anywhere in a config (keys naming a seed excepted): no
#: count (rounds, clients, K, widths, ...) is meant to be that large, and some allocate memory
SIZE_LIMIT = 10**9


def _check_numbers(node: Any, parts: list) -> None:
    """Every number of the config is finite (YAML's .nan/.inf pass JSON-schema bounds) and no
    integer is unreasonably large; the error names the key."""
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
    elif (isinstance(node, int) and not isinstance(node, bool) and abs(node) > SIZE_LIMIT
          and not any("seed" in str(p) for p in parts)):
        raise ConfigError(f"{_path(parts)}: {node} is not allowed: larger than {SIZE_LIMIT:.0e}")


#: a config file larger than this is refused before it is parsed (the shipped ones are < 20 kB)
MAX_BYTES = 1 << 20
#: mappings and lists nested deeper than this are refused while parsing (configs use about 6)
MAX_DEPTH = 32
#: the most training runs one config may make (datasets x method entries x K x seeds)
MAX_RUNS = 100_000
#: the most nodes (values, lists, mappings) a config may stand for once its aliases are expanded
MAX_NODES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """safe_load that rejects a key given twice in one mapping (PyYAML keeps the last silently),
    nesting deeper than :data:`MAX_DEPTH` (Python's recursion limit would end it in a
    RecursionError) and a document that, its aliases (``*name``) expanded, holds more than
    :data:`MAX_NODES` nodes: a few hundred bytes of nested aliases can stand for 10^9 nodes, which
    every walk over the config (validation, planning) would visit."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, int] = {}          # id(node) -> nodes it stands for, expanded

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ConfigError(f"line {line}: nested more than {MAX_DEPTH} levels deep")
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if id(node) not in self._sizes:           # an alias's node is counted where it was defined
            kids = (node.value if isinstance(node, yaml.SequenceNode) else
                    [n for kv in node.value for n in kv] if isinstance(node, yaml.MappingNode) else [])
            self._sizes[id(node)] = 1 + sum(self._sizes.get(id(k), 1) for k in kids)
        size = self._sizes[id(node)]
        if size > MAX_NODES:
            raise ConfigError(f"line {line}: the config stands for more than {MAX_NODES} values "
                              f"once its YAML aliases (*name) are expanded")
        return node

    def compose_document(self):
        node = super().compose_document()
        self._sizes.clear()
        return node


def _no_duplicates(loader, node, deep=False):
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            if key in seen:
                raise ConfigError(f"line {line}: duplicate key {key!r} (first given on line {seen[key]})")
        except TypeError:                       # an unhashable key: PyYAML reports it itself
            continue
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML config file; every failure is a one-line ConfigError naming the file. Files
    over :data:`MAX_BYTES`, nesting over :data:`MAX_DEPTH` and more than :data:`MAX_NODES` values
    (aliases expanded) are refused, so no config can make the loader (or what walks its result)
    hang or recurse without bound."""
    path = Path(path)
    try:
        if path.is_file() and path.stat().st_size > MAX_BYTES:
            raise ConfigError(f"{path}: {path.stat().st_size} bytes; a config file may hold at "
                              f"most {MAX_BYTES} bytes")
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(f"{path}: ") else f"{path}: {msg}") from None


def _schema() -> dict:
    from mcfl import algorithms, models
    from mcfl.data import SOURCES

    from mcfl.trainspec import read_schema

    schema = read_schema()
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
    from mcfl import algorithms

    cls = algorithms.get(entry["method"])
    fields = {f.name: f for f in dataclasses.fields(cls.Params)}
    kw = {k: v for k, v in entry.items() if k not in ("method", "name", "label", "train", "K", "select_k", "datasets", "seeds")}
    if K == "auto":                     # chosen later by the select_k rule (mcfl.cluster.select_k)
        if not hasattr(cls.Params(), "K"):
            raise ConfigError(f"{where}.K: {cls.name} does not take K, so K cannot be 'auto'")
    elif K is not None:
        if not cls.clustered:
            raise ConfigError(f"{where}.K: {cls.name} does not take K (it is not a clustered method)")
        kw["K"] = K
    hints = _hints(cls.Params)
    for key, value in kw.items():
        if key not in fields:
            raise ConfigError(f"{where}.{key}: unknown parameter of {cls.name}; allowed: "
                              f"{', '.join(fields) or '(none)'}")
        hint = hints.get(key, Any)
        _check_value(f"{where}.{key}", value, hint)
        if float in (hint, *typing.get_args(hint)[:1]) and isinstance(value, int):
            kw[key] = float(value)
    try:
        return cls.Params(**kw)
    except (TypeError, ValueError) as e:    # Params' own checks: name the field they are about
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

    from mcfl import models
    from mcfl.data import source_fn

    schema = _schema()
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: top level must be a mapping")
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
        _check_kwargs(f"datasets.{name}.model", models.MODELS[ds["model"]["name"]],
                      ds["model"], skip=("name",))
    for i, entry in enumerate(cfg["methods"]):
        unknown = [d for d in entry.get("datasets", []) if d not in cfg["datasets"]]
        if unknown:
            raise ConfigError(f"{source}: methods[{i}].datasets: unknown dataset {unknown[0]!r}; "
                              f"known: {', '.join(cfg['datasets'])}")
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
                from mcfl.cluster.select_k import select_k_settings

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
    seen: dict[tuple, int] = {}
    for r in runs:
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
    for key, hook in SECTIONS.items():          # a paper's own block, e.g. `fedgsp:`
        if key in cfg:
            module, fn = hook.split(":")
            getattr(importlib.import_module(module), fn)(cfg, source)
    used = {r["dataset"] for r in runs} | ({cfg["fedgsp"]["dataset"]} if "fedgsp" in cfg else set())
    for name in cfg["datasets"]:
        if name not in used:
            raise ConfigError(f"{source}: datasets.{name}: no method entry runs on it (their "
                              f"`datasets` lists leave it out), so it would never be prepared; "
                              f"remove it or add it to an entry's `datasets`")
    return cfg


def _check_partition(name: str, block: dict | None) -> None:
    from mcfl.data.repartition import resolve

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
RUN_KEYS = ("dataset", "method", "label", "run_id", "seed", "params", "model", "train")
SPEC_KEYS = ("dataset", "seed", "model", "train", "K")


def parse_run(text: str, *, flag: str = "--run", spec_ok: bool = False) -> dict:
    """A run's (or, with ``spec_ok``, a centre spec's) JSON text from the command line, checked:
    JSON, the keys training reads, every number finite, a run's ``train`` against the schema and
    its ``params`` against the method. Errors are one-line ConfigErrors naming ``flag`` and the key."""
    import json

    import jsonschema
    from jsonschema.exceptions import best_match

    from mcfl import algorithms

    try:
        run = json.loads(text)
    except json.JSONDecodeError as e:
        hint = " (that is a file name)" if Path(text).exists() else ""
        raise ConfigError(f"{flag}: not JSON text{hint} ({e}); pass the run's JSON itself, as "
                          f"`mcfl check-config` and the workflow make it") from None
    keys = SPEC_KEYS if spec_ok and isinstance(run, dict) and "params" not in run else RUN_KEYS
    missing = [k for k in keys if not isinstance(run, dict) or k not in run]
    if missing:
        raise ConfigError(f"{flag}: missing keys {', '.join(missing)}; pass a run's JSON as "
                          f"`mcfl.config.expand_runs` makes it")
    try:
        _check_numbers(run, [])
        for key in ("train", "model") + (("params",) if keys is RUN_KEYS else ()):
            if not isinstance(run[key], dict):
                raise ConfigError(f"{key}: must be an object, found {run[key]!r:.40}")
        train_schema = {"$ref": "#/$defs/train", "$defs": _schema()["$defs"]}     # its $refs resolve
        errors = list(jsonschema.Draft202012Validator(train_schema).iter_errors(run["train"]))
        if errors:
            e = best_match(errors)
            raise ConfigError(f"{_path(['train', *e.absolute_path])}: {e.message}")
        if keys is RUN_KEYS and "rounds" not in run["train"]:
            raise ConfigError("train.rounds: missing")
        if keys is RUN_KEYS and run["params"].get("K") != "auto":
            if run["method"] not in algorithms.ALGORITHMS:
                raise ConfigError(f"method: unknown method {run['method']!r}; known: "
                                  f"{', '.join(sorted(algorithms.ALGORITHMS))}")
            entry = {"method": run["method"], **{k: v for k, v in run["params"].items() if k != "K"}}
            method_params(entry, "params", run["params"].get("K"))
    except ConfigError as e:
        raise ConfigError(f"{flag}: {e}") from None
    return run


#: the default config's file name (``config/config.yaml``): it keeps the schema's ``results`` and
#: ``experiment`` defaults instead of names derived from the file name
DEFAULT_CONFIG_STEM = "config"


def name_defaults(cfg: Any, path: str | Path) -> Any:
    """Fill the ``results`` and ``experiment`` a config file leaves out from its file name, so that
    two configs never write into one results folder or MLflow experiment: ``my-leaf.yaml`` ->
    ``results: results-my-leaf``, ``experiment: my-leaf``. A file named ``config.yaml`` (the
    default config's name) keeps the schema's defaults, ``results`` and ``mcfl``. Characters
    other than letters, digits, ``.``, ``_`` and ``-`` become ``_``."""
    import re

    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(path).stem) or "config"
    if isinstance(cfg, dict) and stem != DEFAULT_CONFIG_STEM:
        cfg.setdefault("results", f"results-{stem}")
        cfg.setdefault("experiment", stem)
    return cfg


def merge(base: dict, overlay: dict, where: str = "overlay") -> dict:
    """``overlay`` merged into ``base`` (in place; returned) as Snakemake merges ``--configfile a b``:
    a mapping merges key by key, any other value (a list included) replaces the base's. An overlay
    may list, under a top-level ``replace:``, dotted keys whose base value is replaced whole by the
    overlay's instead of merged with it, or dropped where the overlay does not set the key
    (``replace: [publish]`` without a ``publish:`` block: the merged config publishes nothing)."""
    overlay = dict(overlay)
    replace = overlay.pop("replace", [])
    if not (isinstance(replace, list) and all(isinstance(k, str) and k for k in replace)):
        raise ConfigError(f"{where}: replace: must be a list of dotted keys (e.g. [publish, datasets])")
    for key in replace:
        *parents, last = key.split(".")
        node = base
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            raise ConfigError(f"{where}: replace: {key!r} is not a key of the config it overlays")
        del node[last]
    _merge(base, overlay)
    return base


def _merge(base: dict, overlay: dict) -> None:
    for k, v in overlay.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)


def read_configs(paths) -> dict:
    """The config files ``paths`` read and merged in order (:func:`merge`), not yet validated."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError("no config file given")
    cfg: dict = {}
    for i, path in enumerate(paths):
        doc = read_yaml(path)
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: a config file is a mapping of keys (datasets:, methods:, ...), "
                              f"not a {type(doc).__name__}")
        if i == 0 and "replace" in doc:
            raise ConfigError(f"{path}: replace: belongs in an overlay (a config file given after the first)")
        merge(cfg, doc, str(path))
    return cfg


def load_config(*paths: str | Path) -> dict:
    """Read and merge in order (a base config, then overlays), complete (:func:`name_defaults`: from
    the last file's name; the schema's defaults) and validate config files."""
    source = " + ".join(map(str, paths))
    cfg = name_defaults(read_configs(paths), paths[-1])
    try:
        return validate(cfg, source)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def expand_runs(cfg: dict) -> list[dict[str, Any]]:
    """One run dict per (dataset, method entry, K, seed), in config order."""
    from mcfl import algorithms
    from mcfl.data.repartition import label as partition_label

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
                if K == "auto":
                    params["K"] = "auto"
                k = params.get("K") if cls.clustered else None
                label, run_id = (f"{base}({k})", f"{base}-K{k}") if k is not None else (base, base)
                label = entry.get("label", label)
                train = {**ds["train"], **entry.get("train", {})}
                if params.get("warmup", 0) >= train["rounds"]:       # FeSEM's warm-up must end
                    raise ConfigError(f"methods[{i}].warmup: {params['warmup']} warm-up rounds leave none "
                                      f"of {dname}'s {train['rounds']} rounds to the K clusters; use fewer")
                for seed in entry.get("seeds", cfg["seeds"]):
                    runs.append({"dataset": dname, "method": cls.name, "label": label,
                                 "run_id": run_id, "seed": int(seed), "params": params,
                                 "model": dict(ds["model"]), "train": train,
                                 "data": dict(ds["prepare"]), "experiment": cfg["experiment"],
                                 "partition": partition_label(ds.get("partition")),
                                 "needs_centres": cls.uses_centres(params),
                                 "select_k": _select_k(entry) if K == "auto" else None})
    return runs


def _select_k(entry: dict) -> dict:
    from mcfl.cluster.select_k import select_k_settings

    return dataclasses.asdict(select_k_settings(entry))
