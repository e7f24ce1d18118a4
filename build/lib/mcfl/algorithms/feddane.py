"""FedDANE (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "FedDANE: A Federated Newton-Type Method",
Asilomar 2019, arXiv:2001.01920, Algorithm 1; FeSEM §6.1 baseline 7).

Each round t, from the global model w_t:

1. gradient round: every sampled client k sends grad F_k(w_t) (its full training set); the server
   forms g_t = sum_k n_k grad F_k(w_t) / sum_k n_k;
2. local solves: every sampled client approximately minimises, by local SGD from w_t,

       F_k(w) + <g_t - grad F_k(w_t), w> + (mu/2)·||w - w_t||^2,

   i.e. each step adds the constant correction g_t - grad F_k(w_t) and mu·(w - w_t) to the minibatch
   gradient (the engine's ``Task(linear=..., anchor=w_t, mu=mu)``);
3. the server averages the local solutions weighted by n_k.

Algorithm 1 draws a second client subset for step 2; Li et al.'s code re-seeds the sampler with
the round number, so both subsets coincide, and we use the round's clients for both. grad F_k(w_t)
is recomputed in step 2 rather than stored (one local model in memory, not one per client), except
with an executor that holds all the round's tasks anyway (``batched``: ``keeps_tasks``), which
keeps step 1's gradients and so computes each client's gradient once.
mu = 0 is the value of the FeSEM authors' runs (``all_baselines/fed-dane/run_trainer.sh``: "used 0
all the time"); Li et al. tune it in {0, 0.001, 0.01, 0.1, 1}.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.fedavg import FedAvg, State
from mcfl.engine import Task


@dataclass
class Params:
    mu: float = 0.0

    def __post_init__(self):
        if self.mu < 0:
            raise ValueError(f"mu must be >= 0, got {self.mu}")


class FedDANE(FedAvg):
    name = "FedDANE"
    Params = Params

    def round(self, state: State, clients: np.ndarray, rnd: int):
        fed, w = self.fed, state.w
        grads = WeightedSum(1, fed.model.n_params, w.device)
        keep = getattr(fed.trainer, "keeps_tasks", False)
        kept = {}
        for c in clients:                                                       # step 1
            gc = fed.trainer.gradient(w, int(c))[0]
            grads.add(0, gc, fed.n_train[c])
            if keep:
                kept[int(c)] = gc
        g = grads.mean(0)
        local = lambda c: kept.pop(c).neg_().add_(g) if keep else g - fed.trainer.gradient(w, c)[0]  # noqa: E731
        tasks = (Task(int(c), w, anchor=w, mu=self.p.mu, linear=local(int(c))) for c in clients)   # step 2
        acc = WeightedSum(1, w.numel(), w.device)
        losses = []
        for task, res in fed.trainer.run(tasks, rnd):                           # step 3
            acc.add(0, res.weights, res.n_samples)
            losses.append(res.loss)
        return State(acc.mean(0)), {"train_loss": float(np.mean(losses)),
                                    "global_grad_norm": float(g.norm())}
