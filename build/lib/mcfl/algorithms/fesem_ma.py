"""FeSEM-MA(K): FeSEM with matched averaging in the M-step (Long et al., "Multi-Center Federated
Learning", WWW 2022, arXiv:2005.01026, §5.1 "Model Aggregation with Neuron Matching"; Table 2's last
row).

Local update and E-step are FeSEM's (Eqs. 7 and 8, :mod:`mcfl.algorithms.fesem`). The M-step (Eq. 9)
averages a cluster's new local models only after aligning their neurons: every member is permuted,
layer by layer from the input, so that its hidden units match those of the cluster's current centre
(Hungarian matching on the squared distance of the units' incoming weights, with scipy's
``linear_sum_assignment``; each permutation is carried into the next layer's inputs), and the
aligned models are averaged (plainly or sample-weighted, per ``mstep``). With ``match_iters > 1``
the average becomes the reference and the matching is repeated. See :mod:`mcfl.algorithms.matching`.

How this differs from FedMA (Wang et al., ICLR 2020), whose BBP-MAP the paper's §5.1 describes:
FedMA matches each client's neurons to global neurons by the MAP estimate of a Beta-Bernoulli
process with Gaussian neurons (a cost from posterior probabilities plus an Indian-buffet prior that
lets the global layer grow new neurons), and proceeds layer-wise over communication rounds,
freezing each matched layer and retraining the layers above it. Here the matching is a one-to-one
assignment to a fixed-size reference (the centre every member started from) under plain squared
distance, all layers are matched at once at the server, nothing is retrained, and it runs within
each FeSEM cluster. Since all members start from the centre, their units rarely swap after short
local training, so FeSEM-MA is expected to stay close to FeSEM (the paper reports it comparable or
worse). Memory: the round's local models are held until the M-step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.algorithms import matching
from mcfl.algorithms.fesem import FeSEM, State, e_step
from mcfl.algorithms.fesem import Params as FeSEMParams
from mcfl.engine import Task


@dataclass
class Params(FeSEMParams):
    match_iters: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.match_iters < 1:
            raise ValueError(f"match_iters must be >= 1, got {self.match_iters}")
        if self.shared != "none" or self.warmup:
            raise ValueError("FeSEM-MA has the paper's M-step only: shared and warmup are FeSEM's "
                             "switches (method: FeSEM)")


class FeSEMMA(FeSEM):
    name = "FeSEM-MA"
    Params = Params

    def round(self, state: State, clients: np.ndarray, rnd: int):
        p, fed = self.p, self.fed
        layers = matching.plan(fed.model)
        sel = fed.model.select(p.distance)
        assign = state.assign.clone()
        tasks = (Task(int(c), state.centres[int(state.assign[c])], state.centres[int(state.assign[c])],
                      mu=p.lam) for c in clients)
        members: list[list] = [[] for _ in range(p.K)]
        losses, dmin = [], []
        for task, res in fed.trainer.run(tasks, rnd):
            k, d = e_step(res.weights, state.centres, sel)                         # E-step, Eq. 8
            assign[task.client] = k
            members[k].append((res.weights, res.n_samples if p.mstep == "weighted" else 1.0))
            losses.append(res.loss)
            dmin.append(d)
        centres = state.centres.clone()
        for k, got in enumerate(members):                                        # matched M-step
            if got:
                centres[k] = matching.matched_average(torch.stack([w for w, _ in got]), [a for _, a in got],
                                                      state.centres[k], layers, p.match_iters)
        moved = int((assign != state.assign).sum())
        return State(centres, assign), {"train_loss": float(np.mean(losses)), "moved": moved,
                                        "intra_distance": float(np.mean(dmin))}
