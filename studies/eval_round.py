"""Seconds per evaluation round of the real writers' Table-2 config (config/femnist-sample.yaml:
the standard protocol and five named ones), with the round's protocols sharing one
``mcfl.evaluation.RoundCache`` against each protocol evaluating on its own (what every round cost
before the cache: each protocol predicted and fine-tuned again).

The models are the runs' initial ones trained for ``--rounds`` rounds (the cost of an evaluation
does not depend on how far training went); the two ways alternate ``--repeats`` times so that load
on a shared machine hits both alike, and the scores of both are checked to be equal.

    python studies/eval_round.py --methods FedAvg,NoFed,FeSEM-K3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import ROOT, machine  # noqa: E402


def one_round(algo, state, fed, protos, rnd: int, shared: bool) -> tuple[float, dict]:
    from mcfl.evaluation import RoundCache, evaluate, evaluate_protocol

    t = time.perf_counter()
    cache = RoundCache(algo, state, fed, rnd) if shared else None
    row, _ = evaluate(algo, state, fed, rnd=rnd, cache=cache)
    for name, p in protos.items():
        row.update({f"{name}/{k}": v for k, v in evaluate_protocol(p, algo, state, fed, rnd, cache).items()})
    return time.perf_counter() - t, row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "config" / "femnist-sample.yaml"))
    ap.add_argument("--methods", default="FedAvg,NoFed,FeSEM-K3", help="comma-separated run ids")
    ap.add_argument("--rounds", type=int, default=2, help="training rounds before evaluating")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from mcfl import algorithms
    from mcfl.config import expand_runs, load_config
    from mcfl.data.store import load
    from mcfl.evaluation import protocols
    from mcfl.federation import build_federation
    from mcfl.plan import Plan

    cfg = load_config(args.config)
    plan = Plan(cfg)
    runs = {r["run_id"]: r for r in expand_runs(cfg) if r["seed"] == 0}
    print(f"# seconds per evaluation round, {args.config}: standard + {len(next(iter(runs.values()))['train'].get('eval_protocols') or {})} "
          f"named protocols; median of {args.repeats}, the two ways alternating\n# {machine(torch.device('cpu'))}")
    print("| run | clients | models | shared cache s | each protocol alone s | alone / shared |")
    print("|---|---|---|---|---|---|")
    for rid in args.methods.split(","):
        run = runs[rid]
        data = load(ROOT / plan.store(run["dataset"]))
        fed = build_federation(data, run["model"], run["train"], 0)
        cls = algorithms.get(run["method"])
        algo = cls(fed, cls.Params(**run["params"]))
        state = algo.init()
        for r in range(1, args.rounds + 1):
            state, _ = algo.round(state, fed.clients(r), r)
        protos = protocols(run["train"].get("eval_protocols"))
        times = {True: [], False: []}
        rows = {}
        for _ in range(args.repeats):
            for shared in (True, False):
                s, rows[shared] = one_round(algo, state, fed, protos, args.rounds, shared)
                times[shared].append(s)
        if rows[True] != rows[False]:
            raise SystemExit(f"{rid}: the shared cache changed the scores: {rows[True]} != {rows[False]}")
        a, b = statistics.median(times[True]), statistics.median(times[False])
        print(f"| {run['label']} | {fed.n_clients} | {len(list(algo.eval_models(state)))} | {a:.2f} | "
              f"{b:.2f} | {b / a:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
