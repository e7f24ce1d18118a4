"""FedCG's local objective (§3.1-3.2, Eqs. 1, 3 and 4 with hard assignment in training).

For a minibatch of client i, each sample's training-time domain y^(x) is the teacher's pseudo-label
argmax_k g_t(x)_k (Eq. 3; ``clustering: classifier``), its client's k-means cluster (``kmeans``) or
its true domain (``oracle``); w(x) = onehot(y^(x)) in Eq. 4. SGD then minimises

    CE(f(x; w(x)), y) + c * CE(g_s(x), y^(x))

Eq. 1 for the classifier (alpha, the domain-specific parameters and the GCN's W included) and Eq. 3
for the student; the teacher is fixed (no gradient). ``c = domain_lr / lr`` makes the student's SGD
step use ``domain_lr`` (its parameters get gradient from its term only; SGD has no weight decay, as
§4.1 asks) [GUESS: the two objectives are minimised in the same local pass].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mcfl.models.fedcg import ONE_PASS_MAX_K, FedCGNet


class LocalObjective:
    """One round's local loss (a :class:`~mcfl.engine.Task`'s ``loss``): vmap-safe for up to
    ``ONE_PASS_MAX_K`` domains, so the batched executor can stack it.

    ``domains``: each training row's true domain (``clustering: oracle``); ``row_client``: each
    training row's client; ``cluster``: the state's k-means cluster per client (``kmeans``)."""

    def __init__(self, clustering: str, K: int, c: float, *, cluster: torch.Tensor,
                 row_client: torch.Tensor, domains: torch.Tensor | None = None):
        self.clustering, self.K, self.c = clustering, K, c
        self.cluster, self.row_client, self.domains = cluster, row_client, domains
        self.batchable = K <= ONE_PASS_MAX_K        # more: one pass per domain present (not vmap-safe)

    def targets(self, module: FedCGNet, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The training-time hard domain y^(x) of each sample: teacher pseudo-label, k-means cluster
        of its client, or oracle domain."""
        if self.clustering == "oracle":
            return self.domains[rows]
        if self.clustering == "kmeans":
            return self.cluster[self.row_client[rows]]
        with torch.no_grad():
            return module.teacher(x).argmax(1)

    def __call__(self, module: FedCGNet, x, y, rows,
                 mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """CE(f(x; onehot(y^)), y) + c * CE(g_s(x), y^), and the round's diagnostics for this batch:
        [sum of CE_cls, sum of CE_dom, samples per domain]. ``mask`` (the batched executor's padded
        batches): the means and sums over its real rows."""
        target = self.targets(module, x, rows)
        K = self.K
        with module.assigned(target):
            logits = module(x)
        if mask is None:                       # the sequential path: plain means
            cls = F.cross_entropy(logits, y)
            dom = F.cross_entropy(module.student(x), target)
            counts = torch.bincount(target, minlength=K)[:K].float()
            aux = torch.cat([(cls * len(y)).view(1), (dom * len(y)).view(1), counts])
        else:
            n = mask.sum().clamp(min=1)
            cls = (F.cross_entropy(logits, y, reduction="none") * mask).sum() / n
            dom = (F.cross_entropy(module.student(x), target, reduction="none") * mask).sum() / n
            counts = (F.one_hot(target, K).float() * mask[:, None]).sum(0)
            aux = torch.cat([(cls * n).view(1), (dom * n).view(1), counts])
        return cls + self.c * dom, aux.detach()
