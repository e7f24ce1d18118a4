"""Replication on other draws of a dataset's clients: the config's ``replication:`` section.

A *draw* is another sample of the same population of clients (writers): the other embedded LEAF run,
a LEAF output folder (``leaf_json``), a new LEAF sample drawn with another sampling ``seed``, or
another partition seed of a synthetic or embedded source. Each draw is a dataset the package
already reads, so the section expands into datasets of the config (:func:`add_draws`, called by
the config's validation): the redrawn dataset's copy ``<dataset>-<draw>`` with the draw's
``prepare``/``partition`` keys over the original's, its own store, and the same model, training,
protocol and seeds. The configured dataset itself is the first draw (named by ``original``). The
existing training rules then train every draw; ``workflow/rules/replication.smk`` adds the report
(:mod:`mcfl.replication_report`).

Every run of a redrawn dataset carries its draw's name (``draw``): an MLflow parameter and tag,
a line of its ``metrics.json`` and a column of ``table.csv``. The original dataset's runs carry
none: they are exactly the runs of the config without the section (the same run specs, folders and
MLflow runs), so a study replicated later reuses the runs it already has; the replication report and
``table.csv`` name their draw by the section's ``original`` (:meth:`ReplicationPlan.original_flag`).
"""

from __future__ import annotations

import copy
from typing import Any, Callable


class ReplicationError(ValueError):
    """A mistake in the ``replication`` section, one line naming its key (the config's validation
    reports it as a ConfigError)."""


#: the protocol of the plain test (every client on its own model): scored per test image
STANDARD = "standard"


#: the section's defaults (not in the schema: a default there would add the section to every config)
DEFAULTS = {"original": "original", "reference": "FedAvg", "protocols": [STANDARD], "out": "replication"}


def add_draws(cfg: dict, expand_runs: Callable[[dict], list[dict]]) -> bool:
    """Expand ``cfg["replication"]`` (schema-checked) into datasets of ``cfg``, in place
    (``expand_runs``: :func:`mcfl.config.expand_runs`, which names each method entry's runs); whether
    it added any (the caller then validates the config again, the draws' datasets included).
    Idempotent: a config expanded once (validated again after ``--config`` overrides) is left as it
    is. Raises ReplicationError naming the key."""
    rep = cfg.get("replication")
    if rep is None:
        return False
    for key, value in DEFAULTS.items():
        rep.setdefault(key, copy.deepcopy(value))
    base = rep["dataset"] = _base_dataset(cfg, rep)
    names = {draw: draw_dataset(base, draw) for draw in rep["draws"]}
    if all(cfg["datasets"].get(n, {}).get("draw") == d for d, n in names.items()):
        return False                            # expanded already
    original = cfg["datasets"][base]
    for draw, name in names.items():
        if name in cfg["datasets"]:
            raise ReplicationError(f"replication.draws.{draw}: its dataset name {name!r} is already a "
                                   f"dataset of the config; rename the draw")
        cfg["datasets"][name] = _redrawn(original, rep["draws"][draw], draw)
    _check_protocols(original, rep)
    _extend_methods(cfg, base, list(names.values()), rep, expand_runs)
    return True


def draw_dataset(base: str, draw: str) -> str:
    """The dataset name of ``draw`` of dataset ``base``."""
    return f"{base}-{draw}"


def _base_dataset(cfg: dict, rep: dict) -> str:
    if rep["original"] in rep["draws"]:
        raise ReplicationError(f"replication.original: {rep['original']!r} is also the name of a draw; rename one")
    base = rep.get("dataset")
    if base is None:
        if len(cfg["datasets"]) != 1:
            raise ReplicationError(f"replication.dataset: the config has {len(cfg['datasets'])} datasets "
                                   f"({', '.join(cfg['datasets'])}); name the one the draws redraw")
        return next(iter(cfg["datasets"]))
    if base not in cfg["datasets"]:
        raise ReplicationError(f"replication.dataset: unknown dataset {base!r}; known: {', '.join(cfg['datasets'])}")
    return base


def _redrawn(original: dict, draw: dict, name: str) -> dict:
    """The original dataset with the draw's ``prepare`` keys (all of them when it names another
    ``source``) and ``partition`` keys over its own."""
    ds = copy.deepcopy(original)
    prep = draw.get("prepare", {})
    if prep.get("source", ds["prepare"]["source"]) != ds["prepare"]["source"]:
        ds["prepare"] = dict(prep)
    else:
        ds["prepare"].update(prep)
    if "partition" in draw:
        ds["partition"] = {**(ds.get("partition") or {}), **draw["partition"]}
    if ds["prepare"] == original["prepare"] and ds.get("partition") == original.get("partition"):
        raise ReplicationError(f"replication.draws.{name}: the same prepare and partition as the original "
                               f"dataset, so the same clients; change a seed, a run or a source")
    ds["draw"] = name
    return ds


def _check_protocols(ds: dict, rep: dict) -> None:
    named = ds.get("train", {}).get("eval_protocols") or {}
    for p in rep["protocols"]:
        if p != STANDARD and p not in named:
            raise ReplicationError(f"replication.protocols: {p!r} is not a protocol of the dataset (known: "
                                   f"{', '.join([STANDARD, *named])})")


def _labels(cfg: dict, base: str, entry: dict, expand_runs) -> list[str]:
    """The run labels a method entry makes on dataset ``base`` (one per K)."""
    one = {k: v for k, v in entry.items() if k not in ("datasets", "seeds")}
    return [r["label"] for r in expand_runs({**cfg, "datasets": {base: cfg["datasets"][base]},
                                             "methods": [one], "seeds": [0]})]


def _extend_methods(cfg: dict, base: str, draws: list[str], rep: dict, expand_runs) -> None:
    """Each method entry that runs on ``base`` and makes a chosen label also runs on the draws
    (an entry with several K split: the chosen ones on the draws); the others keep to the
    original datasets (an explicit ``datasets`` list)."""
    originals = [d for d in cfg["datasets"] if d not in draws]
    chosen = rep.get("methods")
    found: set[str] = set()
    extra = []
    for entry in cfg["methods"]:
        on = list(entry.get("datasets", originals))
        entry["datasets"] = on
        if base not in on:
            continue
        labels = _labels(cfg, base, entry, expand_runs)
        pick = [lab for lab in labels if chosen is None or lab in chosen or lab == rep["reference"]]
        found.update(pick)
        if len(pick) == len(labels):
            entry["datasets"] = on + draws
        elif pick:
            Ks = [k for k, lab in zip(entry["K"], labels) if lab in pick]
            extra.append({**copy.deepcopy(entry), "K": Ks, "datasets": list(draws)})
    cfg["methods"].extend(extra)
    missing = [lab for lab in [rep["reference"], *(chosen or [])] if lab not in found]
    if missing:
        raise ReplicationError(f"replication: no method entry on {base!r} makes the label {missing[0]!r} "
                               f"(reference or methods)")


# -- what the DAG asks (workflow/rules/replication.smk) ---------------------------------------------
class ReplicationPlan:
    """The replication report's job of a validated, expanded config (``plan``: its
    :class:`mcfl.plan.Plan`); false when the config has no ``replication`` section."""

    def __init__(self, plan):
        self.plan = plan
        self.section: dict[str, Any] | None = plan.config.get("replication")

    def __bool__(self) -> bool:
        return self.section is not None

    def datasets(self) -> list[str]:
        """The draws' datasets, the original first."""
        if not self:
            return []
        base = self.section["dataset"]                    # named by add_draws
        return [base, *(draw_dataset(base, d) for d in self.section["draws"])]

    def runs(self) -> list[dict]:
        """The configured runs on the draws of the chosen labels and the reference."""
        chosen = self.section.get("methods")
        keep = None if chosen is None else {*chosen, self.section["reference"]}
        return [r for r in self.plan.configured.values()
                if r["dataset"] in self.datasets() and (keep is None or r["label"] in keep)]

    def run_outputs(self, name: str) -> list[str]:
        return self.plan.run_outputs(name, self.runs())

    def original_flag(self) -> list[str]:
        """The report's arguments naming the original dataset's draw (its runs name none), one word
        each for the rule's quoting: none without the section."""
        return ["--original-draw", f"{self.section['dataset']}={self.section['original']}"] if self else []

    def out(self) -> str:
        """Output path without suffix (``<out>.md``, ``.csv``, ``.png``) inside the results."""
        return self.plan.page(self.section["out"])

    def targets(self) -> list[str]:
        return [self.out() + s for s in (".md", ".csv", ".png")] if self else []

    def draw_order(self) -> list[str]:
        return [self.section["original"], *self.section["draws"]]

    # -- the check before any training (rule replication_check) -----------------------------------
    def check_file(self) -> str:
        return self.plan.res("replication/draws-checked.json")

    def stores(self) -> list[str]:
        """``DRAW=STORE`` of every draw, the original first."""
        return [f"{d}={self.plan.store(ds)}" for d, ds in zip(self.draw_order(), self.datasets())]

    def store_files(self) -> list[str]:
        return [self.plan.store(ds) for ds in self.datasets()]

    def sampled(self) -> int:
        """The most clients a round of the draws' runs samples (0: every round trains all)."""
        return max((r["train"].get("clients_per_round") or 0 for r in self.runs()), default=0)

    def gate(self) -> dict[str, tuple[str, list[str]]]:
        """The extra input of the redrawn datasets' training jobs: the check's file (none without
        the section). The original dataset's jobs are those of the config without the section, so
        their inputs stay the same: runs it already has are not trained again."""
        return {"replication_check": (self.check_file(), self.datasets()[1:])} if self else {}


def cost_line(cfg: dict, runs: list, duration: Callable[[float], str], finished: set = frozenset()) -> str:
    """What `mcfl check-config` says of a replication's cost: the runs on the draws beyond the
    original and their estimated training, and the original draw's runs, which are the config's
    runs without the section (``runs``: the estimate's per-run costs, with ``dataset``, ``label``,
    ``seed`` and ``total_s``; ``duration``: how to write seconds; ``finished``: the (dataset, label,
    seed) of the runs with a ``metrics.json`` in the results folder, restored or trained); "" without
    the section."""
    rep = cfg.get("replication")
    if rep is None:
        return ""
    others = [draw_dataset(rep["dataset"], d) for d in rep["draws"]]
    mine = [r for r in runs if r.dataset in others]
    shared = [r for r in runs if r.dataset == rep["dataset"]]
    todo = [r for r in shared if (r.dataset, r.label, r.seed) not in finished]
    total = sum(r.total_s for r in runs)
    return (f"replication: {len(others)} draw{'s' if len(others) > 1 else ''} beside {rep['original']!r} "
            f"({', '.join(rep['draws'])}): {len(mine)} more training runs, "
            f"{duration(sum(r.total_s for r in mine))} of the {duration(total)} above; the {len(shared)} runs on "
            f"{rep['original']!r} are those of the config without the section ({cfg['results']}/runs/"
            f"{rep['dataset']}/): {len(shared) - len(todo)} finished there, {len(todo)} to train "
            f"({duration(sum(r.total_s for r in todo))})")
