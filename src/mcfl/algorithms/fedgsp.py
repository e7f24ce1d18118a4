"""FedGSP (Zeng et al., "Heterogeneous Federated Learning via Grouped Sequential-to-Parallel
Training", DASFAA 2022, arXiv:2201.05762; §3.1 Algorithm 1, growth functions Eqs. 1-3) and its
ablations NaiveGSP and NaiveGSP+ICG (§4.1).

STP, one round r (Algorithm 1):

1. regroup all available clients into f(r) groups by ICG (Algorithm 2, :mod:`mcfl.cluster.icg`) and
   shuffle the order of every group (line 5);
2. sample a fraction kappa of the groups: max(1, round(kappa · #groups)) of them (line 7);
3. inside each sampled group, the first client starts from the global model, trains one local
   epoch of minibatch SGD (the engine's settings) and passes the model to the next client (lines
   9-13); groups are independent (parallel in a deployment): here the j-th clients of all sampled
   groups are one executor call, so the ``batched`` executor trains them as one chunk;
4. the global model becomes the average of the sampled groups' final models (line 16).

Aggregation normaliser. Line 16 divides the sum over the kappa·f(r) sampled groups by f(r), which
would shrink the weights by kappa every round; read as a typo, ``aggregation: mean`` (default)
divides by the number of sampled groups, so the update is an average; ``weighted`` weights every
group by its training samples (FedAvg's rule, groups as clients).

Growth of the number of groups (alpha real, beta integer):

    Linear  f(r) = beta · floor(alpha (r - 1) + 1)     (Eq. 1)
    Log     f(r) = beta · floor(alpha ln r + 1)        (Eq. 2)
    Exp     f(r) = beta · floor((1 + alpha)^(r - 1))   (Eq. 3)
    fixed   f(r) = beta                                (the ablations' fixed number of groups)

f(r) is capped at the number of clients (Eq. 15's min{K, f(r)}). With ``rounding: paper`` the
groups formed are floor(K/L) with L = floor(K/f(r)) clients each (see :mod:`mcfl.cluster.icg`).

Ablations (§4.1): NaiveGSP = random groups, fixed in number and membership, fixed order within a
group, drawn once before round 1; NaiveGSP+ICG = the same with one ICG grouping; FedGSP = ICG + STP
(regrouped and reshuffled every round, growing in number). All three sample kappa of the groups.
Clients: the runner's round-r clients (all clients unless ``clients_per_round`` is set; FedGSP's
own group sampling replaces client sampling, so the paper setting is ``clients_per_round: null``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.base import Algorithm
from mcfl.cluster.icg import class_counts, group_counts, icg_groups, pairwise_cpd, random_groups
from mcfl.engine import Task
from mcfl.streams import GSP_GROUPING as GROUPING
from mcfl.streams import GSP_SAMPLING as SAMPLING

GROWTH = ("linear", "log", "exp", "fixed")
_EPS = 1e-9                        # floor() guard against alpha*(r-1) landing a hair below an integer
_CAP = 2 ** 62


def growth(r: int, kind: str, alpha: float, beta: int) -> int:
    """Requested number of groups f(r) in round r >= 1 (Eqs. 1-3, or ``fixed``)."""
    if r < 1:
        raise ValueError(f"rounds start at 1, got {r}")
    if kind == "linear":
        return beta * math.floor(alpha * (r - 1) + 1 + _EPS)
    if kind == "log":
        return beta * math.floor(alpha * math.log(r) + 1 + _EPS)
    if kind == "exp":
        if (r - 1) * math.log1p(alpha) > math.log(_CAP):
            return _CAP
        return beta * math.floor((1 + alpha) ** (r - 1) + _EPS)
    if kind == "fixed":
        return beta
    raise ValueError(f"growth must be one of {GROWTH}, got {kind!r}")


@dataclass
class Params:
    growth: str = "log"            # linear | log | exp | fixed (Eqs. 1-3)
    alpha: float = 2.0             # growth rate (paper default with Log)
    beta: int = 10                 # initial number of groups / growth span
    kappa: float = 0.3             # fraction of groups trained per round
    grouping: str = "icg"          # icg | random
    regroup: bool = True           # STP: regroup and reshuffle every round; False: fixed from round 1
    rounding: str = "paper"        # paper | exact: number of groups for a given f(r) (see icg.layout)
    aggregation: str = "mean"      # mean | weighted: normaliser of Algorithm 1, line 16
    icg_iters: int = 10            # max constrained-k-means iterations (the paper's tau)

    def __post_init__(self):
        choices = {"growth": GROWTH, "grouping": ("icg", "random"), "rounding": ("paper", "exact"),
                   "aggregation": ("mean", "weighted")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} must be one of {allowed}, got {getattr(self, key)!r}")
        if not 0 < self.kappa <= 1:
            raise ValueError(f"kappa must be in (0, 1], got {self.kappa}")
        if self.beta < 1:
            raise ValueError(f"beta must be >= 1, got {self.beta}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if self.icg_iters < 1:
            raise ValueError(f"icg_iters must be >= 1, got {self.icg_iters}")


@dataclass
class NaiveParams(Params):
    growth: str = "fixed"
    grouping: str = "random"
    regroup: bool = False


@dataclass
class NaiveICGParams(Params):
    growth: str = "fixed"
    grouping: str = "icg"
    regroup: bool = False


@dataclass
class State:
    w: torch.Tensor
    group: torch.Tensor     # (m,) group of every client in the latest grouping (-1: not grouped)
    rank: torch.Tensor      # (m,) position of the client in its group's training order


class FedGSP(Algorithm):
    name = "FedGSP"
    Params = Params
    State = State

    def __init__(self, fed, params):
        super().__init__(fed, params)
        d = fed.data
        self.V = class_counts(np.asarray(d.y_train), np.asarray(d.offsets_train), d.n_classes)

    # -- grouping -------------------------------------------------------------------------------
    def make_groups(self, clients: np.ndarray, f: int, rng: np.random.Generator):
        """Group and in-group rank of every client (-1 for those not in ``clients``), and the
        groups' class-count matrix."""
        p = self.p
        if p.grouping == "icg":
            g, _ = icg_groups(self.V[clients], f, rng, max_iter=p.icg_iters, rounding=p.rounding)
        else:
            g = random_groups(len(clients), f, rng, p.rounding)
        group = np.full(self.fed.n_clients, -1, dtype=np.int64)
        rank = np.full(self.fed.n_clients, -1, dtype=np.int64)
        group[clients] = g
        rank[clients[rng.permutation(len(clients))]] = np.arange(len(clients))   # shuffled order
        return group, rank

    def init(self) -> State:
        if self.p.regroup:
            m = self.fed.n_clients
            group, rank = np.full(m, -1, dtype=np.int64), np.full(m, -1, dtype=np.int64)
        else:   # the ablations: one grouping and order for the whole run, from round-0 randomness
            clients = np.arange(self.fed.n_clients)
            group, rank = self.make_groups(clients, growth(1, self.p.growth, self.p.alpha, self.p.beta),
                                           self.fed.rng(0, GROUPING))
        return State(self.fed.w0.clone(), torch.from_numpy(group), torch.from_numpy(rank))

    # -- one round ------------------------------------------------------------------------------
    def round(self, state: State, clients: np.ndarray, rnd: int):
        p, fed = self.p, self.fed
        clients = np.sort(np.asarray(clients, dtype=np.int64))      # canonical: order-independent
        if p.regroup:                                                               # Alg. 1, line 5
            group, rank = self.make_groups(clients, growth(rnd, p.growth, p.alpha, p.beta),
                                           fed.rng(rnd, GROUPING))
        else:
            group, rank = state.group.numpy(), state.rank.numpy()
        avail = clients[group[clients] >= 0]
        ids = np.unique(group[avail])
        chains = [avail[group[avail] == g] for g in ids]
        chains = [c[np.argsort(rank[c])] for c in chains]
        n_train = max(1, math.floor(p.kappa * len(chains) + 0.5))                    # line 7
        picked = np.sort(fed.rng(rnd, SAMPLING).choice(len(chains), n_train, replace=False))
        w = {g: state.w for g in picked}                                           # lines 8-15
        losses: dict[int, list[float]] = {g: [] for g in picked}
        for j in range(max(len(chains[g]) for g in picked)):
            # the groups are independent: the j-th client of every group trains at once (one
            # executor call: a chunk on the batched executor), each from its group's model so far
            at = {int(chains[g][j]): g for g in picked if j < len(chains[g])}
            for task, res in fed.trainer.run([Task(c, w[g]) for c, g in at.items()], rnd):
                g = at[task.client]
                w[g] = res.weights
                losses[g].append(res.loss)
        acc = WeightedSum(1, state.w.numel(), state.w.device)
        for g in picked:
            acc.add(0, w[g], 1.0 if p.aggregation == "mean" else float(fed.n_train[chains[g]].sum()))
        losses = [x for g in picked for x in losses[g]]
        diag = {"train_loss": float(np.mean(losses)), "groups": len(chains),
                "trained_groups": int(n_train), "clients_trained": len(losses),
                "chain": int(max(len(chains[g]) for g in picked))}
        if len(chains) > 1:
            gc = group_counts(self.V[avail], np.searchsorted(ids, group[avail]))
            diag["cpd_median"] = float(np.median(pairwise_cpd(gc)))
        return State(acc.mean(0), torch.from_numpy(group), torch.from_numpy(rank)), diag   # line 16

    def eval_models(self, state: State):
        yield state.w, np.arange(self.fed.n_clients)


class NaiveGSP(FedGSP):
    name = "NaiveGSP"
    Params = NaiveParams


class NaiveGSPICG(FedGSP):
    name = "NaiveGSP+ICG"
    Params = NaiveICGParams
