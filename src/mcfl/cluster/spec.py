"""What a clustered run's initial centres depend on, the file they are shared in, and the
settings of a ``K: auto`` run's search for K (:mod:`mcfl.select_k`).

Light (no torch): the workflow reads it while planning. :mod:`mcfl.cluster.init` computes the
centres with the options :func:`centre_options` names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcfl.io import config_hash
from mcfl.trainspec import TrainSpec

#: the bytes within which the centre initialisation keeps the clients' first local models (beyond,
#: it trains them again: :func:`mcfl.cluster.init.init_centres`' ``keep_bytes``)
KEEP_BYTES = 256 << 20


def centre_options(params) -> dict:
    """The k-means initialisation options of a clustered method's parameters (an object or a dict):
    FeSEM's ``restarts``, ``distance``, ``mstep`` and ``init``, ``init_projection`` where a method
    has them (defaults 20, all, mean, kmeans, automatic)."""
    get = params.get if isinstance(params, dict) else (lambda k, d: getattr(params, k, d))
    return {"restarts": get("restarts", 20), "distance": get("distance", "all"),
            "weighted": get("mstep", "mean") == "weighted", "method": get("init", "kmeans"),
            "projection": get("init_projection", None)}


def first_models_spec(run: dict) -> dict:
    """Everything the clients' first local models depend on: dataset, seed, model and the settings
    of the local update that makes them (not K, nor how they are clustered)."""
    return {"dataset": run["dataset"], "seed": run["seed"], "model": run["model"],
            "train": {k: v for k, v in run["train"].items() if k in TrainSpec.LOCAL_KEYS}}


def first_models_key(run: dict) -> str:
    """The name of the file a run's first local models are shared in: ``first-<hash of its
    first_models_spec>``; centre files with equal keys cluster the same models."""
    return f"first-{config_hash(first_models_spec(run))[:8]}"


def centre_spec(run: dict) -> dict:
    """Everything a clustered run's initial centres depend on: dataset, seed, model, the local update
    that makes the clients' first models, K and the k-means options; nothing of the method itself.
    Runs with equal specs (in the default config FeSEM(3), FeSEM-MA(3), Robust(3), HypoCluster(3))
    share one ``init_centres`` job and file."""
    return {**first_models_spec(run), "K": run["params"]["K"], **centre_options(run["params"])}


def centre_key(run: dict) -> str:
    """The name of a run's initial-centres file: ``K<K>-<hash of its centre_spec>``, shared by runs
    with equal specs; a ``K: auto`` run (K known only after select-k) gets its own, by run id."""
    if run.get("select_k"):
        return run["run_id"]
    spec = centre_spec(run)
    return f"K{spec['K']}-{config_hash(spec)[:8]}"


@dataclass
class SelectK:
    K: list[int] = field(default_factory=lambda: [2, 3, 4, 5])
    clients: int = 100
    rounds: int = 3
    criterion: str = "accuracy"      # accuracy | distance

    def __post_init__(self):
        if self.criterion not in ("accuracy", "distance"):
            raise ValueError(f"criterion must be 'accuracy' or 'distance', got {self.criterion!r}")
        if not self.K or any(not isinstance(k, int) or k < 1 for k in self.K):
            raise ValueError(f"K must be a non-empty list of positive integers, got {self.K!r}")


def select_k_settings(entry: dict) -> SelectK:
    """The ``select_k`` block of a ``K: auto`` method entry, with its defaults."""
    return SelectK(**entry.get("select_k", {}))
