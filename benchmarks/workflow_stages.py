"""Wall time of the `make reproduce` stages, from the `benchmark:` files Snakemake writes for every
job (``<results>/benchmarks/<stage>/...tsv``: wall ``s``, ``cpu_time``, ``max_rss`` ...).

Per stage: jobs, summed, mean and largest job wall time and the largest peak RSS (Snakemake's
``cpu_time`` is left out: it is sampled periodically and misses most of a job this short). For training
jobs it also splits each job's wall time into the training loop itself (``wall_s`` of the run's
``metrics.json``: data loading, initialisation, rounds, evaluation, outputs) and everything around it
(interpreter and library start-up, MLflow): the ratio says how much a faster executor can save.
The newest Snakemake log that reports an elapsed time gives the whole DAG's wall time.

    python benchmarks/workflow_stages.py                  # results/ and .snakemake/log of this checkout
    python benchmarks/workflow_stages.py --results /path/to/results --logs /path/to/.snakemake/log
    python benchmarks/workflow_stages.py --md docs/results/default-stages.md   # also as a page table
    python benchmarks/workflow_stages.py --results archived-runs/results-femnist-sample \
        --logs archived-runs/results-femnist-sample --md docs/results/femnist-sample-gpu-stages.md

``--replay N`` replays the jobs' measured times on N slots (list scheduling, dependencies ignored)
longest first and in 200 random orders: how much ordering the jobs could save on N cores or GPU
slots. With ``--config`` (the run's config files) it also replays the training and centre jobs with
their dependencies (a run after its centre file) in the order the workflow starts them, highest
``priority:`` first (``mcfl.plan.train``: each run's work from its config, centre files above the
runs waiting for them; ties in random order), against random orders.

    python benchmarks/workflow_stages.py --results archived-runs/results-femnist-sample \
        --logs archived-runs/results-femnist-sample --replay 14 --config config/femnist-sample.yaml

``--md`` writes the stage table and the training jobs summed per dataset as Markdown, with the
machine and commit of the ``make reproduce`` that made them (``logs/reproduce.json``);
``make docs-results`` runs it for the docs' Performance page.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import re
import statistics
from pathlib import Path

import pandas as pd

from _common import ROOT


def read_benchmarks(res: Path) -> pd.DataFrame:
    rows = []
    for f in sorted((res / "benchmarks").rglob("*.tsv")):
        rel = f.relative_to(res / "benchmarks").with_suffix("")
        t = pd.read_csv(f, sep="\t")
        for _, r in t.iterrows():
            rows.append({"stage": rel.parts[0], "job": "/".join(rel.parts[1:]), "s": float(r["s"]),
                         "max_rss_mb": float(r.get("max_rss", float("nan")))})
    return pd.DataFrame(rows)


def dag_wall(logs: Path) -> tuple[float, str] | None:
    """Wall time of the newest Snakemake log that reports one ("Elapsed time: H:MM:SS")."""
    for log in sorted(logs.glob("*.snakemake.log"), reverse=True):
        m = re.search(r"^Elapsed time: (\d+):(\d\d):(\d\d(?:\.\d+)?)", log.read_text(errors="replace"), re.M)
        if m:
            return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)), log.name
    return None


def runs_dir(res: Path) -> Path:
    """A results directory's ``runs/``, or the directory itself for an archived copy of one
    (``archived-runs/<results>/``, which keeps the runs without ``runs/``)."""
    return res / "runs" if (res / "runs").is_dir() else res


def loop_seconds(res: Path, job: str) -> float:
    """The training loops' seconds of a training job: its run's ``wall_s``, or for a job that trained
    every seed of a run in one process (``<dataset>/<run>/seeds``, ``seeds_per_job: all``) the sum
    over its seeds' runs. NaN where a run has no metrics.json."""
    runs = sorted((runs_dir(res) / job[:-len("/seeds")]).glob("seed*")) if job.endswith("/seeds") \
        else [runs_dir(res) / job]
    files = [r / "metrics.json" for r in runs]
    if not files or not all(f.is_file() for f in files):
        return float("nan")
    return sum(json.loads(f.read_text())["wall_s"] for f in files)


def makespan(times: list[float], slots: int) -> float:
    """When the last job ends if each job, in the given order, starts on the first free slot."""
    free = [0.0] * slots
    for t in times:
        heapq.heappush(free, heapq.heappop(free) + t)
    return max(free)


def replay(times: list[float], slots: int, orders: int = 200) -> tuple[float, float]:
    """The jobs' makespan on ``slots`` longest first, and the median over random orders."""
    longest = makespan(sorted(times, reverse=True), slots)
    shuffled = []
    for i in range(orders):
        t = list(times)
        random.Random(i).shuffle(t)
        shuffled.append(makespan(t, slots))
    median = statistics.median(shuffled)
    print(f"# {len(times)} jobs, {sum(times):.0f} s, replayed on {slots} slots (dependencies ignored): "
          f"longest first {longest:.0f} s, random order {median:.0f} s (median of {orders}), "
          f"the sum / {slots} {sum(times) / slots:.0f} s")
    return longest, median


def makespan_dag(times: list[float], deps: list[list[int]], slots: int, key: list) -> float:
    """When the last job ends if, whenever a slot is free, the ready job (its dependencies done)
    with the smallest ``key`` starts: how Snakemake's scheduler runs a DAG by priority."""
    n, done, started, now = len(times), set(), set(), 0.0
    running: list[tuple[float, int]] = []
    while len(done) < n:
        ready = sorted((i for i in range(n) if i not in started and all(d in done for d in deps[i])),
                       key=lambda i: key[i])
        for i in ready[:slots - len(running)]:
            started.add(i)
            heapq.heappush(running, (now + times[i], i))
        now, i = heapq.heappop(running)
        done.add(i)
    return now


def replay_priorities(df: pd.DataFrame, config_files: list[str], slots: int, orders: int = 200) -> tuple[float, float]:
    """The training and centre-initialisation jobs replayed with their dependencies (a run after
    its centre file) on ``slots``: highest ``priority:`` first as the workflow computes it for these
    config files (ties in random order), against random orders; medians over ``orders``."""
    from types import SimpleNamespace

    from mcfl.cluster.spec import centre_key
    from mcfl.config import load_config
    from mcfl.plan import Plan

    plan = Plan(load_config(*config_files))
    jobs = df[df.stage.isin(["train", "init"])].reset_index(drop=True)
    index = {(st, j): i for i, (st, j) in enumerate(zip(jobs.stage, jobs.job))}
    prio, deps = [], []
    for stage, job in zip(jobs.stage, jobs.job):
        d, name, last = job.split("/")
        seeds = plan.training.group_seeds if last == "seeds" else [last[4:]]
        w = SimpleNamespace(dataset=d, run=name, centres=name, seed=seeds[0])
        if stage == "init":
            prio.append(plan.training.init_priority(w))
            deps.append([])
            continue
        prio.append(plan.training.group_priority(w) if last == "seeds" else plan.training.train_priority(w))
        runs = [plan.runs[(d, name, s)] for s in seeds]
        deps.append([index[("init", f"{d}/{centre_key(r)}/seed{r['seed']}")] for r in runs
                     if r["needs_centres"] and ("init", f"{d}/{centre_key(r)}/seed{r['seed']}") in index])
    times = jobs.s.tolist()
    ranked, shuffled = [], []
    for i in range(orders):
        tie = list(range(len(times)))
        random.Random(i).shuffle(tie)
        ranked.append(makespan_dag(times, deps, slots, [(-p, t) for p, t in zip(prio, tie)]))
        shuffled.append(makespan_dag(times, deps, slots, tie))
    by_priority, median = statistics.median(ranked), statistics.median(shuffled)
    print(f"# {len(times)} training and centre jobs, {sum(times):.0f} s, replayed on {slots} slots with their "
          f"dependencies: the workflow's priorities {by_priority:.0f} s (ties in random order), random order "
          f"{median:.0f} s (medians of {orders})")
    return by_priority, median


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--logs", type=Path, default=ROOT / ".snakemake" / "log")
    ap.add_argument("--md", type=Path, help="also write the tables as Markdown to this file")
    ap.add_argument("--record", type=Path, default=ROOT / "logs" / "reproduce.json",
                    help="make reproduce's record, for the Markdown's machine line")
    ap.add_argument("--replay", type=int, metavar="N",
                    help="replay the measured job times on N slots, longest first and in random orders")
    ap.add_argument("--config", nargs="+", metavar="FILE",
                    help="the run's config files: --replay also replays the training and centre jobs with "
                         "their dependencies in the workflow's priority order")
    args = ap.parse_args(argv)
    df = read_benchmarks(args.results)
    if df.empty:
        print(f"no benchmark files under {args.results / 'benchmarks'}; run the workflow first")
        return 1
    if args.replay:
        replay(df.s.tolist(), args.replay)
        if args.config:
            replay_priorities(df, args.config, args.replay)
    print(f"# Snakemake benchmark files under {args.results / 'benchmarks'}")
    print(f"{'stage':<10} {'jobs':>5} {'sum s':>8} {'mean s':>7} {'max s':>7} {'max RSS MB':>10}")
    for stage, g in df.groupby("stage", sort=False):
        print(f"{stage:<10} {len(g):>5} {g.s.sum():8.1f} {g.s.mean():7.2f} {g.s.max():7.2f} "
              f"{g.max_rss_mb.max():10.0f}")
    train = df[df.stage == "train"]
    loop = [loop_seconds(args.results, job) for job in train.job]
    if len(train) and not pd.isna(loop).all():
        train = train.assign(loop_s=loop, dataset=[j.split("/")[0] for j in train.job],
                             method=[j.split("/")[1] for j in train.job])
        print("\ntraining jobs: wall = training loop (metrics.json wall_s) + start-up/tracking")
        print(f"{'dataset':<10} {'run':<10} {'jobs':>4} {'job s':>7} {'loop s':>7} {'other s':>7}")
        for (d, m), g in train.groupby(["dataset", "method"], sort=False):
            print(f"{d:<10} {m:<10} {len(g):>4} {g.s.mean():7.2f} {g.loop_s.mean():7.2f} "
                  f"{(g.s - g.loop_s).mean():7.2f}")
        tot, lp = train.s.sum(), train.loop_s.sum()
        print(f"all training jobs: {tot:.1f} s, of which training loops {lp:.1f} s ({lp / tot:.0%})")
    wall = dag_wall(args.logs)
    if wall:
        print(f"\nwhole DAG ({wall[1]}): {wall[0]:.0f} s wall")
    if args.md:
        write_md(args.md, df, train, args.record, args.results, wall)
        print(f"-> {args.md}")
    return 0


def machine_of(res: Path) -> str | None:
    """The device the results directory's runs trained on, from a run's ``metrics.json``."""
    from mcfl.io import read_run

    for f in sorted(runs_dir(res).glob("*/*/seed*/metrics.json"))[:1]:
        m = read_run(f.parent)
        return f"{m.get('device_name') or m.get('device')}, {m.get('cpu', '')} CPU, torch {m.get('torch')}"
    return None


def write_md(out: Path, df: pd.DataFrame, train: pd.DataFrame, record: Path, res: Path = ROOT / "results",
             wall: tuple[float, str] | None = None) -> None:
    """The stage table, and the training jobs summed per dataset, as Markdown; the machine line
    from ``make reproduce``'s record for the default results, else from the runs' own metrics."""
    lines = ["| stage | jobs | job wall sum s | largest job s | peak RSS MB |", "|---|---|---|---|---|"]
    for stage, g in df.groupby("stage", sort=False):
        lines.append(f"| {stage} | {len(g)} | {g.s.sum():,.0f} | {g.s.max():.0f} | {g.max_rss_mb.max():,.0f} |")
    if "loop_s" in train:
        lines += ["", "| training jobs of | jobs | job wall sum s | of which training loops s |", "|---|---|---|---|"]
        for d, g in train.groupby("dataset", sort=False):
            lines.append(f"| {d} | {len(g)} | {g.s.sum():,.0f} | {g.loop_s.sum():,.0f} |")
    line = f"*Written by `benchmarks/workflow_stages.py --md` from `{res.name}/benchmarks/`"
    if res.resolve() != (ROOT / "results").resolve():
        line += f" ({machine_of(res) or 'machine unknown'}"
        line += f"; whole DAG {wall[0]:,.0f} s wall)" if wall else ")"
    elif record.is_file():
        r = json.loads(record.read_text())
        line += (f" of the `make reproduce` of {r['started']} (git {r['git']}; {r['cpu']}, "
                 f"{r['cores']} cores; DAG {r['dag_s']:,.0f} s)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n\n" + line + ".*\n")


if __name__ == "__main__":
    raise SystemExit(main())
