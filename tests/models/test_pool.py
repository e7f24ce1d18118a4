"""The zoo's max pooling (mcfl.models.pool) is nn.MaxPool2d bit for bit: values, and gradients
through the ReLU before it, including windows with tied maxima, on every path it takes."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from mcfl.models import digits_cnn, femnist_cnn, pool
from mcfl.models.pool import MaxPool2d


def _images(*shape, seed=0):
    """Integer pixels with blank columns, as in the digits: many tied maxima, zeros after a ReLU."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 17, shape, generator=g).float()
    x[..., :2] = 0
    x[..., 3, :] = x[..., 2, :]                         # tied non-zero maxima across rows
    return x


def _pool_twice(make_pool, x):
    """Values and the input's gradient of ReLU then pooling, for some weights of the outputs."""
    x = x.clone().requires_grad_()
    y = make_pool()(torch.relu(x - 5))
    w = torch.linspace(-1, 1, y.numel()).view_as(y)
    (g,) = torch.autograd.grad((y * w).sum(), x)
    return y.detach(), g


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (10, 32, 28, 28), (40, 16, 8, 8), (6, 4, 4)],
                         ids=["small", "femnist", "over-threshold", "unbatched"])
def test_equals_nn_maxpool_on_a_plain_module(shape):
    x = _images(*shape)
    ref, ours = _pool_twice(lambda: nn.MaxPool2d(2), x), _pool_twice(lambda: MaxPool2d(2), x)
    assert torch.equal(ref[0], ours[0]) and torch.equal(ref[1], ours[1])


def test_the_large_inputs_really_take_the_channels_last_path(monkeypatch):
    calls = []
    real = pool._pool
    monkeypatch.setattr(pool, "_pool", lambda x, k: calls.append(tuple(x.shape)) or real(x, k))
    MaxPool2d(2)(torch.zeros(40, 16, 8, 8))
    MaxPool2d(2)(torch.zeros(2, 3, 8, 8))
    assert calls == [(40, 16, 8, 8)]


@pytest.mark.parametrize("layout", ["clients-first", "batch-first"])
def test_equals_nn_maxpool_for_stacked_clients_under_vmap(layout):
    """The batched executor's stacked step: every client's gradient of the digits CNN, per-client
    weights, 30 clients x batch 10 (the vmapped dimension folded into the channels), with the
    clients' inputs stacked first or (a strided view) second."""
    torch.manual_seed(0)
    ref_net, net = digits_cnn((1, 8, 8), 10), digits_cnn((1, 8, 8), 10)
    for i in (2, 5):
        assert isinstance(net[i], MaxPool2d)
        ref_net[i] = nn.MaxPool2d(2)
    C, B = 30, 10
    params = {n: p.detach().expand(C, *p.shape) + 0.01 * torch.randn(C, *p.shape)
              for n, p in net.named_parameters()}
    x = _images(C, B, 1, 8, 8)
    if layout == "batch-first":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    y = torch.randint(0, 10, (C, B))

    def grads(module):
        leaves = {n: v.clone().requires_grad_() for n, v in params.items()}
        logits = vmap(lambda p, xi: functional_call(module, p, (xi,)))(leaves, x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(C, B).mean(1)
        return [logits.detach(), *torch.autograd.grad(loss.sum(), list(leaves.values()))]

    for a, b in zip(grads(ref_net), grads(net)):
        assert torch.equal(a, b)


def test_the_femnist_cnn_step_is_unchanged():
    torch.manual_seed(1)
    net = femnist_cnn((1, 28, 28), 62, hidden=32)
    ref = femnist_cnn((1, 28, 28), 62, hidden=32)
    ref.load_state_dict(net.state_dict())
    ref[2], ref[5] = nn.MaxPool2d(2), nn.MaxPool2d(2)
    x, y = torch.rand(10, 1, 28, 28).round(decimals=1), torch.randint(0, 62, (10,))
    grads = []
    for m in (ref, net):
        F.cross_entropy(m(x), y).backward()
        grads.append([p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_it_is_pytorchs_pooling():
    x = _images(4, 8, 8, 8).cuda()
    assert torch.equal(MaxPool2d(2)(x), F.max_pool2d(x, 2))


def test_without_torchs_vmap_query_it_is_pytorchs_pooling(monkeypatch):
    """A torch build without the private query for vmapped tensors gets F.max_pool2d everywhere."""
    monkeypatch.setattr(pool, "_is_batched", None)
    monkeypatch.setattr(pool, "_pool", lambda x, k: pytest.fail("took the channels-last path"))
    x = _images(40, 16, 8, 8)
    assert torch.equal(MaxPool2d(2)(x), F.max_pool2d(x, 2))
    stacked = vmap(MaxPool2d(2))(x.view(4, 10, 16, 8, 8))
    assert torch.equal(stacked, F.max_pool2d(x, 2).view(4, 10, 16, 4, 4))
