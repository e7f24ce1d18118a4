"""FedAdagrad, FedAdam and FedYogi (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
arXiv:2003.00295; Algorithm 2), FedGSP's adaptive-optimisation baselines.

Clients run local SGD from the global model x_t as in FedAvg; the server treats the averaged update
as a pseudo-gradient and takes one adaptive step:

    Delta_t = (1/|S|) sum_i (x_i - x_t)                  (uniform mean, Alg. 2; ``weighted``: by samples)
    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t     = v_{t-1} + Delta_t^2                                      FedAdagrad
    v_t     = beta2 v_{t-1} + (1 - beta2) Delta_t^2                    FedAdam
    v_t     = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)  FedYogi
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

with m_{-1} = 0, v_{-1} = tau^2 and no bias correction (as in Algorithm 2). Defaults: beta1 = 0.9,
beta2 = 0.99, tau = 1e-3 (the paper's grid centre); FedAdagrad uses beta1 = 0 (no momentum, as in
the paper's experiments and Flower). The server learning rate eta is tuned per dataset in the paper;
the default 0.01 is a starting point. Floating-point buffers (none in the models used here) are
averaged, not optimised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.base import Algorithm
from mcfl.engine import Task


@dataclass
class Params:
    eta: float = 0.01        # server learning rate
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3        # adaptivity; v_{-1} = tau^2
    weighted: bool = False   # Delta_t weighted by training samples instead of a plain mean

    def __post_init__(self):
        if self.eta <= 0 or self.tau <= 0:
            raise ValueError(f"eta and tau must be > 0, got eta={self.eta}, tau={self.tau}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"beta1, beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")


@dataclass
class AdagradParams(Params):
    beta1: float = 0.0


def second_moment(kind: str, v: torch.Tensor, d2: torch.Tensor, beta2: float) -> torch.Tensor:
    """v_t from v_{t-1} and Delta_t^2 (Reddi et al., Algorithm 2)."""
    if kind == "adagrad":
        return v + d2
    if kind == "adam":
        return beta2 * v + (1 - beta2) * d2
    if kind == "yogi":
        return v - (1 - beta2) * d2 * torch.sign(v - d2)
    raise ValueError(f"unknown server optimiser {kind!r}")


def server_step(kind: str, x: torch.Tensor, delta: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                p: Params) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One server update: (x_{t+1}, m_t, v_t)."""
    m = p.beta1 * m + (1 - p.beta1) * delta
    v = second_moment(kind, v, delta * delta, p.beta2)
    return x + p.eta * m / (torch.sqrt(v) + p.tau), m, v


@dataclass
class State:
    w: torch.Tensor
    m: torch.Tensor   # first moment over the parameters
    v: torch.Tensor   # second moment over the parameters


class FedOpt(Algorithm):
    kind: ClassVar[str]
    Params = Params
    State = State

    def init(self) -> State:
        P = self.fed.model.n_params
        w = self.fed.w0.clone()
        return State(w, torch.zeros(P, device=w.device), torch.full((P,), self.p.tau ** 2, device=w.device))

    def round(self, state: State, clients: np.ndarray, rnd: int):
        P = self.fed.model.n_params
        acc = WeightedSum(1, state.w.numel(), state.w.device)
        losses = []
        # summed in canonical order: Yogi's sign(Δ² - v) would turn float rounding into real changes
        for task, res in self.fed.trainer.run((Task(int(c), state.w) for c in np.sort(clients)), rnd):
            acc.add(0, res.weights, res.n_samples if self.p.weighted else 1.0)
            losses.append(res.loss)
        mean = acc.mean(0)
        x, m, v = server_step(self.kind, state.w[:P], mean[:P] - state.w[:P], state.m, state.v, self.p)
        w = torch.cat([x, mean[P:]])                       # buffers: plain average
        return State(w, m, v), {"train_loss": float(np.mean(losses)),
                                "update_norm": float(torch.linalg.vector_norm(x - state.w[:P]))}

    def eval_models(self, state: State):
        yield state.w, np.arange(self.fed.n_clients)


class FedAdagrad(FedOpt):
    name = "FedAdagrad"
    kind = "adagrad"
    Params = AdagradParams


class FedAdam(FedOpt):
    name = "FedAdam"
    kind = "adam"


class FedYogi(FedOpt):
    name = "FedYogi"
    kind = "yogi"
