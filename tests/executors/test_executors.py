"""The batched executor gives the sequential executor's weights (up to float rounding) with
proximal and linear terms, uneven and tiny clients, epochs and steps, several chunks; it trains
BatchNorm models sequentially; the run's ``train.executor`` selects it; a whole FeSEM run matches."""

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from conftest import make_run, small_params
from mcfl.algorithms import ALGORITHMS
from mcfl.config import ConfigError, validate
from mcfl.data import ClientData, load, write_store
from mcfl.engine import DeviceData, DivergenceError, FlatModel, LocalSpec, LocalTrainer, Task
from mcfl.executors import STACKED_CPU_MACS, BatchedTrainer, forward_macs, make_trainer
from mcfl.federation import build_federation
from mcfl.runner import train
from mcfl.streams import FINETUNE


def _results(trainer, tasks, rnd=2):
    out = {}
    for task, res in trainer.run(tasks, rnd):
        assert task.client not in out                               # each task exactly once
        out[task.client] = (res.weights.clone(), res.loss, res.steps, res.n_samples)
    return out


def _assert_same(a, b, atol=2e-6):
    assert a.keys() == b.keys()
    for c in a:
        wa, la, sa, na = a[c]
        wb, lb, sb, nb = b[c]
        assert (sa, na) == (sb, nb), c
        assert torch.allclose(wa, wb, atol=atol, rtol=0), (c, (wa - wb).abs().max())
        assert la == pytest.approx(lb, abs=1e-5), c


def _mixed_tasks(fed, clients):
    """Plain, proximal (FeSEM/FedProx) and linear (FedDANE) tasks, and both terms together."""
    P = fed.model.n_params
    anchor = fed.w0 + 0.05 * torch.linspace(-1, 1, fed.model.size)
    linear = 0.02 * torch.linspace(1, -1, P)
    kinds = [dict(), dict(anchor=anchor, mu=0.5), dict(linear=linear),
             dict(anchor=anchor, mu=0.2, linear=linear)]
    return [Task(int(c), fed.w0, **kinds[i % 4]) for i, c in enumerate(clients)]


@pytest.mark.parametrize("train", [
    {"batch_size": 5, "local_epochs": 2},               # epochs: ragged steps across clients
    {"batch_size": 4, "local_steps": 7},                 # steps: wrap into a second epoch
])
def test_batched_equals_sequential_on_digits_cnn(digits_store, train):
    cfg = {"lr": 0.1, "rounds": 1, "local_epochs": 1, **train}
    fed = build_federation(load(digits_store), {"name": "digits_cnn"}, cfg, seed=3)
    assert len(set(fed.n_train.tolist())) > 3                       # uneven client sizes
    tasks = _mixed_tasks(fed, range(fed.n_clients))
    seq = _results(fed.trainer, tasks)
    # the stacked fallback for the clients whose history is too long for the low-rank path (all of
    # them with epochs here): the CPU default, sequential, would compare the sequential code with itself
    bat = _results(BatchedTrainer(fed.model, fed.dev, fed.trainer.spec, fed.seed, chunk=5, fallback="stacked"),
                   tasks)
    _assert_same(seq, bat)
    # the result does not depend on how the clients are chunked
    one = _results(BatchedTrainer(fed.model, fed.dev, fed.trainer.spec, fed.seed, chunk=64, fallback="stacked"),
                   tasks)
    _assert_same(bat, one)


def test_batched_clips_each_clients_gradient_like_sequential(digits_store):
    """max_grad_norm: the batched executor clips per client (and leaves its low-rank path, which
    never forms the full gradient); the clip binds on most steps here, so ignoring it would show."""
    cfg = {"lr": 0.1, "rounds": 1, "local_epochs": 1, "batch_size": 5, "max_grad_norm": 0.05}
    fed = build_federation(load(digits_store), {"name": "digits_cnn"}, cfg, seed=3)
    assert fed.trainer.spec.max_grad_norm == 0.05
    tasks = [Task(int(c), fed.w0) for c in range(fed.n_clients)]
    seq = _results(fed.trainer, tasks)
    bat = BatchedTrainer(fed.model, fed.dev, fed.trainer.spec, fed.seed, chunk=5, fallback="stacked")
    assert bat._lazy and not bat._lazy_layers(tasks, 10)           # low-rank path off when clipping
    _assert_same(seq, _results(bat, tasks))
    free = build_federation(load(digits_store), {"name": "digits_cnn"}, {**cfg, "max_grad_norm": None},
                            seed=3)
    unclipped = _results(free.trainer, tasks)
    assert max(float((unclipped[c][0] - seq[c][0]).abs().max()) for c in seq) > 1e-3


@pytest.mark.parametrize("fallback", ["stacked", "sequential"])
def test_run_takes_another_stream_and_number_of_epochs_like_train(digits_store, fallback):
    """Evaluation's fine-tuning: ``run(tasks, rnd, purpose, spec)`` trains every task on stream
    ``purpose`` for ``spec``'s epochs, as ``train`` does one task at a time: the sequential loop bit
    for bit, the batched executor (both of its paths) to float rounding."""
    cfg = {"lr": 0.1, "rounds": 1, "local_epochs": 1, "batch_size": 5}
    fed = build_federation(load(digits_store), {"name": "digits_cnn"}, cfg, seed=3)
    spec = LocalSpec(lr=0.1, batch_size=5, epochs=2)
    tasks = [Task(c, fed.w0) for c in range(fed.n_clients)]
    one = {t.client: fed.trainer.train(t, 4, FINETUNE, spec) for t in tasks}
    one = {c: (r.weights, r.loss, r.steps, r.n_samples) for c, r in one.items()}
    seq = {t.client: (r.weights.clone(), r.loss, r.steps, r.n_samples)
           for t, r in fed.trainer.run(tasks, 4, FINETUNE, spec)}
    _assert_same(one, seq, atol=0)
    bat = BatchedTrainer(fed.model, fed.dev, fed.trainer.spec, fed.seed, chunk=5, fallback=fallback)
    got = {t.client: (r.weights.clone(), r.loss, r.steps, r.n_samples)
           for t, r in bat.run(tasks, 4, FINETUNE, spec)}
    _assert_same(one, got)
    assert one[0][2] == 2 * -(-int(fed.n_train[0]) // 5)                 # two epochs, not the run's one
    plain = _results(fed.trainer, tasks, rnd=4)            # the run's own stream and epochs: other weights
    assert max(float((plain[c][0] - one[c][0]).abs().max()) for c in one) > 1e-3
    with pytest.raises(ValueError, match="epochs or steps only"):
        list(bat.run(tasks, 4, FINETUNE, LocalSpec(lr=0.5, batch_size=5, epochs=2)))


def _ragged_store(tmp_path, sizes=(1, 3, 7, 12, 4, 2)):
    rng = np.random.default_rng(0)
    clients = []
    for i, n in enumerate(sizes):
        x = rng.normal(size=(n, 2, 3)).astype(np.float32)
        clients.append(ClientData(f"c{i}", x, rng.integers(0, 3, n), x[:1], np.zeros(1, np.int64)))
    write_store(tmp_path / "ragged", clients, n_classes=3, source="test", params={})
    return load(tmp_path / "ragged")


@pytest.mark.parametrize("spec", [LocalSpec(lr=0.3, batch_size=4, epochs=3),
                                  LocalSpec(lr=0.3, batch_size=5, steps=4)])
def test_batched_equals_sequential_with_short_clients(tmp_path, spec):
    data = _ragged_store(tmp_path)
    torch.manual_seed(0)
    fm = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)))
    dev = DeviceData(data)
    w0 = fm.get()
    anchor = w0 + 0.3
    tasks = [Task(c, w0 + 0.01 * c, anchor, mu=0.4 * (c % 2)) for c in range(data.n_clients)]
    tasks[-1].mu = 0.0                                               # mu = 0 with an anchor: plain SGD
    seq = _results(LocalTrainer(fm, dev, spec, seed=1), tasks, rnd=5)
    bat = _results(BatchedTrainer(fm, dev, spec, seed=1, chunk=4), tasks, rnd=5)
    _assert_same(seq, bat)
    assert bat[0][2] == (3 if spec.steps is None else 4)            # one sample: batches of 1


def test_batched_executor_trains_batchnorm_sequentially_and_reports_divergence(digits_store, caplog):
    data = load(digits_store)
    dev = DeviceData(data)
    torch.manual_seed(0)
    bn = FlatModel(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                                 nn.Linear(4 * 6 * 6, 10)))
    spec = LocalSpec(lr=0.1, batch_size=5)
    tasks = [Task(c, bn.get()) for c in range(3)]
    seq = _results(LocalTrainer(bn, dev, spec, seed=0), tasks)
    bat = BatchedTrainer(bn, dev, spec, seed=0, fallback="stacked")
    assert bat.fallback == "sequential"                              # stacking cannot take BatchNorm
    with caplog.at_level("INFO", logger="mcfl"):
        _assert_same(seq, _results(bat, tasks), atol=0)
    assert any("BatchNorm" in r.getMessage() for r in caplog.records)
    fed = build_federation(data, {"name": "digits_cnn"}, {"lr": 1e6, "batch_size": 5, "local_epochs": 1,
                                                          "rounds": 1, "executor": "batched"}, seed=0)
    with pytest.raises(DivergenceError, match=r"round 4, client \d+"):
        list(fed.trainer.run([Task(c, fed.w0) for c in range(4)], 4))


def test_the_fallback_path_is_logged_once_per_run_not_every_round(digits_store, caplog):
    """Clipping keeps every client off the low-rank path: the log says so in the first round only
    (a 300-round FEMNIST run logged it 300 times before)."""
    data = load(digits_store)
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    bat = BatchedTrainer(model, DeviceData(data), LocalSpec(lr=0.1, batch_size=5, max_grad_norm=1.0), seed=0)
    with caplog.at_level("INFO", logger="mcfl"):
        for rnd in (1, 2, 3):
            list(bat.run([Task(c, model.get()) for c in range(3)], rnd))
    said = [r.getMessage() for r in caplog.records if "cannot take the low-rank path" in r.getMessage()]
    assert len(said) == 1 and "first in round 1: 3 of 3 clients" in said[0] and "clipping" in said[0]


class _Scaled(nn.Module):
    """A tiny MLP with a constant float buffer (like FedCG's adjacency): a training forward never
    writes it, so the batched executor may stack the model."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 0.5]))

    def forward(self, x):
        return self.net(x) * self.scale


class _CountingLoss:
    """Cross-entropy over the real rows plus 0.1 x the mean squared logit, with diagnostics
    [rows seen, sum of CE]: a batchable custom loss."""

    batchable = True

    def __call__(self, module, x, y, rows, mask=None):
        logits = module(x)
        m = torch.ones(len(y)) if mask is None else mask
        n = m.sum().clamp(min=1)
        ce = torch.nn.functional.cross_entropy(logits, y, reduction="none")
        loss = (ce * m).sum() / n + 0.1 * (logits.pow(2).mean(1) * m).sum() / n
        return loss, torch.stack([m.sum(), (ce * m).sum()]).detach()


@pytest.mark.parametrize("spec", [LocalSpec(lr=0.3, batch_size=4, epochs=2),
                                  LocalSpec(lr=0.3, batch_size=5, steps=3, max_grad_norm=0.5)])
def test_batchable_custom_loss_with_a_constant_buffer_stacks_like_sequential(tmp_path, spec):
    """A ``batchable`` Task.loss trains on the stacked path (no per-client ``train``), over padded
    batches, to the sequential weights; its diagnostics add up over the steps: the rows seen are
    exactly the epochs x the client's samples (or steps x batch, at most, with a short last batch);
    the buffer comes back unchanged in every result. A call with one client takes the sequential
    loop: bit for bit the sequential executor's."""
    data = _ragged_store(tmp_path)
    torch.manual_seed(0)
    fm = FlatModel(_Scaled())
    assert fm.size == fm.n_params + 3
    dev = DeviceData(data)
    w0 = fm.get()
    loss = _CountingLoss()
    tasks = [Task(c, w0, loss=loss) for c in range(data.n_clients)]
    seq = {t.client: r for t, r in LocalTrainer(fm, dev, spec, seed=1).run(tasks, 5)}
    bat_trainer = BatchedTrainer(fm, dev, spec, seed=1, chunk=4, fallback="stacked")
    assert bat_trainer._unsupported is None
    bat_trainer.train = None                           # the stacked path never trains one client
    bat = {t.client: r for t, r in bat_trainer.run(tasks, 5)}
    for c, n in enumerate(dev.n_train.tolist()):
        assert torch.allclose(seq[c].weights, bat[c].weights, atol=2e-6, rtol=0), c
        assert torch.equal(bat[c].weights[fm.n_params:], w0[fm.n_params:])
        assert seq[c].loss == pytest.approx(bat[c].loss, abs=1e-5)
        assert torch.allclose(seq[c].aux, bat[c].aux, atol=1e-4)
        seen = int(n) * spec.epochs if spec.steps is None else None
        if seen is not None:
            assert float(bat[c].aux[0]) == seen, c
    lone = BatchedTrainer(fm, dev, spec, seed=1, chunk=4, fallback="stacked")
    lone._run_chunks = None                     # a call with one client never takes the stacked path
    [(_, r)] = list(lone.run(tasks[:1], 5))
    assert torch.equal(r.weights, seq[0].weights) and torch.equal(r.aux, seq[0].aux)


def test_a_sequential_model_with_a_constant_buffer_keeps_it_off_the_low_rank_path(tmp_path):
    """The low-rank path writes parameters only: a model with a float buffer trains stacked, and
    every result is the whole flat vector (parameters, then the buffer as it started)."""
    data = _ragged_store(tmp_path)
    torch.manual_seed(0)
    seq_model = nn.Sequential(nn.Flatten(), nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    seq_model.register_buffer("offset", torch.tensor([0.5, -1.0]))
    fm = FlatModel(seq_model)
    # history 1 x 2 rows <= 0.5 x min(6, 16): without the buffer the first layer would go low-rank
    dev, spec = DeviceData(data), LocalSpec(lr=0.3, batch_size=1, steps=2)
    plain = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)))
    assert BatchedTrainer(plain, dev, spec, seed=1)._lazy_layers([Task(0, plain.get())], 2)
    tasks = [Task(c, fm.get()) for c in range(data.n_clients)]
    bat = BatchedTrainer(fm, dev, spec, seed=1, fallback="stacked")
    assert bat._lazy == [] and "float buffers" in bat._why_slow()
    seq = _results(LocalTrainer(fm, dev, spec, seed=1), tasks)
    out = _results(bat, tasks)
    assert all(len(w) == fm.size for w, *_ in out.values())
    _assert_same(seq, out)


def test_forward_macs_by_hand():
    """Conv2d(1->4, 3x3, padding 1) on 1x5x5: 4 x 5 x 5 outputs x (1 x 9) = 900; grouped
    Conv2d(4->4, 3x3, groups 2, no padding): 4 x 3 x 3 x (2 x 9) = 648; Linear(36 -> 7): 252."""
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, groups=2),
                        nn.Flatten(), nn.Linear(36, 7))
    assert forward_macs(net, torch.zeros(1, 1, 5, 5)) == 900 + 648 + 252
    assert not any(m._forward_hooks for m in net.modules())          # the probe leaves no hooks


def test_cpu_fallback_is_stacked_for_small_models_only(digits_store, tmp_path):
    """On a CPU the fallback is the stacked path when a forward pass costs at most
    STACKED_CPU_MACS multiply-adds per sample (the 8x8 digits CNN: 92K), sequential above it (the
    FEMNIST CNN, hidden 248: 11.5M on a 1x28x28 image); an explicit fallback wins."""
    from mcfl.models import build

    data = load(digits_store)
    dev = DeviceData(data)
    spec = LocalSpec(lr=0.1, batch_size=5)
    small = FlatModel(build("digits_cnn", (1, 8, 8), 10))
    assert forward_macs(small.module, torch.zeros(1, 1, 8, 8)) <= STACKED_CPU_MACS
    assert BatchedTrainer(small, dev, spec, seed=0).fallback == "stacked"
    assert BatchedTrainer(small, dev, spec, seed=0, fallback="sequential").fallback == "sequential"
    img = np.zeros((4, 1, 28, 28), np.float32)
    write_store(tmp_path / "big", [ClientData("w0", img, np.arange(4), img, np.arange(4))],
                n_classes=62, source="test", params={})
    femnist = FlatModel(build("femnist_cnn", (1, 28, 28), 62, hidden=248))
    assert forward_macs(femnist.module, torch.zeros(1, 1, 28, 28)) > STACKED_CPU_MACS
    assert BatchedTrainer(femnist, DeviceData(load(tmp_path / "big")), spec, seed=0).fallback == "sequential"


def test_train_executor_key_selects_and_validates(digits_store):
    data = load(digits_store)
    base = {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 1}
    assert type(build_federation(data, {"name": "digits_cnn"}, base, 0).trainer) is LocalTrainer
    fed = build_federation(data, {"name": "digits_cnn"}, {**base, "executor": "batched",
                                                          "executor_chunk": 3}, 0)
    assert isinstance(fed.trainer, BatchedTrainer) and fed.trainer.chunk == 3
    with pytest.raises(ValueError, match="unknown executor 'vmap'"):
        make_trainer("vmap", fed.model, fed.dev, fed.trainer.spec, 0)
    cfg = {"datasets": {"d": {"prepare": {"source": "digits"}, "model": {"name": "digits_cnn"},
                              "train": {"executor": "gpu"}}}, "methods": [{"method": "FedAvg"}]}
    with pytest.raises(ConfigError, match="datasets.d.train.executor"):
        validate(cfg)


def test_fesem_run_with_batched_executor_matches_sequential(digits_store):
    """Initial k-means centres and two FeSEM rounds: same assignments, centres up to rounding."""
    from mcfl.algorithms.fesem import FeSEM, Params

    data = load(digits_store)
    out = {}
    for ex in ("sequential", "batched"):
        fed = build_federation(data, {"name": "digits_cnn"}, {"lr": 0.05, "batch_size": 5, "local_epochs": 1,
                                                              "rounds": 2, "executor": ex}, seed=1)
        algo = FeSEM(fed, Params(K=3, restarts=3))
        state = algo.init()
        for r in (1, 2):
            state, _ = algo.round(state, fed.clients(r), r)
        out[ex] = state
    assert torch.equal(out["sequential"].assign, out["batched"].assign)
    assert torch.allclose(out["sequential"].centres, out["batched"].centres, atol=1e-5, rtol=0)


#: methods whose local updates never reach the batched arithmetic: updates through
#: ``trainer.train`` (FedSGD's one step) take the sequential code under either executor, so their
#: results are bitwise equal. (The GSP methods' chained groups go through ``run``, one call per
#: position in the chains.)
SEQUENTIAL_UPDATES = {"FedSGD"}
#: a batchable custom loss without a layerwise form (FedCG's): no low-rank path, always stacked
#: (FedCG with small domain classifiers and GCN projection, so that the CPU fallback is the stacked
#: path). FedMMD's penalty has a layerwise form and FedFusion's frozen extractor needs no custom
#: loss: both take the low-rank path like FedAvg.
STACKED_ONLY = {"FedCG"}
#: FedMMD's Gaussian kernels, exp(-d²/b) with the bandwidth b itself a mean of d², amplify the
#: stacked path's float32 rounding (seen: 1.2e-6 after 8 steps; in float64 its masked estimate
#: equals the plain one to 1e-16, test_fedmmd)
ATOL = {"FedMMD": 5e-6}
#: FedMMD's penalty also makes the two paths' rounding differences larger (5e-7 against FedAvg's 2e-8
#: after 2 rounds of 2-3 steps), enough to reach a ReLU/max-pool near-tie sooner: on a 2-core Intel
#: Xeon (AVX512) the 4th step of round 2 jumped to 3.7e-4 on 770 weights (5e-7 one step before; on
#: the AMD EPYC it did not). 2 steps still train against a real penalty (step 1 starts at local =
#: global, where the MMD and its gradient are 0).
STEPS = {"FedMMD": 2}


@pytest.mark.parametrize("method,path", [(m, "lowrank") for m in sorted(ALGORITHMS)]
                         + [(m, "stacked") for m in sorted(set(ALGORITHMS) - SEQUENTIAL_UPDATES)])
def test_every_method_runs_with_the_batched_executor(method, path, digits_store, tmp_path, monkeypatch):
    """Each algorithm trains through ``run`` and ``train`` with either executor to the same final
    state: integer fields (assignments, counters) equal, float tensors (models, centres, server
    moments) equal up to float rounding (seen: <= 1.2e-7 on weights of size ~0.3), on the batched
    executor's low-rank path (4 local steps keep the first dense layer's history short enough) and
    on its stacked path. (Longer local updates can cross a ReLU/max-pool kink at a near-tie, where a
    rounding difference changes the subgradient: FedDANE with a full epoch moved one conv filter
    by 1.4e-4 at its 15th step; hence the short updates.)"""
    import mcfl.executors
    import mcfl.federation
    import mcfl.runner

    if path == "stacked":             # what a GPU runs: no low-rank layers, the stacked fallback
        monkeypatch.setattr(mcfl.federation, "make_trainer", lambda ex, *a, chunk=None: (
            BatchedTrainer(*a, chunk=chunk, lowrank=0, fallback="stacked") if ex == "batched"
            else mcfl.executors.make_trainer(ex, *a, chunk=chunk)))
    chunks = []
    train_chunk = BatchedTrainer._train_chunk
    monkeypatch.setattr(BatchedTrainer, "_train_chunk", lambda self, tasks, rnd, lowrank=True, *a: (
        chunks.append(lowrank), train_chunk(self, tasks, rnd, lowrank, *a))[1])
    states = {}
    write_state = mcfl.runner._write_state
    monkeypatch.setattr(mcfl.runner, "_write_state", lambda file, algo, state: (
        states.__setitem__(file.parent.name, algo.state_dict(state)), write_state(file, algo, state)))
    final, pred = {}, {}
    for ex in ("sequential", "batched"):
        run = make_run(method=method, params=small_params(method), rounds=2,
                       clients_per_round=6,
                       eval_every=2, executor=ex, local_steps=STEPS.get(method, 4))
        final[ex] = train(run, digits_store, tmp_path / ex, progress=False)["final"]
        pred[ex] = pd.read_csv(tmp_path / ex / "predictions.csv")["pred"]
    assert set(chunks) == (set() if method in SEQUENTIAL_UPDATES else
                           {False} if method in STACKED_ONLY else {path == "lowrank"})
    atol = 0 if method in SEQUENTIAL_UPDATES else ATOL.get(method, 1e-6)
    seq, bat = states["sequential"], states["batched"]
    assert seq.keys() == bat.keys() and seq
    for key, a in seq.items():
        a, b = torch.as_tensor(a), torch.as_tensor(bat[key])
        if a.is_floating_point():
            assert torch.allclose(a, b, rtol=0, atol=atol), (key, float((a - b).abs().max()))
        else:
            assert torch.equal(a, b), key
    assert pred["sequential"].equals(pred["batched"])
    assert final["batched"]["train_loss"] == pytest.approx(final["sequential"]["train_loss"], rel=1e-6, abs=0)


def test_feddane_round_with_batched_executor_matches_sequential(digits_store):
    """FedDANE keeps its step-1 gradients under ``batched`` (which holds the tasks anyway) and
    recomputes them under ``sequential``: the same round either way, up to float rounding."""
    from mcfl.algorithms.fedavg import FedAvg
    from mcfl.algorithms.feddane import FedDANE, Params

    out = {}
    for ex in ("sequential", "batched"):
        fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                               {"lr": 0.05, "batch_size": 5, "local_epochs": 1, "rounds": 1, "executor": ex},
                               seed=2)
        calls = []
        grad = fed.trainer.gradient
        fed.trainer.gradient = lambda *a, calls=calls, grad=grad, **k: calls.append(1) or grad(*a, **k)
        clients = fed.clients(1)[:5]
        out[ex] = (FedDANE(fed, Params(mu=0.2)).round(FedAvg(fed, None).init(), clients, 1)[0].w, len(calls))
    assert out["sequential"][1] == 10 and out["batched"][1] == 5
    assert torch.allclose(out["sequential"][0], out["batched"][0], atol=1e-5, rtol=0)
