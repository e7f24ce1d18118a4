"""Methods that each break one rule of the algorithm contract (:mod:`mcfl.algorithms.base`), for
the conformance kit's tests: each is FedAvg but for one flaw, and :data:`BROKEN` names the check of
:mod:`mcfl.check` that must catch it (and no other)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mcfl.algorithms.fedavg import FedAvg


@dataclass
class UntypedParams:
    scale: Any = 1.0            # no type: config validation cannot refuse a wrong value


class Untyped(FedAvg):
    """Its hyperparameter accepts any value."""
    name = "Untyped"
    Params = UntypedParams


@dataclass
class NumpyState:
    w: torch.Tensor
    seen: np.ndarray            # not a tensor: a checkpoint no longer loads with weights_only=True


class NumpyInState(FedAvg):
    """Keeps a NumPy array in its state."""
    name = "NumpyInState"
    State = NumpyState

    def init(self):
        return NumpyState(self.fed.w0.clone(), np.zeros(self.fed.n_clients))

    def round(self, state, clients, rnd):
        s, diag = super().round(state, clients, rnd)
        seen = state.seen.copy()
        seen[clients] += 1
        return NumpyState(s.w, seen), diag


class RoundOnSelf(FedAvg):
    """Remembers the last round on the instance."""
    name = "RoundOnSelf"

    def round(self, state, clients, rnd):
        self.last_round = rnd
        return super().round(state, clients, rnd)


class CountsOnSelf(FedAvg):
    """Counts its rounds in a list made in ``__init__`` (outside the state): a resumed run starts
    counting again."""
    name = "CountsOnSelf"

    def __init__(self, fed, params):
        super().__init__(fed, params)
        self.rounds_run = [0]

    def server_step(self, w, mean):
        self.rounds_run[0] += 1
        return w + (mean - w) * (1 + 0.1 * self.rounds_run[0])


class FirstClientWins(FedAvg):
    """Takes the first client's model handed over as the new global model."""
    name = "FirstClientWins"

    def round(self, state, clients, rnd):
        (_, res), *rest = list(self.fed.trainer.run(self.local_tasks(clients, state.w), rnd))
        return type(state)(res.weights.clone()), {"train_loss": float(res.loss)}


class GlobalDraw(FedAvg):
    """Draws from NumPy's global generator (and ignores the draw)."""
    name = "GlobalDraw"

    def server_step(self, w, mean):
        np.random.random()
        return mean


class ExecutorDependent(FedAvg):
    """Steps further when its trainer is the batched executor's."""
    name = "ExecutorDependent"

    def server_step(self, w, mean):
        return mean + 1e-3 if type(self.fed.trainer).__name__ == "BatchedTrainer" else mean


class LeavesOneOut(FedAvg):
    """Tests every client but the last."""
    name = "LeavesOneOut"

    def eval_models(self, state):
        yield state.w, np.arange(self.fed.n_clients - 1)


@dataclass
class KParams:
    K: int = 2


class ShortAssignments(FedAvg):
    """A clustered method whose assignments miss the last client."""
    name = "ShortAssignments"
    Params = KParams
    clustered = True

    def assignments(self, state):
        return np.zeros(self.fed.n_clients - 1, dtype=np.int64)


#: broken method -> the one check that must fail on it
BROKEN = {Untyped: "params", NumpyInState: "state", RoundOnSelf: "state", CountsOnSelf: "resume", FirstClientWins: "order",
          GlobalDraw: "global-rng", ExecutorDependent: "executors", LeavesOneOut: "eval-models",
          ShortAssignments: "assignments"}
