"""FeSEM server memory and time per round at FEMNIST scale: m clients (up to LEAF FEMNIST's 3,550)
with the 6.6M-parameter LEAF FEMNIST CNN, all clients every round, including the 20-restart k-means
centre initialisation. Local data is tiny (a few random 28x28 images per client): this measures the
server, whose state must grow as O(K·|W|) and not O(m·|W|) (holding every local model would take
m x 26 MB, 94 GB at m = 3,550).

Each m runs in a fresh child process, so its peak resident set size (ru_maxrss) is its own; the
baseline is the same process's peak after building the federation (Python, torch, the model, the
data), before the initialisation.

    python studies/fesem_memory.py                          # m = 100, 1000, 3550; K = 4
    python studies/fesem_memory.py --clients 3550 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import fake_store, machine, peak_rss_mb  # noqa: E402


def child(args) -> dict:
    from mcfl.algorithms.fesem import FeSEM, Params
    from mcfl.data import load
    from mcfl.federation import build_federation

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    sizes = rng.integers(args.min_samples, args.max_samples + 1, args.m)
    with tempfile.TemporaryDirectory() as tmp:
        store = fake_store(Path(tmp) / "femnist", "femnist_cnn", sizes)
        train = {"lr": 0.01, "batch_size": 10, "local_epochs": 1, "rounds": args.rounds,
                 "executor": args.executor}
        fed = build_federation(load(store), {"name": "femnist_cnn"}, train, seed=0, device=args.device)
        base = peak_rss_mb()
        algo = FeSEM(fed, Params(K=args.K, restarts=20, init_projection=args.projection))
        t = time.perf_counter()
        state = algo.init()
        t_init = time.perf_counter() - t
        rss_init = peak_rss_mb()
        times = []
        for r in range(1, args.rounds + 1):
            t = time.perf_counter()
            state, diag = algo.round(state, fed.clients(r), r)
            times.append(time.perf_counter() - t)
        from mcfl.cluster.init import projection_dim

        sel = fed.model.select("all")
        return {"m": args.m, "params": fed.model.n_params, "K": args.K,
                "projection": projection_dim(args.m, sel.stop - sel.start, args.projection),
                "init_s": t_init, "round_s": float(np.median(times)), "rss_base_mb": base,
                "rss_init_mb": rss_init, "rss_peak_mb": peak_rss_mb(),
                "sizes": [int((state.assign == k).sum()) for k in range(args.K)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 3550])
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--min-samples", type=int, default=2)
    ap.add_argument("--max-samples", type=int, default=4)
    ap.add_argument("--projection", type=int, default=None,
                    help="k-means features: default automatic, 0 exact, k a k-dim projection")
    ap.add_argument("--executor", default="sequential", choices=["sequential", "batched"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit-mb", type=float, default=2048)
    ap.add_argument("--m", type=int, help=argparse.SUPPRESS)            # child mode
    args = ap.parse_args(argv)
    if args.m is not None:
        print(json.dumps(child(args)))
        return 0
    torch.set_num_threads(args.threads)
    print(f"# FeSEM(K={args.K}) server memory, LEAF FEMNIST CNN, U[{args.min_samples}, "
          f"{args.max_samples}] samples per client, batch 10, 1 epoch, 20-restart k-means init, "
          f"{args.executor} executor\n# {machine(torch.device(args.device))}")
    print(f"{'m':>5} {'|W|':>10} {'proj k':>6} {'init s':>7} {'s/round':>8} {'base MB':>8} "
          f"{'init MB':>8} {'peak MB':>8} {'m·|W| MB':>9}  target")
    ok = True
    for m in args.clients:
        cmd = [sys.executable, __file__, "--m", str(m)] + [
            a for a in (argv if argv is not None else sys.argv[1:])]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-2000:], file=sys.stderr)
            return out.returncode
        r = json.loads(out.stdout.strip().splitlines()[-1])
        models_mb = m * r["params"] * 4 / 2**20
        hit = r["rss_peak_mb"] < args.limit_mb
        ok &= hit
        print(f"{m:>5} {r['params']:>10,} {r['projection']:>6} {r['init_s']:7.1f} {r['round_s']:8.1f} "
              f"{r['rss_base_mb']:8.0f} {r['rss_init_mb']:8.0f} {r['rss_peak_mb']:8.0f} "
              f"{models_mb:9.0f}  {'<' if hit else '>='} {args.limit_mb:.0f} MB", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
