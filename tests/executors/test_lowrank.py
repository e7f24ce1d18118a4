"""Low-rank (lazy) dense layers of the batched executor: the identity W_s = W0 - lr sum_j G_j^T A_j
on a hand-checkable case; the same weights as the stacked batched path and the sequential executor
with uneven clients (padding), several epochs, shared and per-client starts; the rule that picks
lazy layers; proximal (FeSEM, FedProx) and linear (FedDANE) terms on the low-rank path; the
automatic, logged choice of path for what it cannot take; divergence still reported."""

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
    """Records the lazy layers of every low-rank chunk and how many distinct W0 (start groups)
    and constant terms (W0, anchor, linear) each lazy layer got."""
    calls = {"lazy": [], "w0_groups": set(), "terms": set()}
    chunk, forward = BatchedTrainer._train_chunk_lowrank, LowRankLinear.forward

    def spy_chunk(self, tasks, rnd, rows, mask, steps, active, lazy):
        calls["lazy"].append(list(lazy))
        return chunk(self, tasks, rnd, rows, mask, steps, active, lazy)

    def spy_forward(ctx, x, b, hist, s):
        calls["w0_groups"].add(len(hist.terms[0][0]))
        calls["terms"].add(len(hist.terms))
        return forward(ctx, x, b, hist, s)

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
    assert spy["lazy"] == [[4, 6], [4, 6]] and spy["w0_groups"] == {2, 1}
    _assert_same(lazy, seq)
    _assert_same(stacked, seq)
    _assert_same(lazy, stacked)


def test_lazy_rule(tmp_path, spy):
    """A Linear layer is lazy iff history <= lowrank * min(in, out)."""
    data = _store(tmp_path, [3, 7, 12, 5], (1, 8, 8))
    fm, dev = _cnn(), DeviceData(data)
    spec = LocalSpec(lr=0.2, batch_size=4, epochs=2)
    tr = BatchedTrainer(fm, dev, spec, seed=1, chunk=4)                 # default LOWRANK = 0.5
    plain = [Task(c, fm.get()) for c in range(4)]
    assert tr._lazy_layers(plain, 16) == [4] and tr._lazy_layers(plain, 17) == []   # min(64, 32) = 32
    assert BatchedTrainer(fm, dev, spec, seed=1, lowrank=1)._lazy_layers(plain, 3) == [4, 6]
    w0 = fm.get()
    prox = [Task(c, w0, anchor=w0 + 0.1, mu=0.3, linear=0.01 * torch.ones(fm.n_params)) for c in range(4)]
    assert tr._lazy_layers(prox, 16) == [4]                             # terms do not turn it off


def _two_layer(tmp_path, sizes=(5, 9, 2, 7, 4)):
    data = _store(tmp_path, list(sizes), (2, 3))
    torch.manual_seed(3)
    fm = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)))
    return fm, DeviceData(data)


def _kinds(fm):
    """Task options: plain; proximal with the anchor the start (FedProx, FeSEM); proximal towards
    another anchor; per-client mu; a linear term (FedDANE); both terms; and a mixed chunk."""
    w0 = fm.get()
    anchor = w0 + 0.2 * torch.linspace(-1, 1, len(w0))
    lin = [0.05 * torch.linspace(1, -1, fm.n_params) * (c + 1) for c in range(5)]
    return {
        "plain": lambda c: dict(),
        "prox-anchor-is-start": lambda c: dict(anchor=w0, mu=0.4),
        "prox-other-anchor": lambda c: dict(anchor=anchor, mu=0.4),
        "per-client-mu": lambda c: dict(anchor=anchor if c % 2 else w0, mu=0.15 * c),
        "linear": lambda c: dict(linear=lin[c]),
        "prox-and-linear": lambda c: dict(anchor=anchor, mu=0.3, linear=lin[c]),
        "mixed": lambda c: [dict(), dict(anchor=w0, mu=0.5), dict(anchor=anchor, mu=0.2),
                            dict(linear=lin[c]), dict(anchor=anchor, mu=0.7, linear=lin[0])][c],
    }


@pytest.mark.parametrize("kind", ["plain", "prox-anchor-is-start", "prox-other-anchor", "per-client-mu",
                                  "linear", "prox-and-linear", "mixed"])
@pytest.mark.parametrize("spec", [LocalSpec(lr=0.3, batch_size=2, epochs=2),
                                  LocalSpec(lr=0.3, batch_size=3, steps=4)])
def test_lazy_path_with_proximal_and_linear_terms_equals_sequential(tmp_path, spy, kind, spec):
    """Both Linear layers lazy, a few steps of uneven clients: the low-rank path with proximal
    (anchor equal to and different from the start, per-client mu) and linear terms gives the
    sequential executor's weights; the proximal term really moves them."""
    fm, dev = _two_layer(tmp_path)
    w0 = fm.get()
    tasks = [Task(c, w0, **_kinds(fm)[kind](c)) for c in range(5)]
    seq = _results(LocalTrainer(fm, dev, spec, seed=2), tasks)
    lazy = _results(BatchedTrainer(fm, dev, spec, seed=2, chunk=5, lowrank=10), tasks)
    assert spy["lazy"] == [[1, 3]]
    _assert_same(lazy, seq)
    if kind != "plain":
        plain = _results(LocalTrainer(fm, dev, spec, seed=2), [Task(c, w0) for c in range(5)])
        assert max(float((plain[c][0] - seq[c][0]).abs().max()) for c in seq) > 1e-3


def test_lazy_terms_with_per_client_starts_and_several_chunks(tmp_path, spy):
    """FeSEM's case: clients start from and are pulled towards one of K centres; chunks of 2 mix
    centres; FedDANE's per-client linear terms on top."""
    fm, dev = _two_layer(tmp_path, (5, 9, 2, 7, 4, 6, 3))
    w0 = fm.get()
    centres = [w0 + 0.1 * k * torch.linspace(-1, 1, len(w0)) for k in range(3)]
    tasks = [Task(c, centres[c % 3], centres[c % 3], mu=0.3,
                  linear=0.02 * c * torch.ones(fm.n_params) if c % 2 else None) for c in range(7)]
    spec = LocalSpec(lr=0.25, batch_size=2, epochs=2)
    seq = _results(LocalTrainer(fm, dev, spec, seed=4), tasks)
    lazy = _results(BatchedTrainer(fm, dev, spec, seed=4, chunk=2, lowrank=10), tasks)
    assert len(spy["lazy"]) == 4 and spy["w0_groups"] >= {1} and spy["terms"] == {1, 2}
    _assert_same(lazy, seq)


def test_path_choice_is_automatic_and_logged_once(tmp_path, spy, caplog):
    """A client whose history is over the low-rank limit, or clipping, or a BatchNorm/dropout
    model: those clients train on the fallback path (here forced to ``sequential``; this tiny
    model's own choice on a CPU is ``stacked``), the others stay low-rank; the choice is logged
    once per trainer."""
    fm, dev = _two_layer(tmp_path, (2, 2, 20, 3))
    spec = LocalSpec(lr=0.3, batch_size=2, epochs=1)
    tasks = [Task(c, fm.get(), fm.get(), mu=0.2) for c in range(4)]
    seq = _results(LocalTrainer(fm, dev, spec, seed=0), tasks)
    assert BatchedTrainer(fm, dev, spec, seed=0, lowrank=1).fallback == "stacked"   # a tiny model
    tr = BatchedTrainer(fm, dev, spec, seed=0, lowrank=1, fallback="sequential")   # limit: 5 rows
    stacked = []
    orig = BatchedTrainer._train_chunk
    BatchedTrainer._train_chunk = lambda self, t, r, lowrank=True, *a: stacked.append(lowrank) or orig(self, t, r, lowrank, *a)
    try:
        with caplog.at_level("INFO", logger="mcfl"):
            for rnd in (3, 3):
                _assert_same(_results(tr, tasks), seq)
        assert stacked == [True, True] and spy["lazy"] == [[1], [1]]   # client 2: sequential
        msgs = [r.getMessage() for r in caplog.records if "low-rank path" in r.getMessage()]
        assert len(msgs) == 1 and "history" in msgs[0] and "sequential" in msgs[0] and "1 of 4" in msgs[0]
        stacked.clear()
        st = BatchedTrainer(fm, dev, spec, seed=0, lowrank=1, fallback="stacked")
        _assert_same(_results(st, tasks), seq)
        assert stacked == [True]          # the one slow client alone: sequential, not a stack of one
        stacked.clear()                                     # limit 2.5 rows: clients 2 and 3 slow
        _assert_same(_results(BatchedTrainer(fm, dev, spec, seed=0, lowrank=0.5, fallback="stacked"), tasks), seq)
        assert sorted(stacked) == [False, True]                              # two of them: stacked
        clipped = LocalSpec(lr=0.3, batch_size=2, epochs=1, max_grad_norm=0.1)
        stacked.clear()
        caplog.clear()
        with caplog.at_level("INFO", logger="mcfl"):
            _assert_same(_results(BatchedTrainer(fm, dev, clipped, seed=0, lowrank=10), tasks),
                         _results(LocalTrainer(fm, dev, clipped, seed=0), tasks))
        assert stacked == [False] and any("clipping" in r.getMessage() for r in caplog.records)
    finally:
        BatchedTrainer._train_chunk = orig
    torch.manual_seed(0)
    drop = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Dropout(0.5), nn.Linear(5, 3)))
    dt = BatchedTrainer(drop, dev, spec, seed=0, fallback="stacked")
    assert dt.fallback == "sequential" and dt._lazy == []
    with caplog.at_level("INFO", logger="mcfl"):
        list(dt.run([Task(c, drop.get()) for c in range(4)], 1))
    assert any("dropout" in r.getMessage() for r in caplog.records)


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
