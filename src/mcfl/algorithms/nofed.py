"""NoFed / NonFed (FeSEM §6.1 baseline 1): every client trains alone, nothing is shared.

A client's model starts from the common initial weights and continues from its own previous local
model each time it is sampled; it is tested with its own model. The state holds one model per client
that has trained so far (memory grows with the number of clients; that is the method).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.algorithms.base import Algorithm
from mcfl.engine import Task


@dataclass
class State:
    trained: torch.Tensor   # (m,) bool: has client i a local model yet?
    local: torch.Tensor     # (m, |W|) local models; rows of untrained clients are unused


class NoFed(Algorithm):
    name = "NoFed"
    State = State

    def init(self) -> State:
        m, w0 = self.fed.n_clients, self.fed.w0
        return State(torch.zeros(m, dtype=torch.bool), w0.expand(m, -1).clone())

    def round(self, state: State, clients: np.ndarray, rnd: int):
        local, trained = state.local, state.trained      # updated in place: m models are big
        losses = []
        for task, res in self.fed.trainer.run((Task(int(c), state.local[int(c)]) for c in clients), rnd):
            local[task.client] = res.weights
            trained[task.client] = True
            losses.append(res.loss)
        return State(trained, local), {"train_loss": float(np.mean(losses))}

    def eval_models(self, state: State):
        for i in range(self.fed.n_clients):
            yield state.local[i], np.array([i])
