"""Neuron matching for matched averaging (FeSEM §5.1; after Wang, Yurochkin, Sun, Papailiopoulos,
Khazaeni, "Federated Learning with Matched Averaging", ICLR 2020).

Hidden units of a network can be permuted without changing its function: permute the output units
of a layer (rows of its weight, its bias and its BatchNorm parameters and statistics) and the same
way the inputs of the next layer (its weight's columns; after a Flatten, blocks of H·W columns per
channel). Two locally trained copies of one network may therefore hold "the same" neuron at
different indices, and averaging them index by index mixes unrelated neurons.

:func:`align` permutes a model, layer by layer from the input, so that each hidden layer's units
match a reference model's: the permutation minimising the summed squared Euclidean distance
between matched units' incoming weight vectors (weights, bias, BatchNorm scale and shift), found by
the Hungarian method (scipy's ``linear_sum_assignment``). Where every unit of the reference is
strictly nearest to the unit at its own index, the identity is the one optimum and is taken without
the Hungarian method (:func:`assignment`; the same permutation, found in O(n^2) instead of O(n^3)).
Each layer's permutation is carried into the next layer's inputs before that layer is matched. The output layer is not permuted.
:func:`matched_average` aligns every model to the reference, averages, and optionally repeats with
the average as the new reference.

Supported: ``nn.Sequential``-like models whose parameterised leaves are ``Linear``, ``Conv2d``
(groups = 1) and ``BatchNorm1d/2d``, with element-wise or per-channel parameter-free layers between
them (ReLU, pooling, Flatten, Dropout): every model in :mod:`mcfl.models`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from mcfl.aggregate import WeightedSum
from mcfl.engine import FlatModel


@dataclass
class Hidden:
    """A layer whose ``units`` output units may be permuted."""

    name: str
    units: int
    out: list[tuple[slice, tuple[int, ...]]] = field(default_factory=list)   # permuted along dim 0
    n_feat: int = 0                      # how many of ``out`` (from the front) are matching features
    nxt: tuple[slice, tuple[int, ...], int] | None = None                    # next weight, its shape, block


def plan(model: FlatModel) -> list[Hidden]:
    """The hidden layers of ``model`` and where their units sit in the flat vector."""
    sl, mod = model.slices, model.module
    hidden: list[Hidden] = []
    open_: Hidden | None = None
    for name, m in mod.named_modules():
        if any(True for _ in m.children()):
            continue
        shape = lambda attr: tuple(getattr(m, attr).shape)   # noqa: E731
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            if isinstance(m, nn.Conv2d) and m.groups != 1:
                raise ValueError(f"matching: grouped convolution {name} is not supported")
            if open_ is not None:
                fan_in = m.in_features if isinstance(m, nn.Linear) else m.in_channels
                if fan_in % open_.units:
                    raise ValueError(f"matching: {name} has {fan_in} inputs, not a multiple of the "
                                     f"{open_.units} units of {open_.name}")
                open_.nxt = (sl[f"{name}.weight"], shape("weight"), fan_in // open_.units)
                hidden.append(open_)
            units = m.out_features if isinstance(m, nn.Linear) else m.out_channels
            open_ = Hidden(name, units, [(sl[f"{name}.weight"], shape("weight"))])
            if m.bias is not None:
                open_.out.append((sl[f"{name}.bias"], shape("bias")))
            open_.n_feat = len(open_.out)
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            if open_ is None or m.num_features != open_.units:
                raise ValueError(f"matching: BatchNorm {name} does not follow a layer of its width")
            affine = [(sl[f"{name}.{a}"], shape(a)) for a in ("weight", "bias") if getattr(m, a) is not None]
            stats = [(sl[f"{name}.{a}"], shape(a)) for a in ("running_mean", "running_var")
                     if getattr(m, a, None) is not None]
            open_.out[open_.n_feat:open_.n_feat] = affine
            open_.n_feat += len(affine)
            open_.out += stats
        elif any(True for _ in m.parameters(recurse=False)):
            raise ValueError(f"matching: layer {name} ({type(m).__name__}) has parameters and is "
                             f"not supported; use Linear, Conv2d and BatchNorm layers")
    return hidden


def _features(w: torch.Tensor, h: Hidden) -> torch.Tensor:
    return torch.cat([w[s].view(shape).reshape(h.units, -1) for s, shape in h.out[:h.n_feat]], 1)


def permute(w: torch.Tensor, h: Hidden, perm: torch.Tensor) -> None:
    """In place: unit perm[i] of layer h moves to index i (and the next layer's inputs with it)."""
    for s, shape in h.out:
        w[s] = w[s].view(shape)[perm].reshape(-1)
    s, shape, block = h.nxt
    t = w[s].view(shape[0], h.units, block, *shape[2:])
    w[s] = t[:, perm].reshape(-1)


def assignment(cost: torch.Tensor) -> torch.Tensor | None:
    """The permutation ``col`` minimising ``sum_i cost[i, col[i]]``, or None for the identity.

    The identity is returned without the Hungarian method when each row's diagonal entry is
    strictly its smallest: then the identity's cost is the sum of the row minima, a lower bound
    on every assignment, and any other permutation takes a larger entry in some row, so the
    identity is the unique optimum, the one the Hungarian method would return too."""
    from scipy.optimize import linear_sum_assignment

    n = cost.shape[0]
    others = cost + torch.diag(torch.full((n,), float("inf"), dtype=cost.dtype, device=cost.device))
    if bool((cost.diagonal() < others.min(dim=1).values).all()):
        return None
    _, col = linear_sum_assignment(cost.cpu().numpy())
    return torch.from_numpy(np.asarray(col, dtype=np.int64)).to(cost.device)


def align(w: torch.Tensor, reference: torch.Tensor, layers: list[Hidden]) -> torch.Tensor:
    """A copy of ``w`` with every hidden layer's units matched to ``reference``'s (Hungarian
    matching on squared distance of incoming weights, layer by layer from the input)."""
    w = w.clone()
    for h in layers:
        cost = torch.cdist(_features(reference, h).double(), _features(w, h).double()) ** 2
        perm = assignment(cost)
        if perm is not None:
            permute(w, h, perm.to(w.device))
    return w


def matched_average(models: torch.Tensor, weights, reference: torch.Tensor, layers: list[Hidden],
                    iters: int = 1) -> torch.Tensor:
    """Weighted average of ``models`` (n, |W|) after aligning each to ``reference``; with
    ``iters > 1`` the average becomes the reference and the matching is repeated."""
    for _ in range(max(1, iters)):
        acc = WeightedSum(1, models.shape[1], models.device)
        for w, a in zip(models, weights):
            acc.add(0, align(w, reference, layers), float(a))
        reference = acc.mean(0)
    return reference
