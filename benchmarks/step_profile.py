"""Where one run's rounds spend their time, operator by operator (``torch.profiler``, CPU or CUDA).

Trains one run of a config (its JSON as the workflow makes it, ``mcfl.config.expand_runs``) on its
prepared store: ``--warmup`` rounds untimed, then ``--rounds`` rounds under the profiler, without
evaluation. Prints seconds per round (local training and the rest, as ``history.csv`` splits them)
and the operators with the most self time, per round, grouped by operator and input shapes, so a
speed change can be aimed at what costs (for example FedCG's per-client GCN projection products on
digits_domains, or the digits CNN's grouped convolutions). Run from the repository root after the
store exists (``snakemake data/digits_domains --cores 1``):

    python benchmarks/step_profile.py --dataset digits_domains --run "FedCG(3)" --rounds 3
    python benchmarks/step_profile.py --dataset digits --run FedAvg --rounds 3 --top 15
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from _common import ROOT, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    ap.add_argument("--dataset", default="digits_domains")
    ap.add_argument("--run", default="FedCG(3)", help="the run's label, as in the report table")
    ap.add_argument("--store", help="prepared store (default: data/<dataset> under the root)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    from mcfl import algorithms
    from mcfl.config import expand_runs, load_config
    from mcfl.data.store import load
    from mcfl.federation import build_federation, resolve_device
    from mcfl.runner import configure_torch
    from mcfl.timing import LocalClock
    from mcfl.trainspec import TrainSpec

    cfg = load_config(args.config)
    runs = {r["label"]: r for r in expand_runs(cfg) if r["dataset"] == args.dataset and r["seed"] == args.seed}
    if args.run not in runs:
        raise SystemExit(f"{args.config}: no run {args.run!r} of {args.dataset}, seed {args.seed}; "
                         f"there are: {', '.join(sorted(runs))}")
    run = runs[args.run]
    if run["needs_centres"]:
        raise SystemExit(f"{args.run} starts from initial centres (init-centres); profile a run without them")
    store = Path(args.store or ROOT / "data" / args.dataset)
    if not store.exists():
        raise SystemExit(f"{store}: no prepared store; make it with `snakemake {store.relative_to(ROOT)} --cores 1`")
    dev = resolve_device(args.device)
    configure_torch(dev, args.threads)
    tcfg = TrainSpec.of(run["train"])
    fed = build_federation(load(store), run["model"], tcfg, run["seed"], dev, None)
    cls = algorithms.get(run["method"])
    algo = cls(fed, cls.Params(**run["params"]))
    clock = LocalClock(algo.fed.trainer, dev)
    state = algo.init()
    for r in range(1, args.warmup + 1):
        state, _ = algo.round(state, fed.clients(r), r)
    first = args.warmup + 1
    clock.reset()
    t0 = time.perf_counter()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for r in range(first, first + args.rounds):
            state, _ = algo.round(state, fed.clients(r), r)
        clock.sync()
        wall = (time.perf_counter() - t0) / args.rounds      # before the profiler's own wrap-up
    local = clock.seconds / args.rounds
    print(f"{args.run} on {args.dataset} ({args.config}), seed {args.seed}, rounds {first}-"
          f"{first + args.rounds - 1} profiled; {machine(dev)}")
    print(f"per round: {wall:.3f} s, of which local training {local:.3f} s (profiler on: slower than a "
          f"plain run)\n")
    rows = prof.key_averages(group_by_input_shape=True)
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in rows) or 1.0
    print(f"| operator | input shapes | ms per round | share | calls per round |")
    print("|---|---|---|---|---|")
    for e in sorted(rows, key=lambda e: -getattr(e, key))[:args.top]:
        shapes = ", ".join(str(list(s)) for s in e.input_shapes if s)[:90]
        print(f"| {e.key} | {shapes} | {getattr(e, key) / 1e3 / args.rounds:.1f} | "
              f"{getattr(e, key) / total:.1%} | {e.count / args.rounds:.0f} |")


if __name__ == "__main__":
    main()
