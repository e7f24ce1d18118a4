"""FeSEM(K): Federated Stochastic EM (Long et al., "Multi-Center Federated Learning: Clients
Clustering for Better Personalization", World Wide Web 2022, arXiv:2005.01026; §4.2-4.3,
Algorithms 1 and 2).

Objective (Eq. 5): sum_i a_i L(D_i; W_i) + (lambda/m) sum_k sum_i r_i^(k) Dist(W_i, W~^(k)), with
Dist the squared L2 distance. Each round, for the sampled clients:

1. Local update (Alg. 2, Eq. 7): client i starts from its centre W~^(k(i)) and runs local SGD on
   L(D_i; W) + (lambda/2)·||W - W~^(k(i))||^2 (the paper's a_i and 1/m are folded into lambda).
2. E-step (Eq. 8): r_i = argmin_k ||W_i - W~^(k)||^2 against the centres of this round, computed as
   each local model arrives (``distance``: all parameters (paper) or ``last_layer`` (authors' code)).
3. M-step (Eq. 9): W~^(k) = mean of the new local models assigned to k (``mstep: mean``, the paper;
   ``weighted`` by sample count, the authors' intent). A centre that receives no client keeps its
   weights.

Switch ``shared: body`` (not in the paper; a variant for the real writers): IFCA's weight sharing (Ghosh et al.,
NeurIPS 2020, §5: the cluster models share all layers but the last) inside FeSEM. The M-step then
sets every centre's body (all parameters before the output layer, ``FlatModel.select("head")``) to
the mean of ALL the round's local models' bodies (plain or weighted as ``mstep``), and only the
output layer by Eq. 9 per cluster; the initial centres' bodies are made equal the same way (the
mean of all first local models' bodies). Since the bodies are equal, the E-step over ``all``
parameters ranks the centres by the output layer alone. Rationale: on the real FEMNIST writers
FeSEM's clusters follow no per-writer statistic and each cluster model sees only its members' data
(docs/results/femnist-sample-clusters.md); sharing the body keeps the data-hungry feature extractor
trained on every writer, and leaves the clusters only the label-level head. ``shared: none`` (the
default) is the paper. K = 1 makes both the same.

Switch ``warmup: R`` (not in the paper; the other real-writer variant): the centres are initialised
from later updates instead of the first local models. Rounds 1..R train one model for everyone,
FeSEM with a single centre (the local update of Eq. 7 from it, the M-step of Eq. 9 over all the
round's clients; bitwise FeSEM(1)); after round R the server clusters every client's local update
from that warm model (the same k-means initialisation, :func:`mcfl.cluster.init.init_centres`
with ``start`` = the warm model and round R's batches) and FeSEM proceeds from those K centres.
Rationale: on the real FEMNIST writers the first local models, trained from random weights, give
clusters that follow no per-writer statistic (docs/results/femnist-sample-clusters.md); updates
from a model that already reads characters can differ by what the writers' data still teach it.
A warm-up run needs no centre file (the k-means runs inside round R); ``warmup: 0`` (the
default) is the paper.

Steps 2-3 use running per-cluster sums, so the server holds K centres + K sums + one local model,
never all m local models. This is Algorithm 1's loop (E, M, local update) rotated to (local update,
E, M): the same sequence of updates once the initial centres exist. Initial centres: 20-restart
k-means on the clients' first local models (see :mod:`mcfl.cluster.init`; at FEMNIST scale on a
random projection of them, ``init_projection``). With client sampling
only sampled clients move (stochastic EM); the others keep their last assignment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import WeightedSum, sq_distances
from mcfl.algorithms.base import CentredAlgorithm, CentresState
from mcfl.cluster.init import init_centres
from mcfl.cluster.spec import centre_options
from mcfl.engine import Task


@dataclass
class Params:
    K: int = 2
    lam: float = 0.1                 # lambda of Eq. 7 (not given in the paper; authors' config: 0.1)
    distance: str = "all"            # all | last_layer
    mstep: str = "mean"              # mean | weighted
    init: str = "kmeans"             # kmeans | random
    restarts: int = 20
    init_projection: int | None = None   # k-means features: None auto, 0 exact, k a k-dim projection
    shared: str = "none"             # none (paper) | body: one body for all centres, per-cluster heads
    warmup: int = 0                  # R > 0: rounds 1..R as FeSEM(1), then k-means on updates from it

    def __post_init__(self):
        if self.distance not in ("all", "last_layer"):
            raise ValueError(f"distance must be 'all' or 'last_layer', got {self.distance!r}")
        if self.mstep not in ("mean", "weighted"):
            raise ValueError(f"mstep must be 'mean' or 'weighted', got {self.mstep!r}")
        if self.init not in ("kmeans", "random"):
            raise ValueError(f"init must be 'kmeans' or 'random', got {self.init!r}")
        if self.shared not in ("none", "body"):
            raise ValueError(f"shared must be 'none' or 'body', got {self.shared!r}")
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0 (rounds), got {self.warmup!r}")
        p = self.init_projection
        if p is not None and (not isinstance(p, int) or isinstance(p, bool) or p < 0):
            raise ValueError(f"init_projection must be null or an integer >= 0, got {p!r}")


def e_step(w: torch.Tensor, centres: torch.Tensor, sel: slice) -> tuple[int, float]:
    """Eq. 8: the index of the nearest centre to local model ``w`` (squared L2 over ``sel``) and
    that squared distance. Ties go to the lowest index."""
    d = sq_distances(w, centres, sel)
    k = int(torch.argmin(d))
    return k, float(d[k])


State = CentresState   # centres (K, |W|), assign (m,)


def share_body(centres: torch.Tensor, weights: torch.Tensor, body: slice) -> torch.Tensor:
    """``shared: body``: every row of ``centres`` (K, |W|) gets the ``weights``-weighted mean of the
    rows' ``body`` coordinates (in place; returns ``centres``). With per-cluster sums as rows and
    their total weights, that is the mean over all the clients the sums hold."""
    total = float(weights.sum())
    if total > 0 and body.stop > body.start:
        w = weights.to(centres.dtype).to(centres.device)
        centres[:, body] = (w[:, None] * centres[:, body]).sum(0) / total
    return centres


class FeSEM(CentredAlgorithm):
    name = "FeSEM"
    Params = Params

    def body(self) -> slice:
        """The coordinates ``shared: body`` averages over all clients: every parameter before the
        output layer (float buffers, if any, stay per cluster)."""
        return slice(0, self.fed.model.select("head").start)

    @classmethod
    def uses_centres(cls, params: dict) -> bool:
        return not params.get("warmup")      # a warm-up run clusters inside its round R

    def init(self) -> State:
        if self.p.warmup:                    # one model for all until round R: K copies of w0
            w0 = self.fed.w0
            return State(w0.expand(self.p.K, -1).clone(), torch.zeros(self.fed.n_clients, dtype=torch.long))
        return self._shared_body(super().init())

    def _shared_body(self, state: State) -> State:
        if self.p.shared == "body":          # the mean of all first local models' bodies
            members = torch.nn.functional.one_hot(state.assign, self.p.K).double()
            if self.p.mstep == "weighted":
                members *= torch.as_tensor(np.asarray(self.fed.n_train), dtype=torch.float64)[:, None]
            share_body(state.centres, members.sum(0), self.body())
        return state

    def round(self, state: State, clients: np.ndarray, rnd: int):
        p, fed = self.p, self.fed
        warm = rnd <= p.warmup               # warm-up: FeSEM(1) on the first centre
        K = 1 if warm else p.K
        sel = fed.model.select(p.distance)
        assign = state.assign.clone()
        acc = WeightedSum(K, fed.model.size, fed.device)
        tasks = (Task(int(c), state.centres[int(state.assign[c])], state.centres[int(state.assign[c])],
                      mu=p.lam) for c in clients)
        losses, dmin = [], []
        for task, res in fed.trainer.run(tasks, rnd):
            k, d = e_step(res.weights, state.centres[:K], sel)                     # E-step, Eq. 8
            assign[task.client] = k
            acc.add(k, res.weights, res.n_samples if p.mstep == "weighted" else 1.0)  # Eq. 9 sums
            losses.append(res.loss)
            dmin.append(d)
        centres = torch.stack([acc.mean(k) if acc.has(k) else state.centres[k] for k in range(K)])
        if p.shared == "body":               # the body: the mean over all this round's clients
            centres[:, self.body()] = acc.sum[:, self.body()].sum(0) / float(acc.weight.sum())
        diag = {"train_loss": float(np.mean(losses)), "moved": int((assign != state.assign).sum()),
                "intra_distance": float(np.mean(dmin))}
        if warm:
            new = State(centres.expand(p.K, -1).clone(), assign)
            if rnd == p.warmup:              # the k-means initialisation, on updates from the warm model
                new = self._warm_centres(centres[0], rnd)
                diag["moved"] = int((new.assign != state.assign).sum())
            return new, diag
        return State(centres, assign), diag

    def _warm_centres(self, warm: torch.Tensor, rnd: int) -> State:
        c = init_centres(self.fed, self.p.K, start=warm, rnd=rnd, **centre_options(self.p))
        return self._shared_body(State(c.centres, c.assign))
