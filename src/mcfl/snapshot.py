"""What FeSEM's Fig. 4 (Long et al. 2022, §6.2) draws of a finished clustered run: the local models
of a seeded sample of its clients, recomputed from its final state.

FeSEM keeps centres, not local models, so the run's final state (``state.pt``: centres and
assignments) is loaded and the algorithm's own ``round`` is called once more, for the sampled
clients only, at round R+1 (:func:`local_models`). Every local model that round computes (FeSEM:
local SGD from the client's centre with the distance term of Eq. 7) is recorded as the engine yields
it, restricted to the coordinates the E-step compares (``distance``), and the round's result is
thrown away. The local models are therefore exactly those the sampled clients would send in the next
round; the engine's per-(seed, round, client) randomness makes them independent of which other
clients are sampled. When the sampled models would take more than ``max_bytes``, a seeded random
subset of coordinates is kept. :func:`mcfl.report.figures.clusters_figure` draws the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mcfl import algorithms
from mcfl.data.store import FederatedData, load
from mcfl.federation import build_federation
from mcfl.io import load_tensors, state_on
from mcfl.streams import FIGURE_CLIENTS, derive_seed


@dataclass
class ClusterSnapshot:
    """A clustered run's sampled clients (``clients``, indices into ``data``) with their local models
    (``feats``, one row each), every client's final cluster (``assign``) and the centres in the same
    coordinates (``centres``: cluster -> vector; empty unless asked for)."""

    run: dict
    data: FederatedData
    assign: np.ndarray
    clients: np.ndarray
    feats: np.ndarray
    centres: dict[int, np.ndarray]


def local_models(algo, state, clients: np.ndarray, rnd: int, sel: slice) -> dict[int, np.ndarray]:
    """client -> the ``sel`` coordinates of the local model ``algo.round`` computes for it at ``rnd``."""
    trainer, seen = algo.fed.trainer, {}
    real_run = trainer.run

    def recording(tasks, r):
        for task, res in real_run(tasks, r):
            seen[task.client] = res.weights[sel].cpu().numpy()
            yield task, res

    trainer.run = recording
    try:
        algo.round(state, clients, rnd)
    finally:
        del trainer.run                                     # back to the class's method
    missing = sorted(set(int(c) for c in clients) - set(seen))
    if missing:
        raise ValueError(f"{algo.name}.round computed no local model for clients {missing[:5]}")
    return seen


def cluster_snapshot(run: dict, store: str | Path, state_path: str | Path, *, n_clients: int = 400,
                     centres: bool = True, seed: int = 0, device: str | torch.device = "cpu",
                     max_bytes: int = 1 << 30) -> ClusterSnapshot:
    """The local models of ``n_clients`` clients of ``run`` (drawn with ``seed``) at round R+1 from
    its final state ``state_path``, and (``centres``) its centres."""
    cls = algorithms.get(run["method"])
    if not cls.clustered:
        raise ValueError(f"{run['label']} does not cluster clients; Fig. 4 needs a clustered run")
    data = load(store)
    fed = build_federation(data, run["model"], run["train"], run["seed"], device)
    params = cls.Params(**run["params"])
    algo = cls(fed, params)
    saved = load_tensors(state_path, "a run's state.pt")
    if not isinstance(saved, dict) or not saved:
        raise ValueError(f"{state_path}: holds no state (written for an unclustered run)")
    try:
        state = algo.load_state(state_on(saved, fed.device))
    except (KeyError, TypeError, AttributeError, RuntimeError) as e:
        raise ValueError(f"{state_path}: not a state of {run['method']} ({type(e).__name__}: {e})") from None
    assign = np.asarray(algo.assignments(state))
    m = fed.n_clients
    rng = np.random.default_rng(derive_seed(seed, FIGURE_CLIENTS))
    clients = np.sort(rng.choice(m, size=min(int(n_clients), m), replace=False))
    sel = fed.model.select(getattr(params, "distance", "all"))
    models = local_models(algo, state, clients, int(run["train"]["rounds"]) + 1, sel)
    feats = np.stack([models[int(c)] for c in clients])
    found = {int(assign[np.asarray(mem)[0]]): w[sel].cpu().numpy() for w, mem in algo.eval_models(state)
             if len(mem)} if centres else {}
    width = feats.shape[1]
    keep = max(2, int(max_bytes // (4 * len(clients))))
    if width > keep:                                            # very large models: subsample coordinates
        cols = np.sort(rng.choice(width, size=keep, replace=False))
        feats, found = feats[:, cols], {k: v[cols] for k, v in found.items()}
    return ClusterSnapshot(run, data, assign, clients, feats, found)
