"""The config's ``fedgsp`` block: its checks, and the sweep runs it adds (FedGSP paper §4.2, Figs. 4-5).

Sweeps vary the first ``FedGSP`` method entry that runs on ``fedgsp.dataset`` (or FedGSP's defaults
if there is none): ``heatmap`` one run per growth function and (alpha, beta) of its grid, ``kappa``
one per kappa, for each
of ``sweep_seeds`` (default: ``seeds``), with ``sweep_train`` overriding the entry's train settings.
A sweep point identical to a run the config already makes (same method, params, model, train, seed)
reuses that run instead of training it twice.
"""

from __future__ import annotations

import copy
from typing import Any

from mcfl.config import ConfigError, expand_runs
from mcfl.io import canonical_json


def check_fedgsp(cfg: dict, source: str = "config") -> None:
    g = cfg["fedgsp"]
    if g["dataset"] not in cfg["datasets"]:
        raise ConfigError(f"{source}: fedgsp.dataset: unknown dataset {g['dataset']!r}; known: "
                          f"{', '.join(cfg['datasets'])}")
    sweep_runs(cfg)            # builds (hence validates) every sweep entry


def base_entry(cfg: dict) -> dict:
    ds = cfg["fedgsp"]["dataset"]
    for e in cfg["methods"]:
        if e["method"] == "FedGSP" and ds in e.get("datasets", [ds]):
            return copy.deepcopy(e)
    return {"method": "FedGSP"}


def _identity(run: dict) -> tuple:
    return tuple(canonical_json(run[k]) for k in ("dataset", "method", "params", "model", "train", "seed"))


def sweep_runs(cfg: dict) -> dict[str, list[tuple[dict, dict[str, Any]]]]:
    """{"heatmap": [(run, {"growth", "alpha", "beta"})...], "kappa": [(run, {"kappa"})...]}: the
    sweep runs, each either an existing run of the config or a new one (new run ids ``FedGSP-...``)."""
    g = cfg["fedgsp"]
    ds = g["dataset"]
    base = base_entry(cfg)
    base.pop("datasets", None)
    train = {**base.get("train", {}), **g.get("sweep_train", {})}
    points: dict[str, list[tuple[dict, dict]]] = {"heatmap": [], "kappa": []}
    for gr, grid in g.get("heatmap", {}).items():
        for a in grid["alpha"]:
            for b in grid["beta"]:
                e = {**base, "growth": gr, "alpha": float(a), "beta": int(b), "train": train,
                     "name": f"FedGSP-{gr}-a{a:g}-b{b}"}
                points["heatmap"].append((e, {"growth": gr, "alpha": float(a), "beta": int(b)}))
    for k in g.get("kappa", []):
        e = {**base, "kappa": float(k), "train": train, "name": f"FedGSP-kappa{k:g}"}
        points["kappa"].append((e, {"kappa": float(k)}))
    existing = {_identity(r): r for r in expand_runs(cfg)}
    seeds = g.get("sweep_seeds", cfg["seeds"])
    out: dict[str, list[tuple[dict, dict]]] = {"heatmap": [], "kappa": []}
    for kind, entries in points.items():
        for e, key in entries:
            sub = {**cfg, "datasets": {ds: cfg["datasets"][ds]}, "methods": [e], "seeds": seeds}
            try:
                runs = expand_runs(sub)
            except ConfigError as err:
                raise ConfigError(f"fedgsp.{kind}: {err}") from None
            for r in runs:
                out[kind].append((existing.get(_identity(r), r), key))
    return out
