"""Seconds per round of the GSP rows of config/femnist-sample/fedgsp.yaml (FedGSP's Table 1 on the
105 real writers) under the sequential and the batched executor, at chosen round numbers.

A GSP round trains a chain of clients inside each sampled group; the groups are independent, and
the j-th clients of all sampled groups are one executor call (mcfl.algorithms.fedgsp), so the
batched executor trains them as one chunk. How much that buys depends on the round: FedGSP's
number of groups grows with r (Log growth, beta 3: 3 groups of 35 writers at r = 1, 39 groups of
2-3 at r = 500), so early rounds have few long chains and late rounds many short ones. Each round
r is timed from the same start model under both executors, interleaved (sequential, batched,
sequential, ...), and the figure is the median of ``--repeats``; the last column is the largest
difference between the two executors' new global models (float rounding only).

    python studies/fedgsp_round.py --rounds 1,10,100,500 --methods FedGSP,NaiveGSP
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import add_config_args, config_runs, machine, pick_run  # noqa: E402


def main(argv=None) -> int:
    from mcfl import algorithms
    from mcfl.federation import build_federation
    from mcfl.trainspec import TrainSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_args(ap)
    ap.add_argument("--methods", default="FedGSP,NaiveGSP", help="comma-separated run ids")
    ap.add_argument("--rounds", default="1,10,100,500", help="round numbers to time")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    runs, data = config_runs(a.config, a.store)
    print(f"# seconds per round, {a.config[-1].name}, store {a.store.name}; median of {a.repeats}, executors interleaved")
    print(f"# {machine(torch.device('cpu'))}")
    print("| method | round | groups trained x longest chain | sequential s | batched s | seq / batched | max abs diff |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for run_id in a.methods.split(","):
        run = pick_run(runs, run_id, a.config)
        algos = {}
        for ex in ("sequential", "batched"):
            fed = build_federation(data, run["model"], TrainSpec.of({**run["train"], "executor": ex}),
                                   run["seed"], torch.device("cpu"))
            cls = algorithms.get(run["method"])
            algo = cls(fed, cls.Params(**run["params"]))
            algos[ex] = (algo, algo.init(), fed)
        for r in (int(x) for x in a.rounds.split(",")):
            times = {"sequential": [], "batched": []}
            out = {}
            for _ in range(a.repeats):
                for ex, (algo, state, fed) in algos.items():
                    t = time.perf_counter()
                    out[ex] = algo.round(state, fed.clients(r), r)
                    times[ex].append(time.perf_counter() - t)
            seq, bat = (statistics.median(times[k]) for k in ("sequential", "batched"))
            diag = out["batched"][1]
            diff = float((out["sequential"][0].w - out["batched"][0].w).abs().max())
            print(f"| {run_id} | {r} | {diag['trained_groups']} x {diag['chain']} | {seq:.2f} | {bat:.2f} | "
                  f"{seq / bat:.2f}x | {diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
