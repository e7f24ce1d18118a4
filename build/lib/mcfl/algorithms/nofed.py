"""NoFed / NonFed (FeSEM §6.1 baseline 1): every client trains alone, nothing is shared.

A client's model starts from the common initial weights and continues from its own previous local
model each time it is sampled; it is tested with its own model. The state holds one model per client
(memory grows with the number of clients; that is the method): at FEMNIST scale with the paper's
6.6M-parameter CNN that is 3,550 x 26 MB = 94 GB, so :meth:`NoFed.init` checks the need against
the device's available memory and stops with a clear message instead of swapping or being killed
(the FeSEM authors' CNN, ``hidden: 248``, needs 12 GB).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.algorithms.base import Algorithm
from mcfl.engine import Task


def available_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on ``device`` (CUDA: free memory; CPU: Linux MemAvailable),
    or None where unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class State:
    trained: torch.Tensor   # (m,) bool: has client i a local model yet?
    local: torch.Tensor     # (m, |W|) local models; rows of untrained clients are unused


class NoFed(Algorithm):
    name = "NoFed"
    State = State

    def init(self) -> State:
        m, w0 = self.fed.n_clients, self.fed.w0
        need, free = m * w0.numel() * w0.element_size(), available_memory(w0.device)
        if free is not None and need > free:
            raise MemoryError(f"NoFed keeps one model per client: {m} x {w0.numel():,} parameters = "
                              f"{need / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB available "
                              f"on {w0.device}; use a smaller model (e.g. femnist_cnn with hidden: 248, "
                              f"the FeSEM authors' size) or a machine with more memory")
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
