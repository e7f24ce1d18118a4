"""The local-update engine: flat views, one SGD step by hand, the proximal and linear terms,
LEAF batching, and per-(round, client) randomness."""

import numpy as np
import pytest
import torch
from torch import nn

from mcfl.data import load
from mcfl.engine import DeviceData, FlatModel, LocalSpec, LocalTrainer, Task


def _linear_setup(tmp_path, n=6, lr=0.1, **spec):
    """One client, a 2-feature linear model: small enough to differentiate by hand."""
    from mcfl.data import ClientData, write_store

    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2)).astype(np.float32)
    y = rng.integers(0, 3, n)
    write_store(tmp_path / "s", [ClientData("a", x, y, x[:2], y[:2])], n_classes=3, source="t", params={})
    d = load(tmp_path / "s")
    torch.manual_seed(0)
    fm = FlatModel(nn.Linear(2, 3))
    return fm, LocalTrainer(fm, DeviceData(d), LocalSpec(lr=lr, **spec), seed=0), x, y


def test_parameters_and_grads_are_views_of_the_flat_vectors(tmp_path):
    fm, tr, x, y = _linear_setup(tmp_path)
    w = torch.arange(fm.size, dtype=torch.float32)
    fm.load(w)
    assert torch.equal(fm.module.weight.detach().reshape(-1), w[:6])
    assert torch.equal(fm.module.bias.detach(), w[6:9])
    ptr = fm.grad.data_ptr()
    fm.module(torch.ones(1, 2)).sum().backward()
    assert fm.module.weight.grad.data_ptr() == ptr           # accumulated in place
    assert torch.equal(fm.grad[:6], torch.ones(6))            # d(sum Wx+b)/dW = x = 1


def test_one_full_batch_step_matches_hand_computed_sgd(tmp_path):
    fm, tr, x, y = _linear_setup(tmp_path, n=6, lr=0.5, batch_size=6, steps=1)
    w0 = fm.get()
    W, b = w0[:6].view(3, 2), w0[6:9]
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    p = torch.softmax(X @ W.T + b, 1)
    onehot = torch.nn.functional.one_hot(Y, 3).float()
    gW = (p - onehot).T @ X / 6                                # d mean CE / dW
    gb = (p - onehot).mean(0)
    res = tr.train(Task(0, w0), rnd=1)
    assert torch.allclose(res.weights[:6], (W - 0.5 * gW).reshape(-1), atol=1e-6)
    assert torch.allclose(res.weights[6:9], b - 0.5 * gb, atol=1e-6)
    assert res.steps == 1 and res.n_samples == 6


def test_proximal_term_adds_mu_times_distance_to_the_gradient(tmp_path):
    fm, tr, x, y = _linear_setup(tmp_path, n=6, lr=0.5, batch_size=6, steps=1)
    w0 = fm.get()
    anchor = w0 + torch.linspace(-1, 1, fm.size)
    plain = tr.train(Task(0, w0), rnd=1).weights
    mu = 0.3
    prox = tr.train(Task(0, w0, anchor=anchor, mu=mu), rnd=1).weights
    # w1 = w0 - lr (g + mu (w0 - anchor))  =>  prox - plain = -lr mu (w0 - anchor)
    assert torch.allclose(prox - plain, -0.5 * mu * (w0 - anchor), atol=1e-6)
    lin = torch.linspace(0, 1, fm.n_params)
    linear = tr.train(Task(0, w0, linear=lin), rnd=1).weights
    assert torch.allclose(linear - plain, -0.5 * lin, atol=1e-6)


def test_gradient_clipping_rescales_a_long_step_to_max_norm_and_leaves_a_short_one(tmp_path):
    fm, tr, x, y = _linear_setup(tmp_path, n=6, lr=0.5, batch_size=6, steps=1)
    w0 = fm.get()
    step = w0 - tr.train(Task(0, w0), rnd=1).weights                   # lr * g, unclipped
    norm = float(step.norm()) / 0.5
    clip = lambda c: LocalTrainer(fm, tr.data, LocalSpec(lr=0.5, batch_size=6, steps=1,
                                                         max_grad_norm=c), seed=0)
    # ||g|| > c: w1 = w0 - lr * c * g / ||g||  (a step of length lr * c, same direction)
    short = w0 - clip(norm / 4).train(Task(0, w0), rnd=1).weights
    assert torch.allclose(short, step / 4, atol=1e-6)
    assert float(short.norm()) == pytest.approx(0.5 * norm / 4, rel=1e-5)
    # ||g|| <= c: the factor is exactly 1, so the step is bitwise the unclipped one
    assert torch.equal(w0 - clip(norm * 2).train(Task(0, w0), rnd=1).weights, step)
    with pytest.raises(ValueError, match="max_grad_norm must be > 0"):
        LocalSpec(lr=0.5, max_grad_norm=0.0)


def test_leaf_batching_covers_each_epoch_and_counts_steps(tmp_path):
    fm, tr, x, y = _linear_setup(tmp_path, n=7, batch_size=3, epochs=2)
    batches = list(tr.batches(0, rnd=1))
    assert [len(b) for b in batches] == [3, 3, 1, 3, 3, 1]     # last batch short, 2 epochs
    assert sorted(torch.cat(batches[:3]).tolist()) == list(range(7))
    steps = list(tr.batches(0, rnd=1, spec=LocalSpec(lr=0.1, batch_size=3, steps=4)))
    assert [len(b) for b in steps] == [3, 3, 1, 3]
    assert [b.tolist() for b in tr.batches(0, 1)] == [b.tolist() for b in batches]   # seeded
    assert [b.tolist() for b in tr.batches(0, 2)] != [b.tolist() for b in batches]   # per round


def test_a_clients_update_does_not_depend_on_who_trained_before(digits_store):
    from mcfl.federation import build_federation

    fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                           {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 1}, seed=3)
    a = dict((t.client, r.weights) for t, r in fed.trainer.run([Task(c, fed.w0) for c in (0, 1, 2)], 1))
    b = dict((t.client, r.weights) for t, r in fed.trainer.run([Task(c, fed.w0) for c in (2, 0)], 1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])


def test_batchnorm_statistics_live_in_the_flat_vector():
    fm = FlatModel(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    assert fm.size == fm.n_params + 8                          # running mean and var
    before = fm.get()
    fm.module.train()
    fm.module(torch.randn(5, 3, 6, 6))
    assert not torch.equal(before[fm.n_params:], fm.flat[fm.n_params:])


def test_select_last_layer_is_the_final_weight_matrix():
    fm = FlatModel(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)))
    assert fm.select("last_layer") == fm.slices["2.weight"]
    assert fm.select("all") == slice(0, fm.n_params)
    with pytest.raises(ValueError, match="unknown parameter selection"):
        fm.select("first")
