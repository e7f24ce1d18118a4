"""Neuron matching (FeSEM-MA's M-step): permuted copies of a network average back to the network."""

import numpy as np
import pytest
import torch
from torch import nn

from mcfl.algorithms import matching
from mcfl.engine import FlatModel
from mcfl.models import celeba_cnn, digits_cnn


def mlp():
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 6), nn.ReLU(), nn.Linear(6, 3))


def permuted_copy(module, gen):
    """The same function with every hidden layer's units shuffled, written directly on the layers
    (independently of mcfl.algorithms.matching): rows of a layer + its BatchNorm, then the next layer's inputs."""
    m = _deepcopy(module)
    layers = [x for x in m.modules() if isinstance(x, (nn.Linear, nn.Conv2d))]
    norms = {id(a): b for a, b in zip(list(m.modules()), list(m.modules())[1:])
             if isinstance(b, (nn.BatchNorm1d, nn.BatchNorm2d))}
    with torch.no_grad():
        for layer, nxt in zip(layers, layers[1:]):
            units = layer.weight.shape[0]
            perm = torch.randperm(units, generator=gen)
            layer.weight.copy_(layer.weight[perm])
            layer.bias.copy_(layer.bias[perm])
            bn = norms.get(id(layer))
            if bn is not None:
                for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
                    t.copy_(t[perm])
            w = nxt.weight
            block = w.shape[1] // units
            w.copy_(w.view(w.shape[0], units, block, *w.shape[2:])[:, perm].reshape(w.shape))
    return m


def _deepcopy(m):
    import copy
    return copy.deepcopy(m)


def randomise_bn(module, gen):
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.randn(m.num_features, generator=gen))


@pytest.mark.parametrize("build, x_shape", [
    (mlp, (5,)),
    (lambda: digits_cnn((1, 8, 8), 10), (1, 8, 8)),
    (lambda: celeba_cnn((3, 12, 12), 2, channels=6, blocks=2), (3, 12, 12)),
])
def test_matched_average_of_permuted_copies_is_the_original_function(build, x_shape):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    original = build()
    randomise_bn(original, gen)
    original.eval()
    shuffled = permuted_copy(original, gen).eval()
    x = torch.randn(16, *x_shape, generator=gen)
    with torch.no_grad():
        y = original(x)
        assert torch.allclose(shuffled(x), y, atol=1e-5)         # same function, other unit order
    a, b = FlatModel(_deepcopy(original)), FlatModel(shuffled)
    assert not torch.allclose(a.flat, b.flat)
    layers = matching.plan(a)
    # reference: a perturbed original, so neither copy is the reference itself
    reference = a.flat + 0.01 * torch.randn(a.size, generator=gen)
    avg = matching.matched_average(torch.stack([a.flat, b.flat]), [1.0, 3.0], reference, layers)
    out = FlatModel(build())
    out.load(avg)
    with torch.no_grad():
        assert torch.allclose(out.module.eval()(x), y, atol=1e-5)
        plain = FlatModel(build())
        plain.load((a.flat + 3 * b.flat) / 4)
        assert not torch.allclose(plain.module.eval()(x), y, atol=1e-2)   # index-wise averaging breaks it


def test_plan_finds_hidden_layers_and_flatten_blocks():
    fm = FlatModel(digits_cnn((1, 8, 8), 10, hidden=12))
    layers = matching.plan(fm)
    assert [(h.units, h.nxt[2]) for h in layers] == [(16, 1), (32, 4), (12, 1)]   # 32 ch x 2x2 -> dense


def test_plan_rejects_unsupported_layers():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.scale

    with pytest.raises(ValueError, match="not supported"):
        matching.plan(FlatModel(nn.Sequential(nn.Linear(3, 3), Odd(), nn.Linear(3, 2))))


def test_assignment_takes_the_identity_only_where_it_is_the_unique_optimum():
    """The shortcut returns the identity exactly when every row's diagonal is strictly its
    smallest entry, and then the Hungarian method agrees; a tie or a cheaper swap goes to the
    Hungarian method. Checked against scipy on near-identity and shuffled cost matrices."""
    from scipy.optimize import linear_sum_assignment

    gen = torch.Generator().manual_seed(3)
    seen = set()
    for trial in range(200):
        n = 2 + trial % 9
        x = torch.randn(n, 4, generator=gen, dtype=torch.float64)
        y = x + (0.05 if trial % 2 else 1.5) * torch.randn(n, 4, generator=gen, dtype=torch.float64)
        cost = torch.cdist(x, y) ** 2
        want = linear_sum_assignment(cost.numpy())[1]
        got = matching.assignment(cost)
        diag_strict = all(cost[i, i] < torch.cat([cost[i, :i], cost[i, i + 1:]]).min() for i in range(n))
        assert (got is None) == diag_strict
        seen.add(diag_strict)
        assert (np.arange(n) if got is None else got.numpy()).tolist() == want.tolist()
    assert seen == {True, False}                       # both branches ran
    tie = torch.tensor([[1.0, 1.0], [2.0, 0.5]], dtype=torch.float64)   # row 0: diagonal ties
    assert matching.assignment(tie) is not None
    swap = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert matching.assignment(swap).tolist() == [1, 0]
