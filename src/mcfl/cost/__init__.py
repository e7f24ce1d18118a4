"""What a run and a config cost, in one place: a run's counts and time arithmetic
(:mod:`mcfl.cost.workload`: local steps, clients of a round, evaluations, a dataset's sizes, a
model's weights and multiply-adds, nothing measured), the memory it needs against what the machine
has free (:mod:`mcfl.cost.memory`, checked by ``mcfl train``), the timings measured on a bounded
probe (:mod:`mcfl.cost.probe`), and, here, what a config costs before it runs on this machine: its
jobs, packed on the cores.

``mcfl check-config`` prints :func:`estimate`'s summary for every run of a config (as from an empty
results folder); the workflow prints it at its start for the jobs Snakemake will actually run (its
DAG's jobs that need to run: changed parameters, code or inputs rerun a job, as Snakemake decides).
For every run (every seed, and the sweep points of a FedGSP block) the seconds it takes are

    init + rounds x (local x clients per round x local steps per client x seconds per local step
                     + server x clients per round)
         + evaluations x max(test samples x seconds per test sample + fine-tuning, evaluation x clients)

(clients per round: ``clients_per_round``, or ``clients_per_cluster`` x K). Seconds per local step
and per test sample are measured here on a bounded probe (:func:`~mcfl.cost.probe.measure_step`): a few SGD steps of
the run's model on a random batch of the samples a step has (``batch_size``, or a client's whole
training set when smaller), at most :data:`PROBE_ROWS` samples and :data:`PROBE_VALUES` input values
(a larger batch's step is scaled linearly), after an untimed warm-up, on the device the config names
(``device: auto``: the GPU when PyTorch sees one) with one CPU thread, as each workflow job trains.
A batch size that ``mcfl train`` would refuse, or whose batch does not fit in free memory, gets one
note line. ``local``, ``server`` and ``evaluation`` are each method's (:func:`~mcfl.cost.probe.method_costs`): a few
rounds and one evaluation of the run's own method, network, executor and settings timed on a probe
federation of random data, so what a method adds to a bare SGD step counts (the executor's batch
plan, FedCG's network and server step, FedGSP's grouping, FedDane's gradient pass). ``init`` is the
centre initialisation of the clustered methods that need one (every client's first local model, one
per centre file the runs share; twice when those models do not fit in memory together and are
trained again; once for all the centre files that share them through the workflow's
``first_models`` job). Local steps per client are ``local_steps``, or ``local_epochs`` passes over a
client's mean number of training samples. Evaluations happen every ``eval_every`` rounds and after
the last. The batched executor trains a round's clients in one vectorised step: it is timed as one
step on their batches stacked (:func:`~mcfl.cost.probe.batched_group`).

The runs, their centre files and first local models are jobs, each with a process start-up
(:func:`~mcfl.cost.probe.measure_startup`); :func:`makespan` packs them on the cores in the order they wait for each
other (a centre file before its runs), as Snakemake's priorities start them, with the DAG's other
jobs (data, reports) at a start-up each.
The probes' timings are kept per machine (:mod:`mcfl.cost.probe_cache`): an invocation probes only
what no earlier one on this machine, with this code, has.

The data sizes come from the prepared store when it exists, otherwise from the source
(:func:`mcfl.cost.workload.data_size`: the LEAF JSON files' ``num_samples``, the embedded writers, or
the dataset's published size); the counting of steps and evaluations is :mod:`mcfl.cost.workload`'s
too. Data preparation's own work, reports' and K selection's are not counted beyond a start-up.
``benchmarks/estimate_accuracy.py`` sets the estimate beside the DAG's measured time;
``benchmarks/study_cost.py`` times whole rounds of each run instead (slower; it prepares the data).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from mcfl.cluster.spec import KEEP_BYTES
from mcfl.cost.probe import (JOB_IMPORTS, MethodCost, StepTimer, _device, batch_notes, batched_group,
                         measure_startup, measure_step, method_costs, method_key, step_rows)
from mcfl.cost.probe_cache import ProbeCache
from mcfl.cost.workload import DataSize, RunCost, data_size, round_clients, run_cost, train_defaults



@dataclasses.dataclass
class Estimate:
    runs: list[RunCost]
    device: str
    sizes: dict[str, DataSize]
    notes: list[str] = dataclasses.field(default_factory=list)   # what the machine cannot do
    jobs: list[Job] = dataclasses.field(default_factory=list)    # to pack on the cores (makespan)
    start_s: float = 0.0            # a job's process start-up, in each job's seconds
    scope: str = "every run"        # which runs are counted

    @property
    def total_s(self) -> float:
        return sum(r.total_s for r in self.runs)

    def summary(self, cores: int | None = None, detail: bool = True) -> str:
        """Lines for a terminal: the total, per dataset and label (``detail``), and a hint when
        it is long."""
        if not self.runs:
            return "\n".join(["estimated cost: no training runs to do", *self.notes])
        rounds = sorted({r.rounds for r in self.runs})
        lines = [f"estimated cost on this machine ({self.device}, one thread a job) of {self.scope}: "
                 f"{len(self.runs)} training runs x {_span(rounds)} rounds = "
                 f"{duration(self.total_s)} of training, one job at a time"
                 + (f"; about {duration(self.wall_s(cores))} on {cores} cores ({len(self.jobs)} jobs "
                    f"in the order they wait for each other, {self.start_s:.0f} s to start each)"
                    if cores and self.jobs else "")]
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
        lines += self.notes
        hint = self.hint()
        if hint:
            lines.append(hint)
        return "\n".join(lines)

    def wall_s(self, cores: int) -> float:
        """Seconds the jobs take on ``cores`` cores, start-ups included (:func:`makespan`)."""
        return makespan(self.jobs, cores)

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
    (:data:`mcfl.cluster.spec.KEEP_BYTES`: they are trained again)."""
    return 1 if n_clients * n_params * 4 <= KEEP_BYTES else 2


def n_params(model: dict, size: DataSize) -> int:
    """The number of weights of a run's model (built on PyTorch's meta device: no memory)."""
    import torch

    from mcfl import models      # deferred: PyTorch and the model zoo, for this count only

    with torch.device("meta"):
        net = models.build(model["name"], tuple(size.x_shape), size.n_classes,
                           **{k: v for k, v in model.items() if k != "name"})
    return sum(p.numel() for p in net.parameters())


#: one job of Snakemake's DAG as :func:`estimate` reads it: its rule's name, its wildcards, and the
#: indices (in the same list) of the jobs it waits for
DagJob = tuple[str, dict, tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class Job:
    """A workflow job as the estimate schedules it: its seconds and the ids of the jobs it waits for."""
    id: str
    seconds: float
    after: tuple[str, ...] = ()


def estimate(plan, *, timer: StepTimer | None = None, sizes: dict[str, DataSize] | None = None,
             pending: bool = False, dag: list[DagJob] | None = None,
             start_s: float | None = None, probe: bool | None = None) -> Estimate:
    """The cost of a planned config's runs on this machine (see the module docstring); ``plan``: the
    :class:`mcfl.plan.Plan` of a validated config (its runs, stores, run folders and job files).

    Which runs: every run of the config; with ``pending``, those without a ``metrics.json`` in
    their run directory; with ``dag``, the jobs Snakemake will run (its DAG's jobs that need to
    run: the training jobs, centre files and first local models among them, and as many other jobs,
    each costing a start-up). The jobs are packed on the cores in the order of their dependencies
    (:func:`makespan`). ``start_s``: a job's process start-up (default: measured,
    :func:`~mcfl.cost.probe.measure_startup`). ``probe``: time each method's round on a probe federation
    (:func:`~mcfl.cost.probe.method_costs`; default: unless ``timer`` is given). ``timer`` and ``sizes`` replace the
    measurement and the data sizes (tests)."""
    cfg = plan.config
    device = _device(cfg.get("device", "auto"))
    if start_s is None and timer is not None:             # a test's timer: no start-ups either
        start_s = 0.0
    if probe is None:
        probe = timer is None
    cache = ProbeCache.of_user() if timer is None else ProbeCache(None)    # a test's timer: never cached
    timer = _memoised(timer or cache.step())     # one measurement per batch, the probes' and the runs'
    sizes = dict(sizes or {})
    for name, ds in cfg["datasets"].items():
        if name not in sizes:
            sizes[name] = data_size(ds, Path(plan.store(name)), Path(plan.raw_store(name)))
    wanted = _dag_outputs(plan, dag) if dag is not None else None
    todo = [(k, r) for k, r in plan.runs.items() if (wanted is None or _train_id(plan, k) in wanted)
            and not (pending and (Path(plan.dir_of(r)) / "metrics.json").exists())]
    methods: dict[str, MethodCost] = {}
    for name in dict.fromkeys(r["dataset"] for _, r in todo) if probe else ():
        methods.update(cache.method_costs([r for _, r in todo if r["dataset"] == name], sizes[name], device, timer))
    measured: dict[str, tuple[float, float]] = {}
    jobs: dict[str, Job] = {}
    out, notes = [], []
    for key, run in todo:
        size = sizes[run["dataset"]]
        train = {**train_defaults(), **run["train"]}
        group = batched_group(train, size, run["params"])
        batch = step_rows(train, size) * group
        mkey = json.dumps([run["model"], size.x_shape, size.n_classes, batch], sort_keys=True)
        if mkey not in measured:
            step_s, sample_s = timer(run["model"], tuple(size.x_shape), size.n_classes, batch, device)
            measured[mkey] = (step_s / group, sample_s)
        for note in batch_notes(run["dataset"], train, size, batch, device):
            notes += [note] if note not in notes else []
        charged, init = _init_job(plan, run, size, jobs, wanted)
        cost = with_method(run_cost(run, size, *measured[mkey], init_passes=init),
                           methods.get(method_key(run)), round_clients(run, size.n_clients), size.n_clients)
        out.append(cost)
        if charged:
            jobs[charged] = dataclasses.replace(jobs[charged], seconds=cost.init_s)
        tid = _train_id(plan, key)
        before = jobs.get(tid, Job(tid, 0.0))
        centres = plan.training.init_path(run) if run.get("needs_centres") else None
        after = before.after + ((centres,) if centres in jobs and centres not in before.after else ())
        jobs[tid] = Job(tid, before.seconds + cost.total_s - cost.init_s, after)
    if dag is not None:
        jobs = _dag_jobs(plan, dag, jobs)
    imports = JOB_IMPORTS + (", mlflow" if cfg.get("tracking") is True else "")   # a tracked job imports MLflow
    start = cache.startup(imports, measure_startup) if start_s is None and jobs else (start_s or 0.0)
    jobs = {i: dataclasses.replace(j, seconds=j.seconds + start) for i, j in jobs.items()}
    return Estimate(out, device, sizes, notes, list(jobs.values()), start,
                    "the jobs Snakemake will run" if dag is not None else
                    "runs without results" if pending else "every run, as from an empty results folder")


def _memoised(timer: StepTimer) -> StepTimer:
    """``timer`` measuring each (model, shape, classes, batch, device) once: a method's probe and its
    runs divide and multiply by the same bare step, so the machine's noise cancels between them."""
    seen: dict[str, tuple[float, float]] = {}

    def timed(model, x_shape, n_classes, batch_size, device):
        key = json.dumps([model, list(x_shape), n_classes, batch_size, str(device)], sort_keys=True)
        if key not in seen:
            seen[key] = timer(model, x_shape, n_classes, batch_size, device)
        return seen[key]
    return timed


def with_method(cost: RunCost, method: MethodCost | None, clients: int, n_clients: int) -> RunCost:
    """``cost`` (a bare SGD step's arithmetic) with what its method adds: its local step's factor,
    its server step for each of the round's ``clients`` and its evaluation of ``n_clients``
    clients (at least the arithmetic's)."""
    if method is None:
        return cost
    return dataclasses.replace(cost, round_s=method.local * cost.round_s + method.server_s * clients,
                               eval_s=max(cost.eval_s, method.eval_s * n_clients))


def _train_id(plan, key: tuple) -> str:
    """The id of the training job that trains run ``key`` (one job for all seeds of a grouped run)."""
    d, r, s = key
    return f"train {d} {r}" if r in plan.training.grouped else f"train {d} {r} {s}"


def _init_job(plan, run: dict, size: DataSize, jobs: dict[str, Job],
              wanted: set[str] | None) -> tuple[str | None, int]:
    """Add the centre file ``run`` waits for (and the first local models it clusters) to ``jobs``
    when it is to be made and not there yet; return the job that the centre initialisation's
    training is charged to (None: none) and its passes over every client."""
    if not run.get("needs_centres"):
        return None, 0
    centres, first = plan.training.init_path(run), plan.training.first_path(run)
    if centres in jobs or (wanted is not None and centres not in wanted):
        return None, 0
    charged, passes = None, 0
    if first and first not in jobs and (wanted is None or first in wanted):
        jobs[first] = Job(first, 0.0)
        charged, passes = first, 1            # the shared file's models, trained once
    elif not first:
        charged, passes = centres, init_passes(size.n_clients, n_params(run["model"], size))
    jobs[centres] = Job(centres, 0.0, (first,) if first in jobs else ())
    return charged, passes


def _dag_outputs(plan, dag: list[DagJob]) -> set[str]:
    """The ids (:func:`_train_id`, centre and first-models paths) of the DAG's training, centre and
    first-models jobs."""
    return {i for i in (_dag_id(plan, rule, wc) for rule, wc, _ in dag) if i}


def _dag_id(plan, rule: str, wc: dict) -> str | None:
    if rule == "train":
        return f"train {wc['dataset']} {wc['run']} {wc['seed']}"
    if rule == "train_seeds":
        return f"train {wc['dataset']} {wc['run']}"
    if rule == "init_centres":
        return plan.training.init_file.format(**wc)
    if rule == "first_models":
        return plan.training.first_models_file.format(**wc)
    return None


def _dag_jobs(plan, dag: list[DagJob], costed: dict[str, Job]) -> dict[str, Job]:
    """Every job of the DAG, with the seconds of the costed job of its id (none for the others: a
    start-up) and the DAG's dependencies."""
    ids = [_dag_id(plan, rule, wc) or f"{rule} #{i}" for i, (rule, wc, _) in enumerate(dag)]
    out = {}
    for i, (_, _, deps) in enumerate(dag):
        seconds = costed[ids[i]].seconds if ids[i] in costed else 0.0
        out[ids[i]] = Job(ids[i], seconds, tuple(dict.fromkeys(ids[d] for d in deps)))
    return out


def makespan(jobs: list[Job], cores: int) -> float:
    """Seconds until the last of ``jobs`` ends on ``cores`` cores, each job on one core after the
    jobs it waits for (ids not among ``jobs`` are done already), by list scheduling: whenever a
    core is free the ready job with the longest chain of work still behind it starts, as the
    workflow's priorities order them (:mod:`mcfl.plan.train`)."""
    import heapq

    by_id = {j.id: j for j in jobs}
    waits = {j.id: {a for a in j.after if a in by_id and a != j.id} for j in jobs}
    users: dict[str, list[str]] = {i: [] for i in by_id}
    for i, w in waits.items():
        for a in w:
            users[a].append(i)
    chain: dict[str, float] = {}
    for i in _topological(waits, users)[::-1]:
        chain[i] = by_id[i].seconds + max((chain[u] for u in users[i]), default=0.0)
    ready = [(-chain[i], i) for i, w in waits.items() if not w]
    heapq.heapify(ready)
    running: list[tuple[float, str]] = []
    now = 0.0
    while ready or running:
        while ready and len(running) < max(1, cores):
            _, i = heapq.heappop(ready)
            heapq.heappush(running, (now + by_id[i].seconds, i))
        now, done = heapq.heappop(running)
        for u in users[done]:
            waits[u].discard(done)
            if not waits[u]:
                heapq.heappush(ready, (-chain[u], u))
    return now


def _topological(waits: dict[str, set], users: dict[str, list]) -> list[str]:
    """The ids of ``waits`` in an order where each comes after those it waits for."""
    left = {i: len(w) for i, w in waits.items()}
    order = [i for i, n in left.items() if not n]
    for i in order:
        for u in users[i]:
            left[u] -= 1
            if not left[u]:
                order.append(u)
    return order


#: the batched executor's steps are timed as one step of at most this many clients' batches ...
