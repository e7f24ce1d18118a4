"""FedCG's server (§3.1, §3.3): the initial adjacency matrices and teacher, and the step after each
round's local updates.

Round r, after the sampled clients' local updates:

2. (Eq. 2) FedAvg of the whole vector, weighted by training-set size ("we perform FedAvg on both
   domain-agnostic and domain-specific parameters in each training round"; the student: "updated
   after each round with standard FedAvg"). The teacher and the adjacency matrices, which no client
   changes, are copied from the previous state exactly (averaging n equal copies can move the last
   bit of a float).
3. Every R = ``teacher_every`` rounds the teacher takes the student's weights (§3.1).
4. Adjacency (Eq. 6, ``adjacency: distance``): each layer's A is recomputed from the averaged
   domain-specific parameters after every round from round R on, and sent with the weights; before
   that the initial A is used (``adjacency_init``: ``eye``, disconnected domains, or ``random``;
   Table 4) [GUESS: when A is first recomputed; the text: eye init "allows the model to refine the
   domain-specific components separately before merging them based on their distance"].
   ``uniform``/``hamming`` fix A (Table 3's U/H) for the whole run.

Our addition, ``calibrate_teacher`` (default on; off = the paper as written): whenever the teacher
is (re)set (at initialisation and at each step 3) its logits are standardised over all training
samples (:func:`calibrated_teacher`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mcfl.algorithms.fedcg.params import Params
from mcfl.engine import generator
from mcfl.models.fedcg import (FedCGNet, distance_adjacency, hamming_adjacency, random_adjacency,
                               uniform_adjacency)
from mcfl.streams import FEDCG_ADJ


def initial_adjacency(p: Params, layer: int, seed: int) -> torch.Tensor:
    """A of the ``layer``-th domain layer before the first update (or for the whole run)."""
    if p.adjacency == "uniform" or (p.adjacency == "distance" and p.adjacency_init == "uniform"):
        return uniform_adjacency(p.K, p.self_weight)
    if p.adjacency == "hamming":
        return hamming_adjacency(p.K, p.self_weight)
    if p.adjacency_init == "random":
        return random_adjacency(p.K, p.self_weight, generator(seed, FEDCG_ADJ, layer))
    return torch.eye(p.K)


@torch.no_grad()
def calibrated_teacher(net: FedCGNet, flat, dev, w: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """``w`` with the teacher's logits standardised over all training samples (``dev``'s): its last
    layer becomes (W z + b - mu) / sigma, with mu, sigma each logit's mean and standard deviation (in
    FL: K sums and K sums of squares per client). A randomly initialised classifier's argmax is
    almost constant (the mean pooled feature times W dominates), so without this every sample gets
    one pseudo-label, the student learns that constant and the teacher-student pair stays collapsed
    on one domain (observed on digits_domains: domain entropy 0 by round 10); with it the
    self-labelling converges to clusters aligned with the true domains."""
    flat.load(w)
    net.eval()
    n = int(dev.offsets["train"][-1])
    z = torch.cat([net.teacher(dev.inputs(torch.arange(i, min(i + chunk, n), device=w.device)))
                   for i in range(0, n, chunk)]).double()
    mu, sigma = z.mean(0), z.std(0).clamp_min(1e-8)
    last = net.teacher[-1]
    last.weight.copy_((last.weight.double() / sigma[:, None]).float())
    last.bias.copy_(((last.bias.double() - mu) / sigma).float())
    return flat.get()


def server_step(p: Params, prev: torch.Tensor, mean: torch.Tensor, rnd: int, *, teacher: slice,
                student: slice, layers: list, calibrate) -> torch.Tensor:
    """Steps 2-4 of round ``rnd`` (see the module docstring): ``mean`` is the clients' weighted
    average (Eq. 2), ``prev`` the state's vector; ``layers`` the domain layers' (name, module, theta
    slice, adjacency slice); ``calibrate(w)`` the calibrated teacher of ``w``."""
    w = mean
    w[teacher] = prev[teacher]          # server-owned, unchanged by clients: keep them
    for *_, adj in layers:              # exact (averaging n copies moves the last bit)
        w[adj] = prev[adj]
    if p.clustering == "classifier" and rnd % p.teacher_every == 0:             # step 3
        w[teacher] = w[student]
        if p.calibrate_teacher:
            w = calibrate(w)
    if p.adjacency == "distance" and rnd >= p.teacher_every:                    # step 4 (Eq. 6)
        for _, m, theta, adj in layers:
            a = distance_adjacency(w[theta].view(p.K, -1), p.self_weight)
            w[adj] = a.reshape(-1)
    return w


def round_diagnostics(K: int, losses: list[float], stats: torch.Tensor) -> dict[str, float]:
    """The round's mean local loss, its two terms per training sample, and the entropy of the
    domains the samples were trained in (normalised to [0, 1]; 0: every sample in one domain)."""
    n = float(stats[2:].sum())
    share = (stats[2:] / max(n, 1)).cpu().numpy()
    ent = -(share[share > 0] * np.log(share[share > 0])).sum() / math.log(K) if K > 1 else 1.0
    return {"train_loss": float(np.mean(losses)), "cls_loss": float(stats[0]) / max(n, 1),
            "domain_loss": float(stats[1]) / max(n, 1), "domain_entropy": float(ent)}
