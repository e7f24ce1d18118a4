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
share; twice when those models do not fit in memory together and are trained again). Local steps per client are ``local_steps``, or ``local_epochs`` passes over a client's mean
number of training samples. Evaluations happen every ``eval_every`` rounds and after the last.
The batched executor trains a round's clients in one vectorised step: it is timed as one step on
their batches stacked (:func:`batched_group`).

The data sizes come from the prepared store when it exists, otherwise from the source: the LEAF
JSON files' ``num_samples`` (source ``leaf_json``), the embedded writers (``femnist_sample``), or
the published size of the dataset (:data:`TYPICAL`). Data preparation, process start-ups, reports
and the work a method adds to FedAvg's local training (FedDane's gradient pass, FedCG's graph,
FedGSP's grouping, K selection) are not counted: those runs take longer than estimated.
``benchmarks/study_cost.py`` times whole rounds of each run instead (slower; it prepares the data).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
import time
from pathlib import Path
from typing import Callable

#: model -> (input shape, classes) of the data it was designed for (used before a store exists)
MODEL_SHAPES = {"femnist_cnn": ((1, 28, 28), 62), "celeba_cnn": ((3, 84, 84), 2),
                "digits_cnn": ((1, 8, 8), 10), "logreg": ((60,), 5)}

#: source -> (clients, training samples, test samples) as published, for a store not prepared yet:
#: LEAF's FEMNIST (3,550 writers, 805,263 images; LEAF's 90/10 split) and CelebA (9,343
#: celebrities, 200,288 images), sklearn's digits (1,797 images; the source's 80/20 default split)
#: and LEAF's synthetic generator (about 100 samples a client on average, 80/20)
TYPICAL = {"femnist": (3550, 724737, 80526), "celeba": (9343, 180259, 20029),
           "digits": (100, 1438, 359), "digits_domains": (20, 1348, 449),
           "synthetic": (100, 8000, 2000)}

#: per-step time measurement: (model block, input shape, classes, batch size, device) ->
#: (seconds per local SGD step, seconds per test sample)
StepTimer = Callable[[dict, tuple, int, int, str], tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class DataSize:
    """What the estimate needs to know of a dataset."""
    x_shape: tuple
    n_classes: int
    n_clients: int
    n_train: int            # training samples, all clients
    n_test: int             # test samples, all clients
    origin: str             # where the sizes come from ("prepared store", "LEAF JSON", ...)


@dataclasses.dataclass(frozen=True)
class RunCost:
    dataset: str
    label: str
    seed: int
    rounds: int
    round_s: float          # one round's local training
    evals: int
    eval_s: float           # one evaluation
    init_s: float           # centre initialisation charged to this run (0 if shared or none)

    @property
    def total_s(self) -> float:
        return self.init_s + self.rounds * self.round_s + self.evals * self.eval_s


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


def local_steps(train, n_per_client: float) -> int:
    """A client's local SGD steps in a round: ``local_steps``, or ``local_epochs`` passes over
    ``n_per_client`` samples in batches of ``batch_size``."""
    if train.local_steps:
        return int(train.local_steps)
    return int(train.local_epochs) * max(1, math.ceil(n_per_client / int(train.batch_size)))


def evaluations(rounds: int, every: int) -> int:
    """Evaluations of a run: every ``every`` rounds, and after the last."""
    return rounds // every + (rounds % every != 0)


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


def round_clients(run: dict, n_clients: int) -> int:
    """The clients a round of ``run`` trains: ``clients_per_cluster`` x K (at most every client)
    with per-cluster sampling, else ``clients_per_round`` (null: every client)."""
    train = run["train"]
    if train.get("clients_per_cluster"):
        K = run.get("params", {}).get("K")
        return min(int(train["clients_per_cluster"]) * (K if isinstance(K, int) else 1), n_clients)
    return min(train.get("clients_per_round") or n_clients, n_clients)


def run_cost(run: dict, size: DataSize, step_s: float, sample_s: float, *,
             init_passes: int = 0) -> RunCost:
    """One run's cost from the per-step times (the arithmetic of the module docstring);
    ``init_passes``: local trainings of every client charged to it for the centre initialisation."""
    from mcfl.trainspec import TrainSpec

    t = TrainSpec.of(run["train"])
    per_client = size.n_train / max(1, size.n_clients)
    steps = local_steps(t, per_client)
    clients = round_clients(run, size.n_clients)
    round_s = clients * steps * step_s
    finetune = int(t.finetune_epochs) * size.n_clients * max(1, math.ceil(per_client / int(t.batch_size)))
    eval_s = size.n_test * sample_s + finetune * step_s
    init_s = init_passes * size.n_clients * steps * step_s
    return RunCost(run["dataset"], run["label"], int(run["seed"]), int(t.rounds), round_s,
                   evaluations(int(t.rounds), int(t.eval_every)), eval_s, init_s)


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
        train = {**_train_defaults(), **run["train"]}
        group = batched_group(train, size, run["params"])
        batch = int(train["batch_size"]) * group
        key = json.dumps([run["model"], size.x_shape, size.n_classes, batch], sort_keys=True)
        if key not in measured:
            step_s, sample_s = timer(run["model"], tuple(size.x_shape), size.n_classes, batch, device)
            measured[key] = (step_s / group, sample_s)
        init = 0
        if run.get("needs_centres"):
            ck = (run["dataset"], run["seed"], centre_key(run))
            if ck not in centres:
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


def _train_defaults() -> dict:
    from mcfl.trainspec import read_schema

    props = read_schema()["$defs"]["train"]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


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


def data_size(ds: dict, store: Path, raw_store: Path) -> DataSize:
    """A dataset's shape and sizes: from its prepared store, else from its source (see module)."""
    from mcfl.config import n_clients

    model = ds["model"]["name"]
    shape, classes = MODEL_SHAPES.get(model, ((1, 28, 28), 10))
    prep = ds["prepare"]
    clients = n_clients(ds)
    for path in (store, raw_store):
        meta = _meta(path)
        if meta:
            m = int(meta["n_clients"])
            if path != store and clients:           # re-partitioned into this many clients
                m = clients
            return DataSize(tuple(meta["x_shape"]), int(meta["n_classes"]), m, int(meta["n_train"]),
                            int(meta["n_test"]), "prepared store")
    source = prep["source"]
    if source == "synthetic":
        shape, classes = (int(prep.get("dim", 60)),), int(prep.get("classes", 5))
    if source == "leaf_json":
        counts = _leaf_counts(Path(prep["dir"]))
        if counts:
            shape = tuple(prep.get("x_shape") or shape)
            return DataSize(shape, int(prep.get("n_classes") or classes), clients or counts[0],
                            counts[1], counts[2], "the LEAF JSON files")
    if source == "femnist_sample":
        import numpy as np

        from mcfl.data.femnist_sample import embedded_file

        with np.load(embedded_file(prep.get("run", "leaf-torch")), allow_pickle=False) as z:
            tr, te = z["offsets_train"], z["offsets_test"]
        return DataSize((1, 28, 28), 62, clients or len(tr) - 1, int(tr[-1]), int(te[-1]),
                        "the embedded writers")
    m, n_train, n_test = TYPICAL.get(source, (clients or 100, 100 * (clients or 100), 25 * (clients or 100)))
    if clients and source in ("femnist", "celeba"):        # a sample of the writers/celebrities
        n_train, n_test = n_train * clients // m, n_test * clients // m
    return DataSize(shape, classes, clients or m, n_train, n_test, f"the {source} dataset's published size")


def _meta(store: Path) -> dict | None:
    try:
        return json.loads((store / "meta.json").read_text())
    except (OSError, ValueError):
        return None


#: LEAF JSON folders larger than this are not scanned for their sizes (the check stays quick)
SCAN_BYTES = 512 << 20
_NUM_SAMPLES = re.compile(rb'"num_samples"\s*:\s*\[([^\]]*)\]')


def _leaf_counts(root: Path) -> tuple[int, int, int] | None:
    """(clients, training samples, test samples) from the ``num_samples`` lists of a LEAF data
    folder's train/ and test/ JSON files; None when absent or larger than :data:`SCAN_BYTES`."""
    files = {split: sorted((root / split).glob("*.json")) for split in ("train", "test")}
    if not files["train"] or sum(f.stat().st_size for fs in files.values() for f in fs) > SCAN_BYTES:
        return None
    out = {}
    for split, fs in files.items():
        counts = []
        for f in fs:
            m = _NUM_SAMPLES.search(f.read_bytes())
            if m:
                counts += [int(v) for v in m.group(1).split(b",") if v.strip()]
        out[split] = counts
    return len(out["train"]), sum(out["train"]), sum(out["test"])


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
