"""FedDist and FedDWS (FeSEM §6.1 baselines 9 and 10): Reptile's meta-update used as the FL server
step (Nichol, Achiam, Schulman, "On First-Order Meta-Learning Algorithms" (Reptile),
arXiv:1803.02999, Algorithm 2, batched version).

Clients train from the global model w as in FedAvg; the server then moves w a fraction epsilon of
the way towards the average of the local models instead of replacing it:

    FedDist:  w <- w + epsilon · ( (1/m) sum_i W_i - w )               (plain mean)
    FedDWS:   w <- w + epsilon · ( sum_i n_i W_i / sum_i n_i - w )     (mean weighted by data size)

epsilon = 0.6 is the FeSEM authors' code (``server.update_model_dist``, which their experiments
never called; docs/methods/original-code.md). epsilon = 1 makes FedDWS exactly FedAvg. FeSEM's Table 2 calls
FedDWS "FedDist+WS".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mcfl.algorithms.fedavg import FedAvg


@dataclass
class Params:
    epsilon: float = 0.6

    def __post_init__(self):
        if not 0 < self.epsilon <= 1:
            raise ValueError(f"epsilon must be in (0, 1], got {self.epsilon}")


class FedDist(FedAvg):
    name = "FedDist"
    Params = Params

    def weight(self, res) -> float:
        return 1.0

    def server_step(self, w: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return w + self.p.epsilon * (mean - w)


class FedDWS(FedDist):
    name = "FedDWS"

    def weight(self, res) -> float:
        return res.n_samples
