"""What a config costs before it runs, on this machine: training runs x rounds x seconds per round.

``mcfl check-config`` and the workflow's start print :func:`estimate`'s summary. For every run the
config makes (every seed, and the sweep points of a FedGSP block), the seconds it takes are

    init + rounds x (clients per round x local steps per client x seconds per local step)

(clients per round: ``clients_per_round``, or ``clients_per_cluster`` x K)
         + evaluations x (test samples x seconds per test sample + fine-tuning)

with the two per-step times measured here, in a second or two: a few SGD steps of the run's model
on a random batch of its batch size (after an untimed warm-up step), and a forward pass over a
batch of test inputs, on the device the config names (``device: auto``: the GPU when PyTorch sees
one) with one CPU thread, as each workflow job trains. ``init`` is the centre initialisation of the
clustered methods that need one (every client's first local model, one per centre file the runs
share; twice when those models do not fit in memory together and are trained again; once for all
the centre files that share them through the workflow's ``first_models`` job). Local steps per client are ``local_steps``, or ``local_epochs`` passes over a client's mean
number of training samples. Evaluations happen every ``eval_every`` rounds and after the last.
The batched executor trains a round's clients in one vectorised step: it is timed as one step on
their batches stacked (:func:`batched_group`).

The data sizes come from the prepared store when it exists, otherwise from the source
(:func:`mcfl.workload.data_size`: the LEAF JSON files' ``num_samples``, the embedded writers, or
the dataset's published size); the counting of steps and evaluations is :mod:`mcfl.workload`'s
too. Data preparation, process start-ups, reports
and the work a method adds to FedAvg's local training (FedDane's gradient pass, FedCG's graph,
FedGSP's grouping, K selection) are not counted: those runs take longer than estimated.
``benchmarks/study_cost.py`` times whole rounds of each run instead (slower; it prepares the data).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable

from mcfl.workload import DataSize, RunCost, data_size, evaluations, round_clients, run_cost, train_defaults

#: per-step time measurement: (model block, input shape, classes, batch size, device) ->
#: (seconds per local SGD step, seconds per test sample)
StepTimer = Callable[[dict, tuple, int, int, str], tuple[float, float]]


@dataclasses.dataclass
class Estimate:
    runs: list[RunCost]
    device: str
    sizes: dict[str, DataSize]

    @property
    def total_s(self) -> float:
        return sum(r.total_s for r in self.runs)

    def summary(self, cores: int | None = None, detail: bool = True) -> str:
        """Lines for a terminal: the total, per dataset and label (``detail``), and a hint when
        it is long."""
        if not self.runs:
            return "estimated cost: no training runs to do"
        rounds = sorted({r.rounds for r in self.runs})
        lines = [f"estimated cost on this machine ({self.device}, one thread a job): "
                 f"{len(self.runs)} training runs x {_span(rounds)} rounds = "
                 f"{duration(self.total_s)} of training, one job at a time"
                 + (f"; about {duration(self.total_s / cores)} on {cores} cores"
                    if cores and cores > 1 and len(self.runs) > 1 else "")]
        by: dict[tuple, list[RunCost]] = {}
        for r in (self.runs if detail else []):
            by.setdefault((r.dataset, r.label), []).append(r)
        for (d, label), rs in by.items():
            r = rs[0]
            lines.append(f"  {d:<12} {label:<14} {len(rs)} x ({r.rounds} rounds x {r.round_s:.2f} s"
                         f" + {r.evals} evaluations x {r.eval_s:.2f} s"
                         + (f" + init {r.init_s:.0f} s" if any(x.init_s for x in rs) else "")
                         + f") = {duration(sum(x.total_s for x in rs))}")
        for name, s in self.sizes.items():
            if detail and s.origin != "prepared store":
                lines.append(f"  ({name}: sizes from {s.origin}: {s.n_clients} clients, "
                             f"{s.n_train} training samples)")
        hint = self.hint()
        if hint:
            lines.append(hint)
        return "\n".join(lines)

    def hint(self) -> str:
        """Advice when the estimate exceeds an hour."""
        if self.total_s <= 3600:
            return ""
        longest = max(self.runs, key=lambda r: r.total_s)
        tips = [] if self.device.startswith("cuda") else [
            "a GPU (device: cuda) trains these models many times faster"]
        tips.append(f"fewer rounds, clients_per_round or local_epochs cut it in proportion "
                    f"(the longest run, {longest.dataset} {longest.label}, has {longest.rounds} rounds)")
        return "hint: over an hour; " + "; ".join(tips)


def _span(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def init_passes(n_clients: int, n_params: int) -> int:
    """Passes of local training over every client that the centre initialisation makes: one, or
    two when the clients' first local models do not fit in its memory budget together
    (:func:`mcfl.cluster.init.init_centres`' ``keep_bytes``: they are trained again)."""
    import inspect

    from mcfl.cluster.init import init_centres

    keep = inspect.signature(init_centres).parameters["keep_bytes"].default
    return 1 if n_clients * n_params * 4 <= keep else 2


def n_params(model: dict, size: DataSize) -> int:
    """The number of weights of a run's model (built on PyTorch's meta device: no memory)."""
    import torch

    from mcfl import models

    with torch.device("meta"):
        net = models.build(model["name"], tuple(size.x_shape), size.n_classes,
                           **{k: v for k, v in model.items() if k != "name"})
    return sum(p.numel() for p in net.parameters())


def estimate(cfg: dict, *, timer: StepTimer | None = None, sizes: dict[str, DataSize] | None = None,
             pending: bool = False) -> Estimate:
    """The cost of a validated config's runs on this machine (see the module docstring).
    ``pending``: only the runs not finished yet (no metrics.json in their run directory).
    ``timer`` and ``sizes`` replace the measurement and the data sizes (tests)."""
    from mcfl.cluster.spec import centre_key
    from mcfl.plan import Plan

    plan = Plan(cfg)
    device = _device(cfg.get("device", "auto"))
    timer = timer or measure_step
    sizes = dict(sizes or {})
    for name, ds in cfg["datasets"].items():
        if name not in sizes:
            sizes[name] = data_size(ds, Path(plan.store(name)), Path(plan.raw_store(name)))
    measured: dict[str, tuple[float, float]] = {}
    centres: set[tuple] = set()
    out = []
    for run in plan.runs.values():
        if pending and (Path(plan.dir_of(run)) / "metrics.json").exists():
            continue
        size = sizes[run["dataset"]]
        train = {**train_defaults(), **run["train"]}
        group = batched_group(train, size, run["params"])
        batch = int(train["batch_size"]) * group
        key = json.dumps([run["model"], size.x_shape, size.n_classes, batch], sort_keys=True)
        if key not in measured:
            step_s, sample_s = timer(run["model"], tuple(size.x_shape), size.n_classes, batch, device)
            measured[key] = (step_s / group, sample_s)
        init = 0
        if run.get("needs_centres"):
            ck = (run["dataset"], run["seed"], centre_key(run))
            first = plan.training.first_path(run)     # first local models made once for several files
            if first:
                init = int(first not in centres)
                centres.add(first)
            elif ck not in centres:
                init = init_passes(size.n_clients, n_params(run["model"], size))
            centres.add(ck)
        out.append(run_cost(run, size, *measured[key], init_passes=init))
    return Estimate(out, device, sizes)


#: the batched executor's steps are timed as one step of at most this many clients' batches ...
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
    values = int(train["batch_size"]) * math.prod(size.x_shape)
    return max(1, min(clients, BATCHED_GROUP, BATCHED_VALUES // max(1, values)))


def _device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device if (not device.startswith("cuda") or torch.cuda.is_available()) else "cpu"


def measure_step(model: dict, x_shape: tuple, n_classes: int, batch_size: int, device: str,
                 repeats: int = 3) -> tuple[float, float]:
    """Seconds per local SGD step on a random batch and seconds per test sample (forward pass),
    medians of ``repeats`` after one warm-up, with one CPU thread."""
    import torch

    from mcfl import models

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        net = models.build(model["name"], x_shape, n_classes,
                           **{k: v for k, v in model.items() if k != "name"}).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x = torch.rand((batch_size, *x_shape), generator=g).to(device)
        y = torch.randint(n_classes, (batch_size,), generator=g).to(device)

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()

        train = _timed(step, repeats, device)
        n = 64
        xt = torch.rand((n, *x_shape), generator=g).to(device)
        with torch.no_grad():
            test = _timed(lambda: net(xt), repeats, device) / n
        return train, test
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

    from mcfl import algorithms
    from mcfl.data import load
    from mcfl.evaluation import RoundCache, evaluate, evaluate_protocol, protocols
    from mcfl.federation import build_federation
    from mcfl.trainspec import TrainSpec

    data = load(store)
    cls = algorithms.get(run["method"])
    tcfg = TrainSpec.of(run["train"])                  # the schema's defaults, as `mcfl train` reads them
    fed = build_federation(data, run["model"], tcfg, run["seed"], torch.device(device))
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
    cache = RoundCache(algo, state, fed, r, active=clients)        # shared, as the runner does
    evaluate(algo, state, fed, finetune_epochs=tcfg.finetune_epochs, rnd=r, cache=cache)
    for proto in protocols(tcfg.eval_protocols).values():
        evaluate_protocol(proto, algo, state, fed, r, cache)
    eval_s = time.perf_counter() - t
    total_rounds = tcfg.rounds
    evals = evaluations(total_rounds, tcfg.eval_every)
    per_round = statistics.median(walls)
    return {"round_s": per_round, "eval_s": eval_s, "init_s": init_s,
            "run_s": init_s + total_rounds * per_round + evals * eval_s}
