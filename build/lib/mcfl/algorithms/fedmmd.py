"""FedMMD (Yao, Huang, Zhang, Luo, Chen, "Two-Stream Federated Learning: Reduce the Communication
Costs", VCIP 2018; a baseline of FedGSP's Table 1).

Two streams per client: the round's global model w^t, frozen, and the local model w trained from
it. The local objective adds the maximum mean discrepancy between the two streams' features of the
same minibatch, so that the local model learns its data without drifting from the global
representation:

    L(w) = CE(f_w(x), y) + lam · MMD²(h_w(x), h_{w^t}(x)).

The server averages the local models as FedAvg.

* **Layer** ``h``: the input of the model's last ``nn.Linear`` (the penultimate representation the
  classifier reads: for the LEAF CNNs the hidden fully connected layer after its ReLU). This is the
  layer class two-stream / DAN-style adaptation constrains (fully connected features); the conv
  maps are larger and more local, the logits carry the client's label skew we want to learn.
  A model with a single Linear layer (logistic regression) has no hidden layer: its ``h`` is the
  input, identical in both streams, and the penalty is 0.
* **Kernel**: the multi-kernel Gaussian of DAN (Long et al. 2015), ``k(u, v) = sum_i
  exp(-||u - v||² / b_i)`` with ``kernels`` bandwidths ``b_i = b · kernel_mul^(i - kernels // 2)``
  around ``b`` = the mean squared distance between the minibatch's 2B feature vectors (detached):
  the widths follow the features' scale as training changes it, so no width needs tuning. Biased
  (V-statistic) estimate over the minibatch; it is 0 for identical feature sets.
* ``lam`` = 0 is FedAvg. The paper's weight is not given in FedGSP; 0.1 by default. On the real
  FEMNIST writers 0.1 collapsed the model to one class; config/femnist-sample/fedgsp.yaml uses 0.01,
  chosen on the training loss (studies/fedmmd_select.py, docs/methods/fedgsp.md).

The penalty is a custom local loss (``Task.loss``), one per round shared by the round's clients,
marked batchable and with a layerwise form: under ``executor: batched`` the clients train as
FedAvg's do, the dense layers on the low-rank path (the global features of a step's rows: one
forward for all the chunk's clients), the rest stacked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from mcfl.algorithms.fedavg import FedAvg
from mcfl.engine import Task
from mcfl.executors import client_ce


@dataclass
class Params:
    lam: float = 0.1
    kernels: int = 5
    kernel_mul: float = 2.0

    def __post_init__(self):
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")
        if self.kernels < 1:
            raise ValueError(f"kernels must be >= 1, got {self.kernels}")
        if self.kernel_mul <= 0:
            raise ValueError(f"kernel_mul must be > 0, got {self.kernel_mul}")


def mmd2(a: torch.Tensor, b: torch.Tensor, kernels: int = 5, kernel_mul: float = 2.0,
         mask: torch.Tensor | None = None) -> torch.Tensor:
    """Biased MMD² between the rows of ``a`` and ``b`` under the multi-kernel Gaussian above.
    ``mask`` (n,): which row pairs (a_i, b_i) are real (the batched executor's padded batches); the
    padded ones are left out of the estimate and of the bandwidth."""
    n = len(a)
    z = torch.cat([a.flatten(1), b.flatten(1)])
    # differences, not |u|² + |v|² - 2 u·v: that cancels badly, and at the start of a round (local
    # features = global features) its rounding noise would drive the gradient
    d2 = (z[:, None, :] - z[None, :, :]).pow(2).sum(-1)
    if mask is None:
        m = len(z)
        base = (d2.detach().sum() / max(m * m - m, 1)).clamp_min(1e-12)
        k = sum(torch.exp(-d2 / (base * kernel_mul ** (i - kernels // 2))) for i in range(kernels))
        return k[:n, :n].mean() + k[n:, n:].mean() - 2 * k[:n, n:].mean()
    w = torch.cat([mask, mask])
    pair = w[:, None] * w[None, :]                  # 1 where both rows are real (d2's diagonal is 0)
    m = w.sum()
    base = ((d2.detach() * pair).sum() / (m * m - m).clamp_min(1)).clamp_min(1e-12)
    k = sum(torch.exp(-d2 / (base * kernel_mul ** (i - kernels // 2))) for i in range(kernels)) * pair
    return (k[:n, :n].sum() + k[n:, n:].sum() - 2 * k[:n, n:].sum()) / mask.sum().clamp_min(1) ** 2


def split_at_last_linear(module: nn.Module) -> tuple[nn.Sequential, nn.Sequential]:
    """(feature extractor, head) of an ``nn.Sequential`` cut before its last ``nn.Linear`` (the
    slices keep the parameter names of the whole model)."""
    if not isinstance(module, nn.Sequential):
        raise ValueError("FedMMD needs an nn.Sequential model (its features are a prefix of it)")
    last = max((i for i, m in enumerate(module) if isinstance(m, nn.Linear)), default=None)
    if last is None:
        raise ValueError("FedMMD needs a model with an nn.Linear layer")
    return module[:last], module[last:]


class FedMMD(FedAvg):
    name = "FedMMD"
    Params = Params

    def __init__(self, fed, params):
        super().__init__(fed, params)
        self.features, self.head = split_at_last_linear(fed.model.module)
        names = [n for n, _ in fed.model.module.named_parameters()]
        mine = {n for n, _ in self.features.named_parameters()}
        self.index = [(i, n) for i, n in enumerate(names) if n in mine]    # the extractor's parameters

    def local_task(self, client: int, w: torch.Tensor, loss=None) -> Task:
        if not self.p.lam:
            return Task(client, w)
        return Task(client, w, loss=loss or self.local_loss(w))

    def local_tasks(self, clients: np.ndarray, w: torch.Tensor):
        """The round's clients share one loss (the batched executor stacks only tasks that do)."""
        loss = self.local_loss(w) if self.p.lam else None
        return (self.local_task(int(c), w, loss) for c in clients)

    def local_loss(self, w: torch.Tensor):
        """The local objective above against the global model ``w`` (its extractor frozen)."""
        p = self.p
        views = self.fed.model.param_views(w.detach())
        frozen = {n: views[i] for i, n in self.index}             # the global extractor, frozen

        def loss(module, x, y, rows, mask=None):
            h = self.features(x)
            with torch.no_grad():
                h_global = functional_call(self.features, frozen, (x,))
            if mask is None:
                ce = F.cross_entropy(self.head(h), y)
            else:
                ce = (F.cross_entropy(self.head(h), y, reduction="none") * mask).sum() / mask.sum().clamp(min=1)
            return ce + p.lam * mmd2(h, h_global, p.kernels, p.kernel_mul, mask)

        def layerwise(x, outs, y, mask):
            """The same for n stacked clients from the layers' outputs (the batched executor's
            low-rank path): ``outs[cut - 1]`` is the input of the last Linear."""
            n, B = mask.shape
            h = outs[cut - 1] if cut else x
            with torch.no_grad():     # one forward of all the clients' rows: they share the global
                h_global = functional_call(self.features, frozen, (x.flatten(0, 1),)).unflatten(0, (n, B))
            penalty = vmap(lambda a, b, m: mmd2(a, b, p.kernels, p.kernel_mul, m))(h, h_global, mask)
            return client_ce(outs[-1], y, mask) + p.lam * penalty

        cut = len(self.features)
        loss.batchable = True          # vmap-safe: the batched executor stacks these tasks
        loss.layerwise = layerwise     # and trains them on its low-rank path where it applies
        return loss
