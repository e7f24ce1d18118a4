"""IDA, inverse distance aggregation (Yeganeh, Farshad, Navab & Albarqouni, "Inverse Distance
Aggregation for Federated Learning with Non-IID Data", DART/DCL @ MICCAI 2020, arXiv:2008.07665),
one of FedGSP's baselines.

Clients train from the global model as in FedAvg; the server weights each local model by the inverse
of its distance to the plain average of this round's local models, so out-of-distribution updates
count less:

    theta_avg = (1/|S|) sum_k theta_k,   alpha_k = ||theta_avg - theta_k||^-1 / Z,
    Z = sum_k ||theta_avg - theta_k||^-1,   theta <- sum_k alpha_k theta_k.

Distances use all parameters (L2). ``samples: true`` multiplies alpha_k by the client's training-set
size before normalising (IDA combined with FedAvg's weights, a variant the paper also evaluates).
A local model that coincides with the average (distance below ``eps``) gets distance ``eps``.
Memory: the round's local models are held together (|S| x |W|), because the weights need the
average of all of them first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.algorithms.base import Algorithm
from mcfl.engine import Task


@dataclass
class Params:
    samples: bool = False      # also weight by training-set size
    eps: float = 1e-12

    def __post_init__(self):
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")


def ida_weights(models: torch.Tensor, n_params: int, eps: float = 1e-12,
                sizes: torch.Tensor | None = None, block: int = 1 << 16) -> torch.Tensor:
    """alpha_k for the rows of ``models`` (m, |W|): inverse L2 distance of the parameters to their
    mean, optionally times ``sizes``, normalised to sum to 1."""
    theta = models[:, :n_params]
    d2 = torch.zeros(len(theta), dtype=torch.float64, device=theta.device)
    for s in range(0, n_params, block):          # float64 over column blocks: no (m, |W|) copies
        t = theta[:, s:s + block].double()
        d2 += (t - t.mean(0)).square_().sum(1)
    d = d2.sqrt().clamp_min(eps)
    a = 1.0 / d
    if sizes is not None:
        a = a * sizes.double()
    return a / a.sum()


@dataclass
class State:
    w: torch.Tensor


class IDA(Algorithm):
    name = "IDA"
    Params = Params
    State = State

    def init(self) -> State:
        return State(self.fed.w0.clone())

    def round(self, state: State, clients: np.ndarray, rnd: int):
        models, sizes, losses = [], [], []
        for task, res in self.fed.trainer.run((Task(int(c), state.w) for c in clients), rnd):
            models.append(res.weights)
            sizes.append(res.n_samples)
            losses.append(res.loss)
        W = torch.stack(models)
        a = ida_weights(W, self.fed.model.n_params, self.p.eps,
                        torch.tensor(sizes) if self.p.samples else None)
        w = a.to(W.dtype).to(W.device) @ W
        return State(w), {"train_loss": float(np.mean(losses)), "ida_max_weight": float(a.max())}

    def eval_models(self, state: State):
        yield state.w, np.arange(self.fed.n_clients)
