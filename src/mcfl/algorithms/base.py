"""The algorithm contract and the shared pieces of server arithmetic.

An algorithm is its server-side difference from the others (Flower's idea) over explicit state
(FedJAX's): it builds its initial ``State`` and maps ``(state, clients, round) -> (state, diagnostics)``.
The round loop, client sampling, evaluation, checkpointing and tracking are written once, in
:mod:`mcfl.runner`; local SGD is written once, in :mod:`mcfl.engine`.

A subclass declares

* ``name``: the name used in configs (``method: FedAvg``);
* ``Params``: a dataclass of its hyperparameters with defaults (validated against configs; the
  source of truth for defaults);
* ``State``: a dataclass of tensors/ints only, so a checkpoint of it loads with
  ``torch.load(weights_only=True)``;
* ``init()``, ``round()``, ``eval_models()`` and, for clustered methods, ``assignments()``.

The state contract (what makes a killed run resume bitwise; the conformance kit :mod:`mcfl.check`,
``mcfl check-method``, checks it for any method, built-in or not):

* Everything an algorithm keeps from one round to the next is in its ``State``: models, cluster
  assignments, server optimiser moments, counters. ``init()`` and ``round()`` assign no attribute
  on ``self``; ``__init__`` may derive constants from ``(fed, params)`` only. A resumed run builds a
  fresh instance, skips ``init()`` and calls ``load_state`` on the checkpointed dict.
* ``State`` fields are tensors, ints, floats or bools (no numpy arrays, no objects), so a checkpoint
  loads with ``torch.load(weights_only=True)``. ``round`` may update the state's tensors in place.
* No random state is kept: draw server randomness from ``self.fed.rng(rnd, purpose)`` and local
  randomness through the engine (seeded per (seed, round, client, purpose)), never from NumPy's or
  PyTorch's global generators (nor models whose forward pass uses them, such as dropout). Then a
  client's update does not depend on which other clients ran or in which order, and nothing needs
  saving.
* ``round`` folds the clients' results in the order of ``clients`` (sorted by the runner), so sums
  are taken in one order and runs repeat bitwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterable

import numpy as np
import torch

from mcfl.aggregate import WeightedSum, sq_distances, weighted_mean  # noqa: F401 (re-export)
from mcfl.cluster.init import initial_centres

if TYPE_CHECKING:                      # annotations only: no import of the layer above
    from mcfl.federation import Federation


@dataclass
class NoParams:
    pass


class Algorithm:
    name: ClassVar[str]
    Params: ClassVar[type] = NoParams
    State: ClassVar[type]
    #: True if the method takes K and clusters clients (its ``K`` becomes part of the run's name).
    clustered: ClassVar[bool] = False
    #: True if training needs the DAG's cluster-centre initialisation file (``fed.inputs["centres"]``).
    needs_centres: ClassVar[bool] = False

    def __init__(self, fed: Federation, params: Any):
        self.fed = fed
        self.p = params

    @classmethod
    def uses_centres(cls, params: dict) -> bool:
        """Whether a run with these parameters (a dict, as in the run's JSON) needs the DAG's
        centre file: ``needs_centres`` unless a method's parameters say otherwise."""
        return cls.needs_centres

    def init(self):
        raise NotImplementedError

    def round(self, state, clients: np.ndarray, rnd: int) -> tuple[Any, dict[str, float]]:
        raise NotImplementedError

    def eval_models(self, state) -> Iterable[tuple[torch.Tensor, np.ndarray]]:
        """Pairs (weights, client indices): which model each client is tested with."""
        raise NotImplementedError

    def assignments(self, state) -> np.ndarray | None:
        """Cluster id per client for clustered methods (for ARI/NMI and the artifacts)."""
        return None

    def client_columns(self, state) -> dict[str, np.ndarray]:
        """Further per-client columns for ``assignments.csv`` (default: none)."""
        return {}

    def predict(self, w: torch.Tensor, rows: torch.Tensor, state=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Predicted labels and per-sample losses of weights ``w`` on test ``rows`` (the engine's
        ``predict``; a method whose model needs per-sample side information from ``state``
        overrides this)."""
        return self.fed.trainer.predict(w, rows)

    def extra_metrics(self, state) -> dict[str, float]:
        """Further test metrics of an evaluation round, merged into the runner's (default: none)."""
        return {}

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self, state) -> dict[str, Any]:
        return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}

    def load_state(self, d: dict[str, Any]):
        return self.State(**d)


def param_span(flat, prefix: str) -> slice:
    """The one contiguous slice of a :class:`~mcfl.engine.FlatModel`'s vector holding the
    parameters whose names start with ``prefix`` (a sub-network of a wrapped model)."""
    parts = [sl for n, sl in flat.slices.items() if n.startswith(prefix)]
    start, stop = min(s.start for s in parts), max(s.stop for s in parts)
    if stop - start != sum(s.stop - s.start for s in parts):
        raise RuntimeError(f"parameters {prefix}* are not contiguous in the flat vector")
    return slice(start, stop)


def per_cluster(models: torch.Tensor, assign: torch.Tensor) -> Iterable[tuple[torch.Tensor, np.ndarray]]:
    """``eval_models`` of a clustered method: each non-empty cluster's model with its clients."""
    assign = assign.numpy()
    for k in range(len(models)):
        members = np.flatnonzero(assign == k)
        if len(members):
            yield models[k], members


@dataclass
class CentresState:
    centres: torch.Tensor   # (K, |W|) the clusters' models
    assign: torch.Tensor    # (m,) int64: each client's cluster


class CentredAlgorithm(Algorithm):
    """A clustered method whose state is K cluster models and each client's cluster (FeSEM, Robust,
    HypoCluster): initial centres from :func:`mcfl.cluster.init.initial_centres` (k-means on the
    clients' first local models, or the DAG's file), every client tested with its cluster's model."""

    State = CentresState
    clustered = True
    needs_centres = True

    def init(self) -> CentresState:
        c = initial_centres(self.fed, self.p)
        return self.State(c.centres, c.assign)

    def eval_models(self, state: CentresState):
        return per_cluster(state.centres, state.assign)

    def assignments(self, state: CentresState) -> np.ndarray:
        return state.assign.numpy().copy()
