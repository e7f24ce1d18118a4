"""What a whole config costs before it runs: time a few rounds of each of its runs, extrapolate
(:func:`mcfl.cost.probe.time_run`). ``mcfl check-config`` prints a quicker estimate from a few timed local
steps (:func:`mcfl.cost.estimate`); this one runs each method's real rounds on the prepared data.

For every distinct run of the config's first seed (each method entry on each dataset, with its own
train settings: executor, local epochs or steps, clients per round, evaluation protocols), this builds
the run as ``mcfl train`` does, times its initialisation (``init``: FeSEM's first local models and
k-means ...), ``--rounds`` training rounds after ``--warmup`` untimed ones, and one evaluation with
every named protocol; then it prints, per run,

    seconds per round | seconds per evaluation | init s | estimated run s
      = init + rounds x s/round + evaluations x s/eval

and the config's total over all seeds (the runs of other seeds cost the same). Data preparation,
process start-up (~4 s a job) and reports are not counted.

    python benchmarks/study_cost.py config/femnist-sample.yaml
    python benchmarks/study_cost.py config/femnist-sample/paper.yaml --device cuda --methods FedAvg,FeSEM-K4
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from _common import machine

from mcfl.cost.probe import time_run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--methods", help="comma-separated run ids to time (default: all)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per run (median)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", type=Path, help="folder of prepared stores (default: prepared into a "
                                               "temporary folder); the store of dataset D is DATA/D")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from mcfl.config import expand_runs, load_config
    import tempfile

    from mcfl.data import prepare
    from mcfl.trainspec import TrainSpec

    cfg = load_config(args.config)
    runs = expand_runs(cfg)
    first = [r for r in runs if r["seed"] == cfg["seeds"][0]]
    if args.methods:
        first = [r for r in first if r["run_id"] in args.methods.split(",")]
    n_seeds = len(cfg["seeds"])
    print(f"# {args.config}: {len(first)} runs x {n_seeds} seeds; median of {args.rounds} rounds after "
          f"{args.warmup} warm-up\n# {machine(torch.device(args.device))}, {args.threads} torch thread(s)")
    print("| dataset | run | executor | s / round | s / eval | init s | run (est.) min |")
    print("|---|---|---|---|---|---|---|", flush=True)
    total = 0.0
    tmp = tempfile.TemporaryDirectory()
    args.data = args.data or Path(tmp.name)
    for run in first:
        store = args.data / run["dataset"]
        if not store.exists():
            prep = dict(cfg["datasets"][run["dataset"]]["prepare"])
            prepare(prep.pop("source"), store, **prep)
        t = time_run(run, store, args.device, args.rounds, args.warmup)
        total += t["run_s"] * n_seeds
        print(f"| {run['dataset']} | {run['run_id']} | {TrainSpec.of(run['train']).executor} | "
              f"{t['round_s']:.2f} | {t['eval_s']:.2f} | {t['init_s']:.1f} | {t['run_s'] / 60:.1f} |", flush=True)
    print(f"\nTotal (all {n_seeds} seeds, one job at a time on this device): {total / 3600:.2f} h"
          f" ({math.ceil(total / 60)} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
