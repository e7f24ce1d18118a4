"""Initial cluster centres for FeSEM-style methods (FeSEM §6.1, "Training settings").

"For the initialization of the cluster centers in FeSEM, we conducted pure clustering 20 times with
randomized initialization, and then the 'best' initialization, which has the minimal intra-cluster
distance, was selected as the initial centers." Implemented as: every client trains once from the
common initial weights (its *first local model*, local round 0); scikit-learn's ``KMeans`` with
``n_init=restarts`` (k-means++ seeding, a different random start per restart; the run with the
lowest inertia, i.e. the smallest intra-cluster squared distance, is kept) clusters those models on
the coordinates the E-step uses (all parameters, or the last layer); each centre is the mean of its
members' full first local models (plain, or sample-weighted like the M-step). The centres are
therefore distinct whenever the first local models are.

``method="random"`` is the authors' code instead: a random partition of the clients (reference notes
§1.3), with centres again the means of each part's first local models.

Memory: the features of all m clients are held (m x d). The full models are kept too when they fit
in ``keep_bytes``; otherwise the first local models are recomputed (bitwise identical: per-client
seeded) in a second pass that accumulates per-cluster sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.engine import Task, derive_seed
from mcfl.federation import Federation

INIT_ROUND = 0
KMEANS = 1_000_004


@dataclass
class Centres:
    centres: torch.Tensor   # (K, |W|)
    assign: torch.Tensor    # (m,) int64
    inertia: float          # sum of squared distances of the features to their centre


def first_local_models(fed: Federation):
    tasks = (Task(c, fed.w0) for c in range(fed.n_clients))
    for task, res in fed.trainer.run(tasks, INIT_ROUND):
        yield task.client, res


def init_centres(fed: Federation, K: int, *, restarts: int = 20, distance: str = "all",
                 weighted: bool = False, method: str = "kmeans",
                 keep_bytes: int = 1 << 30) -> Centres:
    from sklearn.cluster import KMeans

    m, size = fed.n_clients, fed.model.size
    if not 1 <= K <= m:
        raise ValueError(f"K={K} must be between 1 and the number of clients ({m})")
    sel = fed.model.select(distance)
    keep = m * size * 4 <= keep_bytes
    feats = np.empty((m, sel.stop - sel.start), dtype=np.float32)
    full = torch.empty(m, size, device=fed.device) if keep else None
    for c, res in first_local_models(fed):
        feats[c] = res.weights[sel].cpu().numpy()
        if keep:
            full[c] = res.weights
    if method == "kmeans":
        distinct = len(np.unique(feats, axis=0))
        if distinct < K:
            raise ValueError(f"K={K} but only {distinct} distinct first local models")
        km = KMeans(n_clusters=K, n_init=restarts, random_state=derive_seed(fed.seed, KMEANS) % 2**31)
        labels = km.fit_predict(feats.astype(np.float64))
    elif method == "random":
        rng = np.random.default_rng(derive_seed(fed.seed, KMEANS))
        labels = rng.permutation(np.arange(m) % K)
    else:
        raise ValueError(f"unknown centre initialisation {method!r}; use 'kmeans' or 'random'")
    acc = WeightedSum(K, size, fed.device)
    models = ((c, full[c]) for c in range(m)) if keep else \
        ((c, res.weights) for c, res in first_local_models(fed))
    for c, w in models:
        acc.add(int(labels[c]), w, float(fed.n_train[c]) if weighted else 1.0)
    centres = torch.stack([acc.mean(k) for k in range(K)])
    f = torch.from_numpy(feats).to(fed.device)
    inertia = float(((f - centres[torch.from_numpy(labels).to(fed.device)][:, sel]) ** 2).sum())
    return Centres(centres, torch.from_numpy(labels.astype(np.int64)), inertia)


def save_centres(c: Centres, path) -> None:
    from mcfl.io import atomic_path

    with atomic_path(path) as tmp:
        torch.save({"centres": c.centres.cpu(), "assign": c.assign.cpu(), "inertia": c.inertia}, tmp)


def load_centres(path, K: int, fed: Federation) -> Centres:
    d = torch.load(path, map_location=fed.device, weights_only=True)
    centres, assign = d["centres"], d["assign"]
    if centres.shape != (K, fed.model.size) or assign.shape != (fed.n_clients,):
        raise ValueError(f"{path}: centres {tuple(centres.shape)} / assignments {tuple(assign.shape)} "
                         f"do not fit K={K}, |W|={fed.model.size}, m={fed.n_clients}; "
                         f"rerun the init_centres rule")
    return Centres(centres.float(), assign.long().cpu(), float(d["inertia"]))


def initial_centres(fed: Federation, params) -> Centres:
    """The initial centres a clustered method's ``params`` ask for: the DAG's file when the run has
    one (``fed.inputs["centres"]``), else computed here. Reads FeSEM's fields ``restarts``,
    ``distance``, ``mstep`` and ``init`` where a method has them (defaults 20, all, mean, kmeans)."""
    if "centres" in fed.inputs:
        return load_centres(fed.inputs["centres"], params.K, fed)
    return init_centres(fed, params.K, **centre_options(params))


def centre_options(params) -> dict:
    return {"restarts": getattr(params, "restarts", 20), "distance": getattr(params, "distance", "all"),
            "weighted": getattr(params, "mstep", "mean") == "weighted",
            "method": getattr(params, "init", "kmeans")}
