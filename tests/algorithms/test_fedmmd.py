"""FedMMD: the MMD² of its multi-kernel Gaussian by hand, and its local step against a hand-rolled
SGD loop on CE + lam·MMD²(local features, frozen global features)."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mcfl.algorithms.fedmmd import FedMMD, Params, mmd2, split_at_last_linear
from mcfl.data import load
from mcfl.engine import LocalSpec
from mcfl.federation import build_federation


def test_mmd_of_identical_feature_sets_is_zero():
    a = torch.randn(6, 4)
    assert float(mmd2(a, a.clone())) == pytest.approx(0.0, abs=1e-6)


def test_mmd_of_two_points_by_hand():
    a, b = torch.tensor([[0.0]]), torch.tensor([[1.0]])
    # one kernel: bandwidth = mean squared distance over the 2 ordered pairs = 1
    assert float(mmd2(a, b, kernels=1)) == pytest.approx(2 - 2 * math.exp(-1))
    # three kernels, widths 0.5, 1, 2: k(a, a) = 3, k(a, b) = e^-2 + e^-1 + e^-0.5
    assert float(mmd2(a, b, kernels=3)) == pytest.approx(6 - 2 * (math.exp(-2) + math.exp(-1) + math.exp(-0.5)))


def test_masked_mmd_leaves_out_the_padded_rows():
    """The batched executor pads short batches: the masked estimate of the real rows plus padding
    is the plain estimate of the real rows, value and gradient."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(7, 16, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(7, 16, dtype=torch.float64, generator=g)
    pad_a, pad_b = (torch.randn(3, 16, dtype=torch.float64, generator=g) * 50 for _ in range(2))
    mask = torch.cat([torch.ones(7), torch.zeros(3)]).double()
    plain, masked = mmd2(a, b), mmd2(torch.cat([a, pad_a]), torch.cat([b, pad_b]), mask=mask)
    assert masked.item() == pytest.approx(plain.item(), rel=1e-12) and plain.item() > 0.01
    ga, gm = (torch.autograd.grad(v, a)[0] for v in (plain, masked))
    assert torch.allclose(ga, gm, rtol=1e-10, atol=1e-14)
    assert mmd2(a, b, mask=torch.ones(7).double()).item() == pytest.approx(plain.item(), rel=1e-12)


def test_params_are_checked():
    with pytest.raises(ValueError, match="lam must be >= 0"):
        Params(lam=-1)


def test_local_update_is_sgd_on_cross_entropy_plus_mmd_to_the_frozen_global_model(digits_store):
    fed = build_federation(load(digits_store), {"name": "digits_cnn", "hidden": 8},
                           {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 1}, seed=0)
    spec = LocalSpec(lr=0.1, batch_size=5, steps=3)
    lam, client = 0.5, 2
    res = fed.trainer.train(FedMMD(fed, Params(lam=lam)).local_task(client, fed.w0), 1, spec=spec)
    plain = fed.trainer.train(FedMMD(fed, Params(lam=0.0)).local_task(client, fed.w0), 1, spec=spec)

    # the same three batches, by hand on a copy of the model
    fed.model.load(fed.w0)
    local = copy.deepcopy(fed.model.module)
    frozen = copy.deepcopy(fed.model.module)
    feat_l, head_l = split_at_last_linear(local)
    feat_g, _ = split_at_last_linear(frozen)
    params = list(local.parameters())
    for rows in fed.trainer.batches(client, 1, spec=spec):
        x, y = fed.dev.inputs(rows), fed.dev.y["train"][rows]
        h = feat_l(x)
        with torch.no_grad():
            hg = feat_g(x)
        loss = F.cross_entropy(head_l(h), y) + lam * mmd2(h, hg)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= 0.1 * g
    expected = torch.cat([p.detach().reshape(-1) for p in params])
    P = fed.model.n_params
    assert torch.allclose(res.weights[:P], expected, atol=1e-6)
    assert not torch.allclose(res.weights[:P], plain.weights[:P], atol=1e-6)   # the term acts
    assert np.isfinite(res.loss)


def test_layerwise_form_is_each_clients_loss(digits_store):
    """The low-rank path's form of the loss (n clients stacked, from the layers' outputs) equals
    the per-client loss, padded rows included (client 1's last two rows are padding)."""
    fed = build_federation(load(digits_store), {"name": "digits_cnn", "hidden": 8},
                           {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 1}, seed=0)
    loss = FedMMD(fed, Params(lam=0.5)).local_loss(fed.w0)
    g = torch.Generator().manual_seed(1)
    ws = [fed.w0 + 0.1 * torch.randn(fed.w0.shape, generator=g) for _ in range(2)]   # not global
    x = fed.dev.inputs(torch.arange(10)).view(2, 5, *fed.dev.x["train"].shape[1:])
    y = fed.dev.y["train"][:10].view(2, 5)
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2])
    outs, want, ce = [[] for _ in fed.model.module], [], []
    for c, real in enumerate((5, 3)):
        fed.model.load(ws[c])
        h = x[c]
        for i, child in enumerate(fed.model.module):        # each child's outputs, client by client
            h = child(h)
            outs[i].append(h)
        want.append(loss(fed.model.module, x[c, :real], y[c, :real], None))   # its real rows only
        ce.append(F.cross_entropy(fed.model.module(x[c, :real]), y[c, :real]))
    got = loss.layerwise(x, [torch.stack(o) for o in outs], y, mask)
    assert got.shape == (2,)
    assert torch.allclose(got, torch.stack(want), atol=1e-6)
    assert float((want[0] - ce[0]).detach()) > 1e-4                         # the penalty is in it
