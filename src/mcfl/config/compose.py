"""What a config composes before it is validated: its ``vars:`` (``${name}`` in any value, e.g.
one precision overlay for bf16 and tf32) and the named method sets its ``methods:`` list uses
(``- {set: fesem-table2}``: a paper's table of methods written once). A file's ``extends:`` is read
with the file (:func:`mcfl.config.files.read_configs`). Hydra and OmegaConf compose configs the
same way: a config that extends another, names its settings once and interpolates ``${...}``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from mcfl.config.files import ConfigError, _path, merge

#: a paper's table of methods, each row as a ``methods:`` entry; a config uses one with
#: ``- {set: NAME}``, optionally ``with: {ROW: {key: value}}`` merged into the rows named
METHOD_SETS: dict[str, list[dict]] = {
    # Long et al., "Multi-Center Federated Learning: Clients Clustering for Better Personalization",
    # World Wide Web 2022: Table 2 (FEMNIST) and Table 3 (FedCelebA), rows in the tables' order
    # (labels match the paper tables' CSV). FedProx's mu 0.1 is §6.1's "scaler of proximal term";
    # FeSEM's 20 restarts pick the best k-means start of the initial centres.
    "fesem-table2": [
        {"method": "NoFed"},
        {"method": "FedSGD"},
        {"method": "FedAvg"},
        {"method": "FedDist"},
        {"method": "FedDWS", "name": "FedDist+WS"},
        {"method": "Robust", "K": 3, "label": "Robust(TKM)"},
        {"method": "FedCluster"},
        {"method": "HypoCluster", "K": 3},
        {"method": "FedDANE", "name": "FedDane"},
        {"method": "FedProx", "mu": 0.1},
        {"method": "FeSEM", "K": [2, 3, 4], "restarts": 20},
        {"method": "FeSEM-MA", "K": 3, "restarts": 20},
    ],
}

_VAR = re.compile(r"\$\{([^{}]*)\}")


def compose(cfg: dict) -> dict:
    """``cfg`` with its ``vars:`` substituted (and removed) and its method sets expanded, in place.
    An ``extends:`` left in it was never read (its base would be silently missing): refused."""
    if isinstance(cfg, dict) and "extends" in cfg:
        raise ConfigError(f"extends: {cfg['extends']}: a file's base is read with the file "
                          f"(mcfl.config.load_config or read_configs), not after it")
    if isinstance(cfg, dict):
        substitute_vars(cfg)
        expand_method_sets(cfg)
    return cfg


def substitute_vars(cfg: dict) -> None:
    """Replace ``${name}`` in every string value by ``vars: {name: value}``: a value that is the
    reference alone takes the variable's type (``lr: ${lr}`` is a number), one inside a longer string
    its text (``results: results-${precision}``). ``vars:`` itself is then removed."""
    values = cfg.pop("vars", {})
    if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in values.items()):
        raise ConfigError("vars: must map names to single values (e.g. vars: {precision: bf16})")

    def sub(node: Any, where: list) -> Any:
        if isinstance(node, dict):
            return {k: sub(v, where + [k]) for k, v in node.items()}
        if isinstance(node, list):
            return [sub(v, where + [i]) for i, v in enumerate(node)]
        if not isinstance(node, str) or "${" not in node:
            return node
        for name in _VAR.findall(node):
            if name not in values:
                known = ", ".join(values) or "none"
                raise ConfigError(f"{_path(where)}: ${{{name}}} names no key of vars: (given: {known})")
        whole = _VAR.fullmatch(node)
        return values[whole.group(1)] if whole else _VAR.sub(lambda m: str(values[m.group(1)]), node)

    cfg.update(sub(cfg, []))


def expand_method_sets(cfg: dict) -> None:
    """Replace each ``methods:`` entry ``{set: NAME, with: {ROW: {...}}}`` by the rows of
    :data:`METHOD_SETS` ``[NAME]`` (copies), each row named in ``with`` (by its ``name``, else its
    ``method``) with those keys merged over it as an overlay's are."""
    methods = cfg.get("methods")
    if not isinstance(methods, list):
        return
    out: list = []
    for i, entry in enumerate(methods):
        if isinstance(entry, dict) and "set" in entry:
            out += _set_rows(entry, f"methods[{i}]")
        else:
            out.append(entry)
    cfg["methods"] = out


def _set_rows(entry: dict, where: str) -> list[dict]:
    name, changes = entry.get("set"), entry.get("with", {})
    if set(entry) - {"set", "with"}:
        raise ConfigError(f"{where}: a method set entry takes set: and with: only, "
                          f"not {', '.join(sorted(set(entry) - {'set', 'with'}))}")
    if name not in METHOD_SETS:
        raise ConfigError(f"{where}.set: {name!r} is not a method set; known: {', '.join(METHOD_SETS)}")
    rows = copy.deepcopy(METHOD_SETS[name])
    by_name = {row.get("name", row["method"]): row for row in rows}
    if not isinstance(changes, dict):
        raise ConfigError(f"{where}.with: must map row names to the keys to change, e.g. "
                          f"{{FeSEM: {{restarts: 5}}}}")
    for row_name, keys in changes.items():
        if row_name not in by_name:
            raise ConfigError(f"{where}.with: {row_name!r} is not a row of {name}; rows: {', '.join(by_name)}")
        if not isinstance(keys, dict):
            raise ConfigError(f"{where}.with.{row_name}: must be a mapping of method keys")
        merge(by_name[row_name], keys, f"{where}.with.{row_name}")
    return rows

