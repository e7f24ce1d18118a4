"""The CUDA paths: the engine's step, the batched executor (stacked and low-rank) and every
algorithm's whole run on a GPU agree with the CPU. Skipped where CUDA is absent (CI); on a GPU
machine: ``CUBLAS_WORKSPACE_CONFIG=:4096:8 pytest tests/executors/test_cuda.py``.

TF32 is switched off inside these tests so that the GPU computes in float32 like the CPU and the
comparisons can be tight; training runs leave TF32 as PyTorch sets it (see the README)."""

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from conftest import interrupt_round, make_run, small_params
from mcfl import algorithms
from mcfl.data import ClientData, load, write_store
from mcfl.engine import DeviceData, FlatModel, LocalSpec, LocalTrainer, Task
from mcfl.executors import BatchedTrainer
from mcfl.federation import build_federation
from mcfl.runner import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def float32_matmuls():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_one_full_batch_step_on_cuda_matches_hand_computed_sgd(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 2)).astype(np.float32), rng.integers(0, 3, 6)
    write_store(tmp_path / "s", [ClientData("a", x, y, x[:2], y[:2])], n_classes=3, source="t",
                params={})
    torch.manual_seed(0)
    fm = FlatModel(nn.Linear(2, 3), CUDA)
    spec = LocalSpec(lr=0.5, batch_size=6, steps=1)
    tr = LocalTrainer(fm, DeviceData(load(tmp_path / "s"), CUDA), spec, 0)
    w0 = fm.get().cpu().double()
    W, b = w0[:6].view(3, 2), w0[6:9]
    X, Y = torch.from_numpy(x).double(), torch.from_numpy(y)
    p = torch.softmax(X @ W.T + b, 1)
    g = p - torch.nn.functional.one_hot(Y, 3).double()
    res = tr.train(Task(0, fm.get()), rnd=1)
    assert res.weights.device.type == "cuda"
    expect = torch.cat([(W - 0.5 * g.T @ X / 6).reshape(-1), b - 0.5 * g.mean(0)])
    assert torch.allclose(res.weights.cpu().double(), expect, atol=1e-6)


def _weights(trainer, tasks, rnd=2):
    return {t.client: r.weights.cpu() for t, r in trainer.run(tasks, rnd)}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[c] - b[c]).abs().max()) for c in a)


@pytest.mark.parametrize("kind", ["plain", "mixed"])
def test_batched_executor_on_cuda_equals_sequential_and_the_cpu(digits_store, kind):
    """Plain and mixed tasks (proximal, linear terms) take the low-rank path for the dense layers
    (forced here: ``lowrank`` high); with ``lowrank=0`` the stacked one. One local epoch of every
    client on the GPU with both executors, and on the CPU with the sequential one."""
    cfg = {"lr": 0.1, "rounds": 1, "local_epochs": 1, "batch_size": 5}
    feds = {d: build_federation(load(digits_store), {"name": "digits_cnn"}, cfg, seed=3, device=d)
            for d in ("cpu", "cuda")}
    P = feds["cpu"].model.n_params

    def tasks(fed):
        if kind == "plain":
            return [Task(c, fed.w0) for c in range(fed.n_clients)]
        dev = fed.w0.device
        anchor = fed.w0 + 0.05 * torch.linspace(-1, 1, fed.model.size, device=dev)
        linear = 0.02 * torch.linspace(1, -1, P, device=dev)
        kinds = [{}, {"anchor": anchor, "mu": 0.5}, {"linear": linear}]
        return [Task(c, fed.w0, **kinds[c % 3]) for c in range(fed.n_clients)]

    gpu = feds["cuda"]
    seq = _weights(gpu.trainer, tasks(gpu))
    bat = BatchedTrainer(gpu.model, gpu.dev, gpu.trainer.spec, gpu.seed, chunk=5, lowrank=1e9)
    assert bat._lazy_layers(tasks(gpu), 10**6) and bat.fallback == "stacked"
    assert _max_diff(seq, _weights(bat, tasks(gpu))) < 1e-5
    stacked = BatchedTrainer(gpu.model, gpu.dev, gpu.trainer.spec, gpu.seed, chunk=5, lowrank=0)
    assert _max_diff(seq, _weights(stacked, tasks(gpu))) < 1e-5
    assert _max_diff(seq, _weights(feds["cpu"].trainer, tasks(feds["cpu"]))) < 1e-4


@pytest.mark.parametrize("method", sorted(algorithms.ALGORITHMS))
def test_every_method_trains_on_cuda_like_on_the_cpu(method, digits_store, tmp_path):
    final = {}
    for device in ("cpu", "cuda"):
        run = make_run(method=method, params=small_params(method), rounds=2, clients_per_round=6,
                       eval_every=2, executor="batched")
        out = train(run, digits_store, tmp_path / device, device=device, progress=False)
        final[device] = out["final"]
    for key in ("micro_acc", "macro_acc"):
        assert final["cuda"][key] == pytest.approx(final["cpu"][key], abs=0.02), key


def test_a_cuda_run_repeats_bitwise(digits_store, tmp_path):
    """Deterministic kernels are requested on CUDA (``configure_torch``); the same seed must give
    the same predictions and the same loss history (all but the wall-clock ``*_s`` columns)."""
    files = {}
    for i in range(2):
        run = make_run(method="FeSEM", params={"K": 2, "restarts": 2}, rounds=3, executor="batched")
        train(run, digits_store, tmp_path / str(i), device="cuda", progress=False)
        files[i] = {f: (tmp_path / str(i) / f).read_bytes() for f in ("assignments.csv", "predictions.csv")}
        hist = pd.read_csv(tmp_path / str(i) / "history.csv")
        files[i]["history"] = hist.drop(columns=[c for c in hist.columns if c.endswith("_s")]).to_csv()
    assert files[0] == files[1]


@pytest.mark.parametrize("method", sorted(algorithms.ALGORITHMS))
@pytest.mark.parametrize("first, then", [("cpu", "cuda"), ("cuda", "cpu")])
def test_a_checkpoint_resumes_on_the_other_device(method, first, then, digits_store, tmp_path,
                                                  monkeypatch):
    """A run stopped on one device resumes on the other (a study moved between a GPU machine and
    a CPU): models load onto the new device, index tensors onto the CPU, and the run ends near the
    uninterrupted one. (Once NaiveGSP's fixed groups, loaded onto CUDA, failed on ``.numpy()``.)"""
    run = make_run(method=method, params=small_params(method), rounds=4, clients_per_round=6,
                   checkpoint_every=1, eval_every=2, executor="batched")
    full = train(run, digits_store, tmp_path / "full", device=first, progress=False)
    ck = tmp_path / "ck.pt"
    restore = interrupt_round(monkeypatch, method, 3)
    with pytest.raises(KeyboardInterrupt):
        train(run, digits_store, tmp_path / "resumed", device=first, checkpoint=ck, progress=False)
    restore()
    assert torch.load(ck, weights_only=True, map_location="cpu")["round"] == 2
    resumed = train(run, digits_store, tmp_path / "resumed", device=then, checkpoint=ck, progress=False)
    assert not ck.exists()                                    # it ran to the end from round 3
    for key in ("micro_acc", "macro_acc"):
        assert resumed["final"][key] == pytest.approx(full["final"][key], abs=0.02), key
