"""Low-rank (lazy) dense layers of the batched executor: the identity W_s = W0 - lr sum_j G_j^T A_j
on a hand-checkable case; the same weights as the stacked batched path and the sequential executor
with uneven clients (padding), several epochs, shared and per-client starts; the rule that picks
lazy layers; the fallback for proximal/linear terms; divergence still reported."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mcfl.data import ClientData, load, write_store
from mcfl.engine import DeviceData, DivergenceError, FlatModel, LocalSpec, LocalTrainer, Task
from mcfl.executors import BatchedTrainer, LowRankLinear


def _store(tmp_path, sizes, shape, classes=3):
    rng = np.random.default_rng(0)
    clients = []
    for i, n in enumerate(sizes):
        x = rng.normal(size=(n, *shape)).astype(np.float32)
        clients.append(ClientData(f"c{i}", x, rng.integers(0, classes, n), x[:1], np.zeros(1, np.int64)))
    return load(write_store(tmp_path / "s", clients, n_classes=classes, source="test", params={}))


def _cnn():
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 3)))


@pytest.fixture
def spy(monkeypatch):
    """Records the lazy layers of every low-rank chunk and the shape of W0 each lazy layer got."""
    calls = {"lazy": [], "w0_dims": set()}
    chunk, forward = BatchedTrainer._train_chunk_lowrank, LowRankLinear.forward

    def spy_chunk(self, tasks, rnd, rows, mask, steps, active, lazy):
        calls["lazy"].append(list(lazy))
        return chunk(self, tasks, rnd, rows, mask, steps, active, lazy)

    def spy_forward(ctx, x, w0, b, hist, s):
        calls["w0_dims"].add(w0.dim())
        return forward(ctx, x, w0, b, hist, s)

    monkeypatch.setattr(BatchedTrainer, "_train_chunk_lowrank", spy_chunk)
    monkeypatch.setattr(LowRankLinear, "forward", staticmethod(spy_forward))
    return calls


def _results(trainer, tasks, rnd=3):
    return {t.client: (r.weights.clone(), r.loss, r.steps) for t, r in trainer.run(tasks, rnd)}


def _assert_same(a, b, rtol=1e-5):
    assert a.keys() == b.keys()
    for c in a:
        (wa, la, sa), (wb, lb, sb) = a[c], b[c]
        assert sa == sb, c
        assert float((wa - wb).abs().max()) <= rtol * float(wb.abs().max()), (c, (wa - wb).abs().max())
        assert la == pytest.approx(lb, abs=1e-5), c


def test_lazy_linear_identity_on_a_hand_checkable_case(tmp_path, spy):
    """One Linear layer, one client, 2 steps: W2 = W0 - lr (G1^T A1 + G2^T A2) with
    G_j = (softmax(A_j W_j^T + b_j) - onehot(y_j)) / B, computed here by hand."""
    data = _store(tmp_path, [4], (3,), classes=2)
    torch.manual_seed(1)
    fm = FlatModel(nn.Sequential(nn.Linear(3, 2)))
    spec, lr = LocalSpec(lr=0.5, batch_size=2), 0.5
    w0 = fm.get()
    trainer = BatchedTrainer(fm, DeviceData(data), spec, seed=0, lowrank=10)
    (_, res), = trainer.run([Task(0, w0)], rnd=1)
    assert spy["lazy"] == [[0]] and res.steps == 2

    W, b = w0[:6].view(2, 3).clone(), w0[6:].clone()
    W0, total = W.clone(), torch.zeros(2, 3)
    x, y = torch.tensor(data.x_train), torch.tensor(data.y_train)
    for rows in trainer.plan(0, 1):
        A, Y = x[rows], F.one_hot(y[rows], 2).float()
        G = (torch.softmax(A @ W.T + b, 1) - Y) / 2
        W, b = W - lr * G.T @ A, b - lr * G.sum(0)
        total += G.T @ A
    assert torch.allclose(res.weights[:6].view(2, 3), W0 - lr * total, atol=1e-6)
    assert torch.allclose(res.weights[6:], b, atol=1e-6)
    assert not torch.allclose(W, W0, atol=1e-3)                       # it did move


@pytest.mark.parametrize("spec", [LocalSpec(lr=0.2, batch_size=4, epochs=2),
                                  LocalSpec(lr=0.2, batch_size=3, steps=5)])
def test_lazy_path_equals_stacked_and_sequential(tmp_path, spy, spec):
    """Uneven clients (short padded batches, finished clients) over 2 epochs or 5 steps; two
    groups of starts (4 and 3 clients): chunks of 5 have per-client W0s, then one shared W0."""
    data = _store(tmp_path, [3, 7, 12, 5, 9, 1, 6], (1, 8, 8))
    fm, dev = _cnn(), DeviceData(data)
    w0 = fm.get()
    w1 = w0 + 0.01 * torch.linspace(-1, 1, len(w0))
    tasks = [Task(c, w0 if c % 2 else w1) for c in range(data.n_clients)]
    seq = _results(LocalTrainer(fm, dev, spec, seed=1), tasks)
    stacked = _results(BatchedTrainer(fm, dev, spec, seed=1, chunk=4, lowrank=0), tasks)
    assert spy["lazy"] == []                                           # lowrank=0: never lazy
    lazy = _results(BatchedTrainer(fm, dev, spec, seed=1, chunk=5, lowrank=10), tasks)
    assert spy["lazy"] == [[4, 6], [4, 6]] and spy["w0_dims"] == {2, 3}
    _assert_same(lazy, seq)
    _assert_same(stacked, seq)
    _assert_same(lazy, stacked)


def test_lazy_rule_and_fallback(tmp_path, spy):
    """A Linear layer is lazy iff history <= lowrank * min(in, out); a proximal or linear term in
    the chunk turns the low-rank path off (same results as sequential)."""
    data = _store(tmp_path, [3, 7, 12, 5], (1, 8, 8))
    fm, dev = _cnn(), DeviceData(data)
    spec = LocalSpec(lr=0.2, batch_size=4, epochs=2)
    tr = BatchedTrainer(fm, dev, spec, seed=1, chunk=4)                 # default LOWRANK = 0.5
    plain = [Task(c, fm.get()) for c in range(4)]
    assert tr._lazy_layers(plain, 16) == [4] and tr._lazy_layers(plain, 17) == []   # min(64, 32) = 32
    assert BatchedTrainer(fm, dev, spec, seed=1, lowrank=1)._lazy_layers(plain, 3) == [4, 6]
    w0 = fm.get()
    for extra in (dict(anchor=w0 + 0.1, mu=0.3), dict(linear=0.01 * torch.ones(fm.n_params))):
        tasks = [Task(c, w0, **(extra if c == 2 else {})) for c in range(4)]
        lazy = BatchedTrainer(fm, dev, spec, seed=1, chunk=4, lowrank=10)
        assert lazy._lazy_layers(tasks, 1) == []
        _assert_same(_results(lazy, tasks), _results(LocalTrainer(fm, dev, spec, seed=1), tasks))
    assert spy["lazy"] == []


def test_lazy_path_reports_divergence(tmp_path, spy):
    data = _store(tmp_path, [3, 7, 12, 5], (1, 8, 8))
    fm = _cnn()
    tr = BatchedTrainer(fm, DeviceData(data), LocalSpec(lr=1e38, batch_size=4, epochs=2), seed=1, lowrank=10)
    with pytest.raises(DivergenceError, match=r"round 7, client \d"):
        list(tr.run([Task(c, fm.get()) for c in range(4)], 7))
    assert spy["lazy"] == [[4, 6]]


def test_linear_on_unflattened_input_stays_regular(tmp_path, spy):
    """A Linear applied to (B, 2, 3) inputs (per-position features) is not low-rank; the one
    after Flatten is; the results still equal the sequential executor's."""
    data = _store(tmp_path, [5, 9, 2], (2, 3))
    torch.manual_seed(2)
    fm = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Flatten(), nn.Linear(8, 3)))
    dev, spec = DeviceData(data), LocalSpec(lr=0.3, batch_size=2, epochs=2)
    tr = BatchedTrainer(fm, dev, spec, seed=0, lowrank=10)
    assert tr._lazy == [3]
    tasks = [Task(c, fm.get()) for c in range(3)]
    _assert_same(_results(tr, tasks), _results(LocalTrainer(fm, dev, spec, seed=0), tasks))
    assert spy["lazy"] == [[3]]
