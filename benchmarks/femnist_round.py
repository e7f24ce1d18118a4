"""One full FEMNIST-scale FedAvg round (LEAF FEMNIST CNN, 6.6M parameters; 3,550 clients with
LEAF-like sizes, one local epoch, batch 10) with the batched executor, against the sequential
executor's clients/s measured in the same run on a subset of the same clients.

The package's GPU targets (one H100): the round in under 10 s, and the batched executor at least
20x the sequential one in clients/s. Data are random FEMNIST-shaped uint8 images (the speed does
not depend on pixel values); client i gets U[50, 320] training samples (mean 185, about LEAF
FEMNIST's 805k samples x 0.8 / 3,550 writers).

    python benchmarks/femnist_round.py --device cuda                      # the GPU figures
    python benchmarks/femnist_round.py --clients 40 --seq-clients 4       # a quick check on a CPU
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import fake_store, machine


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=3550)
    ap.add_argument("--seq-clients", type=int, default=100, help="clients timed with the sequential executor")
    ap.add_argument("--min-samples", type=int, default=50)
    ap.add_argument("--max-samples", type=int, default=320)
    ap.add_argument("--chunk", type=int, default=None, help="batched executor: clients per chunk")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    from mcfl.algorithms.fedavg import FedAvg
    from mcfl.data import load
    from mcfl.engine import Task
    from mcfl.federation import build_federation
    from mcfl.runner import configure_torch

    configure_torch(device, args.threads)
    sizes = np.random.default_rng(0).integers(args.min_samples, args.max_samples + 1, args.clients)
    print(f"# FEMNIST-scale round: {args.clients} clients, {int(sizes.sum()):,} training samples, "
          f"1 epoch, batch 10\n# {machine(device)}")
    with tempfile.TemporaryDirectory() as tmp:
        store = load(fake_store(Path(tmp) / "femnist", "femnist_cnn", sizes))
        train = {"lr": 0.004, "batch_size": 10, "local_epochs": 1, "rounds": 1}
        out = {}
        for ex in ("sequential", "batched"):
            fed = build_federation(store, {"name": "femnist_cnn"},
                                   {**train, "executor": ex, "executor_chunk": args.chunk}, 0, device)
            if ex == "sequential":      # clients/s on a subset, after one warm-up client
                clients = list(range(min(args.seq_clients, args.clients)))
                list(fed.trainer.run([Task(0, fed.w0)], 1))
                sync(device)
                t = time.perf_counter()
                for _ in fed.trainer.run([Task(c, fed.w0) for c in clients], 1):
                    pass
                sync(device)
                out[ex] = (len(clients), time.perf_counter() - t)
            else:                       # one whole FedAvg round, after a warm-up chunk
                list(fed.trainer.run([Task(c, fed.w0) for c in range(min(fed.trainer.chunk, 8))], 1))
                algo = FedAvg(fed, FedAvg.Params())
                state = algo.init()
                sync(device)
                t = time.perf_counter()
                algo.round(state, np.arange(args.clients), 1)
                sync(device)
                out[ex] = (args.clients, time.perf_counter() - t)
                chunk = "auto" if fed.trainer.auto else fed.trainer.chunk
            n, s = out[ex]
            print(f"{ex:<10} {n:>5} clients in {s:8.2f} s: {n / s:9.1f} clients/s, "
                  f"{int(sizes[:n].sum()) / s:10.0f} samples/s", flush=True)
    ratio = (out["batched"][0] / out["batched"][1]) / (out["sequential"][0] / out["sequential"][1])
    print(f"batched (chunk {chunk}) / sequential clients/s: {ratio:.1f}x (target >= 20x on an H100); "
          f"full round {out['batched'][1]:.1f} s (target < 10 s on an H100)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
