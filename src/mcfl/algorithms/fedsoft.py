"""FedSoft: soft clustered federated learning with proximal local updating (Ruan, Joe-Wong,
"FedSoft: Soft Clustered Federated Learning with Proximal Local Updating", AAAI 2022).

The server keeps K centres c_1..c_K; client k holds importance weights u_k1..u_kK over them (its
data as a mixture of the K cluster distributions). Each round, for the sampled clients:

1. Importance estimation (every ``tau`` rounds: rounds 1, 1 + tau, ...): for each of the client's
   training samples the centre with the lowest loss wins (ties: the lowest index); with n_ks the
   wins of centre s, u_ks = n_ks / n_k, a zero count replaced by ``sigma`` (the paper's smoothing;
   not renormalised, as the authors' code).
2. Proximal local update: the client minimises F_k(w) + (lambda/2) sum_s u_ks ||w - c_s||^2. Its
   gradient term lambda sum_s u_ks (w - c_s) = (lambda sum_s u_ks)(w - m_k) with the importance mix
   m_k = sum_s u_ks c_s / sum_s u_ks, so this is the engine's proximal task ``Task(anchor=m_k,
   mu=lambda·sum_s u_ks)`` (FedProx's). The update starts from the client's own model w_k
   (``start: local``, the paper: clients keep their models; the mix m_k the first time) or from
   m_k (``start: mix``: no per-client models are kept, so memory is K models, not m).
3. Centre aggregation by importance: c_s = sum_k u_ks n_k w_k / sum_k u_ks n_k over the sampled
   clients (the paper's v_sk = u_ks n_k / sum_k' u_k's n_k' restricted to them).

Departure: the paper lets each centre draw its own clients with probability v_sk; here the run's
client stream samples (uniformly) and every centre aggregates the sampled clients by v_sk, so
FedSoft sees the same clients as every other method. Importance is estimated on the sampled
clients only; the others keep their last weights. Initial centres: the package's k-means
initialisation on the clients' first local models (as FeSEM and HypoCluster; the paper initialises
centres at random), the initial importance one-hot on each client's k-means cluster. A client is
tested with its own model (``start: local``, once it has one) or its importance mix; its cluster
(for ARI/NMI) is its most important centre. With K = 1 and ``start: mix`` a round is FedProx's
round with mu = lambda, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.base import CentredAlgorithm
from mcfl.cluster.init import initial_centres
from mcfl.engine import Task


@dataclass
class Params:
    K: int = 2
    lam: float = 0.1                 # lambda: the authors' code's value for MNIST / EMNIST letters
    tau: int = 1                     # importance estimated every tau rounds
    sigma: float = 1e-4              # importance of a centre that wins no sample
    start: str = "local"             # local (the paper) | mix
    restarts: int = 20               # k-means restarts of the initial centres

    def __post_init__(self):
        if self.K < 1:
            raise ValueError(f"K must be >= 1, got {self.K}")
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")
        if self.tau < 1:
            raise ValueError(f"tau must be >= 1 (rounds), got {self.tau}")
        if not 0 <= self.sigma < 1:
            raise ValueError(f"sigma must be in [0, 1), got {self.sigma}")
        if self.start not in ("local", "mix"):
            raise ValueError(f"start must be 'local' or 'mix', got {self.start!r}")


@dataclass
class State:
    centres: torch.Tensor   # (K, |W|)
    assign: torch.Tensor    # (m,) int64: each client's most important centre
    u: torch.Tensor         # (m, K) float64: importance weights
    local: torch.Tensor     # (m, |W|) the clients' own models (start: local), else (0, |W|)
    has_local: torch.Tensor  # (m,) bool: whether client k has trained (start: local)


def importance(losses: torch.Tensor, sigma: float) -> torch.Tensor:
    """Step 1 for one client: u_s = (samples whose lowest loss is centre s's) / n, zeros replaced by
    ``sigma``; ``losses`` is (K, n) per-sample losses."""
    k, n = losses.shape
    wins = torch.bincount(losses.argmin(0), minlength=k).double()
    u = wins / max(n, 1)
    return torch.where(wins > 0, u, torch.full_like(u, sigma))


def mix(centres: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """m_k = sum_s u_s c_s / sum_s u_s, the anchor of the proximal term."""
    acc = WeightedSum(1, centres.shape[1], centres.device)
    for s in range(len(centres)):
        acc.add(0, centres[s], float(u[s]))
    return acc.mean(0)


class FedSoft(CentredAlgorithm):
    name = "FedSoft"
    Params = Params
    State = State

    def init(self) -> State:
        c = initial_centres(self.fed, self.p)
        m, size = self.fed.n_clients, self.fed.model.size
        u = torch.nn.functional.one_hot(c.assign, self.p.K).double().clamp_min(self.p.sigma)
        kept = m if self.p.start == "local" else 0
        return State(c.centres, c.assign, u, torch.zeros(kept, size, device=self.fed.device),
                     torch.zeros(m, dtype=torch.bool))

    def estimate(self, centres: torch.Tensor, client: int) -> torch.Tensor:
        rows = self.fed.dev.client_rows(client)
        losses = torch.stack([self.fed.trainer.predict(c, rows, split="train")[1] for c in centres])
        return importance(losses.cpu(), self.p.sigma)

    def round(self, state: State, clients: np.ndarray, rnd: int):
        p, fed = self.p, self.fed
        u = state.u.clone()
        if (rnd - 1) % p.tau == 0:
            for c in clients:
                u[int(c)] = self.estimate(state.centres, int(c))
        anchors = {int(c): mix(state.centres, u[int(c)]) for c in clients}
        local, has_local = state.local.clone(), state.has_local.clone()

        def start(c: int) -> torch.Tensor:
            return local[c] if p.start == "local" and bool(has_local[c]) else anchors[c]

        tasks = (Task(int(c), start(int(c)), anchors[int(c)], mu=p.lam * float(u[int(c)].sum()))
                 for c in clients)
        acc = WeightedSum(p.K, fed.model.size, fed.device)
        losses = []
        for task, res in fed.trainer.run(tasks, rnd):
            for s in range(p.K):
                acc.add(s, res.weights, float(u[task.client, s]) * res.n_samples)
            if p.start == "local":
                local[task.client] = res.weights
                has_local[task.client] = True
            losses.append(res.loss)
        centres = torch.stack([acc.mean(s) if acc.has(s) else state.centres[s] for s in range(p.K)])
        assign = u.argmax(1)
        return State(centres, assign, u, local, has_local), {
            "train_loss": float(np.mean(losses)), "moved": int((assign != state.assign).sum())}

    def eval_models(self, state: State):
        for c in range(self.fed.n_clients):
            own = self.p.start == "local" and bool(state.has_local[c])
            yield (state.local[c] if own else mix(state.centres, state.u[c])), np.array([c])
