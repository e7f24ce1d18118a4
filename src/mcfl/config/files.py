"""Reading config files: YAML that cannot hang or recurse (no duplicated keys, bounded size,
depth and aliases), the names a config leaves out, and several files merged in order (a base
config, then overlays) as Snakemake merges ``--configfile A B``; a file that names its base with
``extends:`` is read over that base."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from mcfl.inputs import InputError, read_limited


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the key."""


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


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


#: the tag of YAML's merge key ``<<`` (``train: {<<: *defaults, lr: 0.05}``)
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _no_duplicates(loader, node, deep=False):
    """A mapping whose keys are all distinct. Keys merged in by ``<<`` (YAML's merge key, which
    PyYAML's safe loader and Snakemake accept) are not duplicates: a key given beside the merge
    overrides the merged value, as the merge key's specification says; ``<<`` itself is given at
    most once (``<<: [*a, *b]`` merges several)."""
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            line = key_node.start_mark.line + 1
            if _MERGE_TAG in seen:
                raise ConfigError(f"line {line}: duplicate key '<<' (first given on line "
                                  f"{seen[_MERGE_TAG]}); merge several mappings with <<: [*a, *b]")
            seen[_MERGE_TAG] = line
            continue
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
    and streams over :data:`MAX_BYTES` (read with that limit: ``/dev/zero`` or ``<(yes)`` too),
    anything but a regular file or a pipe, nesting over :data:`MAX_DEPTH` and more than
    :data:`MAX_NODES` values (aliases expanded) are refused, so no config can make the loader (or what walks its result)
    hang or recurse without bound."""
    path = Path(path)
    try:
        text = read_limited(path, MAX_BYTES, what="config file", pipes=True).decode("utf-8")
        return yaml.load(text, Loader=_StrictLoader)
    except InputError as e:
        raise ConfigError(str(e)) from None
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


#: the default config's file name (``config/config.yaml``): it keeps the schema's ``results``,
#: ``data_dir`` and ``experiment`` defaults instead of names derived from the file name
DEFAULT_CONFIG_STEM = "config"


def name_defaults(cfg: Any, path: str | Path) -> Any:
    """Fill the ``results``, ``data_dir`` and ``experiment`` a config file leaves out from its file
    name, so that two configs never write into one results folder, one data store or one MLflow
    experiment: ``my-leaf.yaml`` -> ``results: results-my-leaf``, ``data_dir: data-my-leaf``,
    ``experiment: my-leaf``. (Two configs that name one dataset with different ``prepare`` blocks
    would otherwise rebuild one store in turn, and the default config's DVC-tracked ``data/`` with
    it.) A file named ``config.yaml`` (the default config's name) keeps the schema's defaults,
    ``results``, ``data`` and ``mcfl``. Characters other than letters, digits, ``.``, ``_`` and
    ``-`` become ``_``."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(path).stem) or "config"
    if isinstance(cfg, dict) and stem != DEFAULT_CONFIG_STEM:
        cfg.setdefault("results", f"results-{stem}")
        cfg.setdefault("data_dir", f"data-{stem}")
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
    """The config files ``paths`` read and merged in order (:func:`merge`), not yet validated. A
    file that ``extends:`` another is read over that base (:func:`read_extended`); given after its
    base (``--configfile base.yaml overlay.yaml``) it is merged as a plain overlay."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError("no config file given")
    cfg: dict = {}
    given: set[Path] = set()
    for i, path in enumerate(paths):
        doc = _read_mapping(path)
        if i == 0 and "replace" in doc and "extends" not in doc:
            raise ConfigError(f"{path}: replace: belongs in an overlay (a config file given after the first, "
                              f"or one that extends another)")
        if i > 0 and "extends" in doc:
            base = doc.pop("extends")
            if not (isinstance(base, str) and (path.parent / base).resolve() in given):
                raise ConfigError(f"{path}: extends: {base}, which the config files before it do not "
                                  f"include; give this file alone (--configfile {path})")
        merge(cfg, read_extended(path, doc, chain_out=given), str(path))
    return cfg


#: the most files one ``extends:`` chain may read (a config, its base, the base's base, ...)
MAX_EXTENDS = 8


def read_extended(path: Path, doc: dict, chain: tuple[Path, ...] = (), chain_out: set | None = None) -> dict:
    """``doc`` (the config file ``path``) merged over the file its ``extends:`` names (a path
    relative to ``path``'s folder; that file read the same way, so a base may extend another), as an
    overlay file given after its base is (its ``replace:`` keys included); a missing base and a
    file that extends itself through others are refused with one line naming them. The files read
    are added to ``chain_out``."""
    chain = chain + (path.resolve(),)
    if chain_out is not None:
        chain_out.add(path.resolve())
    base_name = doc.pop("extends", None)
    if base_name is None:
        return doc
    if not (isinstance(base_name, str) and base_name.strip()):
        raise ConfigError(f"{path}: extends: must name a config file, relative to this file's folder")
    base_path = path.parent / base_name
    if base_path.resolve() in chain:
        cycle = " -> ".join(p.name for p in chain + (base_path.resolve(),))
        raise ConfigError(f"{path}: extends: {base_name} makes a cycle ({cycle})")
    if len(chain) > MAX_EXTENDS:
        raise ConfigError(f"{path}: extends: more than {MAX_EXTENDS} files in one chain")
    if not base_path.is_file():
        raise ConfigError(f"{path}: extends: {base_name}: no such config file ({base_path})")
    base = read_extended(base_path, _read_mapping(base_path), chain, chain_out)
    return merge(base, doc, str(path))


def _read_mapping(path: Path) -> dict:
    doc = read_yaml(path)
    if not isinstance(doc, dict):
        found = "an empty file" if doc is None else f"a {type(doc).__name__}"
        raise ConfigError(f"{path}: top level must be a mapping of keys (datasets:, methods:, ...), "
                          f"found {found}")
    return doc


_WORDS = {"true": True, "false": False, "null": None, "~": None}


def command_line_values(values: Any) -> Any:
    """Snakemake's ``--config KEY=VALUE`` values as a YAML file would give them: Snakemake reads
    ``True``/``False`` as booleans but leaves YAML's ``true``, ``false`` and ``null`` strings."""
    if isinstance(values, dict):
        return {k: command_line_values(v) for k, v in values.items()}
    if isinstance(values, list):
        return [command_line_values(v) for v in values]
    return _WORDS.get(values, values) if isinstance(values, str) else values
