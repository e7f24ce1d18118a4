"""Timing probes behind :mod:`mcfl.cost`'s estimate: a bounded SGD step of a run's model
(:func:`measure_step`), a job's process start-up (:func:`measure_startup`), and each method's round
and evaluation on a probe federation of random data (:func:`method_costs`); :func:`time_run` times
whole rounds of a run on its prepared data (``benchmarks/study_cost.py``)."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable

from mcfl import methods
from mcfl.cost import memory
from mcfl.cost.memory import F32, FULL_BATCH_SLACK, I64, _gb
from mcfl.cost.workload import DataSize, evaluations, local_steps, round_clients, train_defaults
from mcfl.data import load
from mcfl.data.store import ClientData
from mcfl.data.write import write_store
from mcfl.timing import LocalClock
from mcfl.trainspec import TrainSpec

#: per-step time measurement: (model block, input shape, classes, batch size, device) ->
#: (seconds per local SGD step, seconds per test sample)
StepTimer = Callable[[dict, tuple, int, int, str], tuple[float, float]]

BATCHED_GROUP = 32
#: ... and of at most this many input values (the measurement stays quick)
BATCHED_VALUES = 2_000_000


def batched_group(train: dict, size: DataSize, params: dict | None = None) -> int:
    """How many clients' local steps one timed step stands for: 1 for the sequential executor; for
    the batched one (all clients of a round in one vectorised step) the clients trained at once,
    approximated as one step on their batches stacked, up to :data:`BATCHED_GROUP` clients and
    :data:`BATCHED_VALUES` input values."""
    if train.get("executor") != "batched":
        return 1
    clients = min(round_clients({"train": train, "params": params or {}}, size.n_clients),
                  train.get("executor_chunk") or size.n_clients)
    values = step_rows(train, size) * math.prod(size.x_shape)
    return max(1, min(clients, BATCHED_GROUP, BATCHED_VALUES // max(1, values)))


def _device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device if (not device.startswith("cuda") or torch.cuda.is_available()) else "cpu"


#: the timed batch (the probe) is at most this many samples ...
PROBE_ROWS = 1024
#: ... and this many input values (8 MB of float32); a larger batch's step is scaled linearly
PROBE_VALUES = 2_000_000


def probe_rows(batch_size: int, x_shape: tuple) -> int:
    """The samples :func:`measure_step` times a step on for a batch of ``batch_size``: at most
    :data:`PROBE_ROWS` and :data:`PROBE_VALUES` input values, so that an estimate never allocates
    more than this probe whatever the config's ``batch_size``."""
    return max(1, min(int(batch_size), PROBE_ROWS, PROBE_VALUES // max(1, math.prod(x_shape))))


def step_rows(train: dict, size: DataSize) -> int:
    """The samples of a local step: ``batch_size``, or a client's whole training set (the mean
    client's) when that is smaller: a batch never holds more rows than its client has."""
    per_client = math.ceil(size.n_train / max(1, size.n_clients))
    return max(1, min(int(train["batch_size"]), per_client))


def batch_notes(dataset: str, train: dict, size: DataSize, rows: int, device: str) -> list[str]:
    """One line each for what a run's batch size asks of the data and the machine: a
    ``batch_size`` that ``mcfl train`` refuses (:func:`mcfl.cost.memory.check_run`: more than the
    largest client's samples), and a local step's batch plan and inputs that do not fit in the
    device's free memory."""
    B, out = int(train["batch_size"]), []
    if B > max(size.n_train, FULL_BATCH_SLACK):
        out.append(f"note: {dataset}: train.batch_size {B} is more than all {size.n_train} training "
                   f"samples together: `mcfl train` will refuse it (at most the largest client's "
                   f"samples, which is the full batch); estimated as the full batch")
    need = B * I64 + rows * (math.prod(size.x_shape) * F32 + I64)   # a client's batch plan, a batch
    free = memory.available_memory(device)
    if free is not None and need > free:
        out.append(f"note: {dataset}: a local step with train.batch_size {B} needs at least "
                   f"{_gb(need)} but {device} has {_gb(free)} free; lower train.batch_size")
    return out


def measure_step(model: dict, x_shape: tuple, n_classes: int, batch_size: int, device: str,
                 repeats: int = 3) -> tuple[float, float]:
    """Seconds per local SGD step on a random batch of ``batch_size`` samples and seconds per test
    sample (forward pass), medians of ``repeats`` after one warm-up, with one CPU thread. The step
    is timed on :func:`probe_rows` samples and scaled linearly to ``batch_size``."""
    import torch

    from mcfl import models      # deferred: PyTorch and the model zoo, for the timed step only

    rows = probe_rows(batch_size, x_shape)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        net = models.build(model["name"], x_shape, n_classes,
                           **{k: v for k, v in model.items() if k != "name"}).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x = torch.rand((rows, *x_shape), generator=g).to(device)
        y = torch.randint(n_classes, (rows,), generator=g).to(device)

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()

        train = _timed(step, repeats, device) * batch_size / rows
        n = 64
        xt = torch.rand((n, *x_shape), generator=g).to(device)
        with torch.no_grad():
            test = _timed(lambda: net(xt), repeats, device) / n
        return train, test
    finally:
        torch.set_num_threads(threads)


#: what a workflow job's process imports before it works (``mcfl train`` and its kin)
JOB_IMPORTS = "import torch, mcfl.cli.commands, mcfl.runner, mcfl.federation, mcfl.evaluation"


def measure_startup(imports: str = JOB_IMPORTS) -> float:
    """Seconds a workflow job's process takes to start: a fresh Python importing what ``mcfl
    train`` imports (PyTorch and the package), timed once here (0 when it cannot start)."""
    import subprocess
    import sys

    t = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-c", imports], check=True, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return 0.0
    return time.perf_counter() - t


#: the probe federation a method's round is timed on: this many clients (at least 2 K) ...
PROBE_CLIENTS = 6
#: ... of at most this many training samples each (two batches; the mean client's, if fewer) ...
PROBE_CLIENT_ROWS = 64
#: ... and timed over this many rounds after a warm-up one (their mean)
PROBE_ROUNDS = 2


@dataclasses.dataclass(frozen=True)
class MethodCost:
    """A method's round and evaluation beside a bare SGD step (:func:`method_costs`)."""
    local: float = 1.0              # seconds of its local step per bare SGD step (measure_step's)
    server_s: float = 0.0           # its server step's seconds per client of the round
    eval_s: float = 0.0             # seconds of its evaluation per client


def method_costs(runs: list[dict], size: DataSize, device: str,
                 timer: StepTimer | None = None) -> dict[str, MethodCost]:
    """What each run's method costs beside a bare SGD step of its model, timed here on one probe
    federation of random data of the dataset's shape (:data:`PROBE_CLIENTS` clients of two batches,
    every one in each round, with per-sample domains for the methods that read them): the rounds
    after a warm-up (:data:`PROBE_ROUNDS`) of the run's own method, network, executor and
    settings, split into local training (the trainer's time) and the rest, the server step; and
    one evaluation. Its local training per client-step, over :func:`measure_step`'s bare step on
    the same batch, is what the engine and the method add to SGD: the batch plan and the executor,
    FedCG's network with its domain branches, GCN and classifiers, FedDane's gradient pass,
    FedProx's proximal term. The
    server step (FedCG's adjacency and teacher, FedGSP's grouping, the clustered methods'
    assignments) and the evaluation are counted per client. Keyed by :func:`method_key`; a method
    that cannot run on the probe counts as FedAvg."""
    import tempfile

    timer = timer or measure_step
    keys = {method_key(r): r for r in runs}
    if not keys:
        return {}
    Ks = [int(r["params"]["K"]) for r in runs if isinstance(r["params"].get("K"), int)]
    rows = 2 * min(step_rows({**train_defaults(), **r["train"]}, size) for r in runs)
    with tempfile.TemporaryDirectory() as tmp:
        data = _probe_store(Path(tmp) / "probe", size, max(PROBE_CLIENTS, 2 * max(Ks, default=1)),
                            max(2, min(Ks, default=2)), rows)
        n, per_client = data.n_clients, int(data.n_train().max())
        fedavg: dict[str, tuple[float, float, float]] = {}
        out = {}
        for key, run in keys.items():
            base = {**run, "method": "FedAvg", "params": {}}
            bkey = method_key(base)
            if bkey not in fedavg:
                fedavg[bkey] = _time_method(base, data, device)
            train = {**train_defaults(), **run["train"]}
            group = n if train.get("executor") == "batched" else 1
            batch = min(int(train["batch_size"]), per_client)
            bare = timer(run["model"], tuple(size.x_shape), size.n_classes, batch * group, device)[0] / group
            try:
                own = _time_method(run, data, device) if run["method"] != "FedAvg" else fedavg[bkey]
            except Exception:  # noqa: BLE001 - a method that cannot run on random data: as FedAvg
                own = fedavg[bkey]
            steps = n * local_steps(TrainSpec.of(_probe_train(run, data)), per_client)
            out[key] = MethodCost(own[0] / max(steps * bare, 1e-12), own[1] / n, own[2] / n)
        return out


def method_key(run: dict) -> str:
    """What a run's probe timing depends on: its method, hyperparameters, model and train settings."""
    return json.dumps([run["dataset"], run["method"], run["params"], run["model"], run["train"]],
                      sort_keys=True, default=str)


def _probe_store(path: Path, size: DataSize, n_clients: int, n_domains: int, rows: int):
    """A store of random samples of ``size``'s shape and classes: ``n_clients`` clients of ``rows``
    training samples (at most :data:`PROBE_CLIENT_ROWS` and the mean client's), each sample in one
    of ``n_domains`` domains."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = max(2, min(rows, PROBE_CLIENT_ROWS, math.ceil(size.n_train / max(1, size.n_clients))))
    shape = tuple(size.x_shape)

    def part(n):
        return (rng.random((n, *shape), dtype=np.float32), rng.integers(size.n_classes, size=n),
                rng.integers(n_domains, size=n))

    clients = []
    for i in range(n_clients):
        (x, y, d), (xt, yt, dt) = part(rows), part(4)
        clients.append(ClientData(f"probe{i}", x, y, xt, yt, i % n_domains, d, dt))
    write_store(path, clients, n_classes=size.n_classes, source="probe", params={},
                domains={"names": [str(k) for k in range(n_domains)], "unseen": []})
    return load(path)


def _probe_train(run: dict, data) -> dict:
    """``run``'s train settings on the probe store ``data``: every client in each round, a batch
    of at most a client's samples (the batch a step has; a larger batch_size would only pad the
    batch plan)."""
    per_client = int(data.n_train().max())
    B = int({**train_defaults(), **run["train"]}["batch_size"])
    return {**run["train"], "clients_per_round": None, "clients_per_cluster": None,
            "batch_size": min(B, per_client)}


def _probe_centres(fed, K: int, folder: Path) -> Path:
    """A centre file of ``K`` random clients' first local models for the probe federation ``fed``
    (what the workflow's ``init_centres`` job gives a run; its k-means is the initialisation's cost)."""
    from mcfl.cluster.init import init_centres, save_centres     # deferred: PyTorch, for the probe's centres only

    path = folder / f"centres-{fed.model.size}-K{K}.pt"
    if not path.exists():
        save_centres(init_centres(fed, K, method="random"), path)
    return path


def _time_method(run: dict, data, device: str) -> tuple[float, float, float]:
    """Seconds of a round of ``run``'s method on the store ``data`` (every client; the mean of
    :data:`PROBE_ROUNDS` after a warm-up round) in local training and in the rest, and of one
    evaluation, with one CPU thread."""
    import torch

    from mcfl import evaluation, federation     # deferred: PyTorch, for the probe's rounds only

    cls = methods.get(run["method"])
    params = {k: (2 if v == "auto" else v) for k, v in run["params"].items()}
    if "restarts" in {f.name for f in dataclasses.fields(cls.Params)}:
        params["restarts"] = 1            # k-means' restarts are the initialisation's, counted apart
    train = TrainSpec.of(_probe_train(run, data))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fed = federation.build_federation(data, run["model"], train, 0, torch.device(device))
        if cls.uses_centres(params):
            fed.inputs["centres"] = _probe_centres(fed, int(params["K"]), Path(data.path).parent)
        algo = cls(fed, cls.Params(**params))
        state = algo.init()
        clock = LocalClock(algo.fed.trainer, fed.device)
        clients = fed.clients(1, algo.assignments(state) if fed.per_cluster else None)
        state, _ = algo.round(state, clients, 1)                     # warm-up
        clock.reset()
        t = time.perf_counter()
        for r in range(2, PROBE_ROUNDS + 2):      # a method's periodic server work (FedCG's teacher) too
            state, _ = algo.round(state, clients, r)
        clock.sync()
        round_s = (time.perf_counter() - t) / PROBE_ROUNDS
        local_s = clock.seconds / PROBE_ROUNDS
        t = time.perf_counter()
        evaluation.evaluate(algo, state, fed, finetune_epochs=train.finetune_epochs, rnd=PROBE_ROUNDS + 1)
        return local_s, max(0.0, round_s - local_s), time.perf_counter() - t
    finally:
        torch.set_num_threads(threads)


def _timed(fn, repeats: int, device: str) -> float:
    import torch

    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def time_run(run: dict, store, device: str, rounds: int = 2, warmup: int = 1) -> dict[str, float]:
    """A run's cost measured on its prepared ``store``: its initialisation, the median of ``rounds``
    training rounds after ``warmup`` untimed ones, and one evaluation with every named protocol,
    extrapolated to the run (``run_s`` = init + rounds x s/round + evaluations x s/eval).
    Slower than :func:`estimate` (it builds the federation and runs the method), and exact about
    what a method adds to local training. Used by ``benchmarks/study_cost.py``."""
    import torch

    from mcfl import evaluation, federation     # deferred: PyTorch, for the timed rounds only

    data = load(store)
    cls = methods.get(run["method"])
    tcfg = TrainSpec.of(run["train"])                  # the schema's defaults, as `mcfl train` reads them
    fed = federation.build_federation(data, run["model"], tcfg, run["seed"], torch.device(device))
    algo = cls(fed, cls.Params(**run["params"]))
    t = time.perf_counter()
    state = algo.init()
    init_s = time.perf_counter() - t
    walls = []
    for r in range(1, warmup + rounds + 1):
        t = time.perf_counter()
        clients = fed.clients(r, algo.assignments(state) if fed.per_cluster else None)
        state, _ = algo.round(state, clients, r)
        if r > warmup:
            walls.append(time.perf_counter() - t)
    r = warmup + rounds
    t = time.perf_counter()
    cache = evaluation.RoundCache(algo, state, fed, r, active=clients)        # shared, as the runner does
    evaluation.evaluate(algo, state, fed, finetune_epochs=tcfg.finetune_epochs, rnd=r, cache=cache)
    for proto in evaluation.protocols(tcfg.eval_protocols).values():
        evaluation.evaluate_protocol(proto, algo, state, fed, r, cache)
    eval_s = time.perf_counter() - t
    total_rounds = tcfg.rounds
    evals = evaluations(total_rounds, tcfg.eval_every)
    per_round = statistics.median(walls)
    return {"round_s": per_round, "eval_s": eval_s, "init_s": init_s,
            "run_s": init_s + total_rounds * per_round + evals * eval_s}
