"""Server-side arithmetic shared by the algorithms: pure functions over flat weight vectors."""

from __future__ import annotations

from typing import Iterable

import torch


class WeightedSum:
    """Running sums for K aggregates: ``add(k, w, weight)``, then ``mean(k)``. Memory O(K·|W|)."""

    def __init__(self, k: int, size: int, device: torch.device):
        self.sum = torch.zeros(k, size, device=device)
        self.weight = torch.zeros(k, dtype=torch.float64)

    def add(self, k: int, w: torch.Tensor, weight: float = 1.0) -> None:
        self.sum[k].add_(w, alpha=float(weight))
        self.weight[k] += float(weight)

    def has(self, k: int) -> bool:
        return bool(self.weight[k] > 0)

    def mean(self, k: int) -> torch.Tensor:
        return self.sum[k] / float(self.weight[k])


def weighted_mean(models: Iterable[tuple[torch.Tensor, float]]) -> torch.Tensor:
    """sum_i a_i w_i / sum_i a_i (FedAvg's aggregation, Eq. 2 of FeSEM)."""
    acc = None
    for w, a in models:
        if acc is None:
            acc = WeightedSum(1, w.numel(), w.device)
        acc.add(0, w, a)
    if acc is None:
        raise ValueError("weighted_mean of no models")
    return acc.mean(0)


def sq_distances(w: torch.Tensor, centres: torch.Tensor, sel: slice, block: int = 1 << 20) -> torch.Tensor:
    """||w[sel] - c_k[sel]||^2 for every centre k (FeSEM's Dist, Eq. 8). Computed over blocks of
    about ``block`` entries (float64 across blocks), so the temporaries stay ~4 MB instead of two
    K x |W| arrays (2 x 106 MB per client for K = 4 and the FEMNIST CNN)."""
    c, v = centres[:, sel], w[sel]
    step = max(1, block // len(c))
    out = torch.zeros(len(c), dtype=torch.float64, device=w.device)
    for a in range(0, v.numel(), step):
        out += (c[:, a:a + step] - v[a:a + step]).square_().sum(1)
    return out.to(w.dtype)
