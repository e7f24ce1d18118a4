"""Time per round of every run of a config (default: config/config.yaml, the `make reproduce`
config) with the sequential and the batched executor, measured in the same process, plus the
centre initialisation and one evaluation; and the resulting estimate of the training time the
batched executor would save over the whole DAG (every seed; start-up and evaluation unchanged).

    python benchmarks/rounds.py                       # seed 0 of every (dataset, method) run
    python benchmarks/rounds.py --config config/config.yaml --rounds 5
    python benchmarks/rounds.py --datasets digits_domains     # FedAvg and FedCG only
    python benchmarks/rounds.py --datasets digits_domains --against stacked

``--against stacked`` times the batched executor against itself with its low-rank paths off
(``lowrank=0``: every client on the stacked path) instead of against the sequential executor.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import ROOT, machine


def time_runs(run: dict, store: Path, rounds: int, against: str = "sequential") -> dict:
    """Both executors on one run, their rounds interleaved (seq r, batched r, seq r+1, ...) so that
    load changes on a shared machine hit both alike; wall and CPU time per round (medians).
    ``against="stacked"``: the baseline (key ``sequential``) is the batched executor with
    ``lowrank=0``."""
    from dataclasses import replace

    from mcfl import algorithms
    from mcfl.data import load
    from mcfl.executors import BatchedTrainer
    from mcfl.federation import build_federation
    from mcfl.evaluation import evaluate

    cls = algorithms.get(run["method"])
    out, algos = {}, {}
    for ex in ("sequential", "batched"):
        base = "batched" if against == "stacked" else ex
        fed = build_federation(load(store), run["model"], {**run["train"], "executor": base}, run["seed"])
        if ex == "sequential" and against == "stacked":
            tr = fed.trainer
            fed = replace(fed, trainer=BatchedTrainer(fed.model, fed.dev, tr.spec, tr.seed,
                                                      chunk=None if tr.auto else tr.chunk, lowrank=0))
        algo = cls(fed, cls.Params(**run["params"]))
        t = time.perf_counter()
        state = algo.init()
        out[ex] = {"init_s": time.perf_counter() - t, "wall": [], "cpu": []}
        algos[ex] = [algo, state, fed]
    for r in range(1, rounds + 1):
        for ex, a in algos.items():
            t, c = time.perf_counter(), time.process_time()
            a[1], _ = a[0].round(a[1], a[2].clients(r), r)
            out[ex]["wall"].append(time.perf_counter() - t)
            out[ex]["cpu"].append(time.process_time() - c)
    for ex, (algo, state, fed) in algos.items():
        t = time.perf_counter()
        evaluate(algo, state, fed)
        out[ex].update(eval_s=time.perf_counter() - t, round_s=float(np.median(out[ex]["wall"])),
                       round_cpu_s=float(np.median(out[ex]["cpu"])))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml")
    ap.add_argument("--rounds", type=int, default=5, help="rounds timed per run (median reported)")
    ap.add_argument("--datasets", help="comma-separated datasets of the config (default: all)")
    ap.add_argument("--against", choices=("sequential", "stacked"), default="sequential",
                    help="the baseline: the sequential executor, or the batched one with lowrank=0")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from mcfl.config import expand_runs, load_config
    from mcfl.data import prepare

    cfg = load_config(args.config)
    chosen = args.datasets.split(",") if args.datasets else list(cfg["datasets"])
    unknown = set(chosen) - set(cfg["datasets"])
    if unknown:
        ap.error(f"--datasets: {', '.join(sorted(unknown))} not in {args.config}")
    runs = [r for r in expand_runs(cfg) if r["dataset"] in chosen]
    what = "sequential vs batched executor" if args.against == "sequential" else \
        "batched executor, lowrank=0 (stacked: 'seq' columns) vs default"
    print(f"# per-round time, {args.config.name}, {what} (same process)\n"
          f"# {machine(torch.device('cpu'))}")
    print(f"{'':<21} {'wall ms/round':^30} {'CPU ms/round':^26}")
    print(f"{'dataset':<10} {'run':<10} {'seq':>10} {'batched':>10} {'speed-up':>8} "
          f"{'seq':>8} {'batched':>8} {'speed-up':>8} {'seq init s':>10} {'bat init s':>10} {'eval s':>7}")
    saved = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        stores = {}
        for name in chosen:
            p = dict(cfg["datasets"][name]["prepare"])
            stores[name] = prepare(p.pop("source"), Path(tmp) / name, **p)
        first_seed = cfg["seeds"][0]
        for run in runs:
            if run["seed"] != first_seed:
                continue
            res = time_runs(run, stores[run["dataset"]], args.rounds, args.against)
            s, b = res["sequential"], res["batched"]
            n_seeds = len(cfg["seeds"])
            init_saved = s["init_s"] - b["init_s"] if run["needs_centres"] else 0.0
            saved += n_seeds * (int(run["train"]["rounds"]) * (s["round_cpu_s"] - b["round_cpu_s"])
                                + init_saved)
            print(f"{run['dataset']:<10} {run['run_id']:<10} {1e3 * s['round_s']:10.1f} "
                  f"{1e3 * b['round_s']:10.1f} {s['round_s'] / b['round_s']:7.2f}x "
                  f"{1e3 * s['round_cpu_s']:8.1f} {1e3 * b['round_cpu_s']:8.1f} "
                  f"{s['round_cpu_s'] / b['round_cpu_s']:7.2f}x "
                  f"{s['init_s']:10.2f} {b['init_s']:10.2f} {s['eval_s']:7.2f}", flush=True)
    print(f"estimated time saved by executor: batched over all {len(runs)} runs (rounds x CPU time per "
          f"round + initialisation): {saved:.0f} s of job time (divide by the cores Snakemake uses)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
