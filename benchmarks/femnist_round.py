"""One full FEMNIST-scale FedAvg round (LEAF FEMNIST CNN, 6.6M parameters; 3,550 clients with
LEAF-like sizes, one local epoch, batch 10) with the batched executor, against the sequential
executor's clients/s measured in the same run on a subset of the same clients; with
``--precision``, once per training precision (``train.precision``), each against fp32 measured in
the same run.

The package's GPU goals (one H100 or H200): the round in at most 4 s in fp32 and 1.5 s in tf32 or
bf16, and the batched executor at least 40x the sequential one in clients/s. Data are random FEMNIST-shaped uint8 images (the speed does
not depend on pixel values); client i gets U[50, 320] training samples (mean 185, about LEAF
FEMNIST's 805k samples x 0.8 / 3,550 writers).

Per precision it prints the round's seconds and the sequential clients/s, their speed-up over fp32,
and how far the round's FedAvg model lands from fp32's: ``||w_p - w_fp32|| / ||w_fp32 - w_0||``,
the difference relative to the round's own update (0 for a bitwise-equal round). Random labels say
nothing of accuracy: that needs real writers (docs/performance.md, "Training precision").

    python benchmarks/femnist_round.py --device cuda                      # the GPU figures
    python benchmarks/femnist_round.py --device cuda --precision all      # fp32, tf32, bf16 against fp32
    python benchmarks/femnist_round.py --device cuda --profile 500        # where a round's time goes
    python benchmarks/femnist_round.py --clients 40 --seq-clients 4       # a quick check on a CPU

``--profile N`` then runs the first N clients of the fp32 round once more under ``torch.profiler``
and prints the wall time against the time the device was busy (the rest is Python, launches and
waits), the number of kernel launches per client, and the operators with the most device time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import fake_store, machine

PRECISIONS = ("fp32", "tf32", "bf16")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def precisions(text: str) -> list[str]:
    """``--precision``: a comma-separated list of fp32, tf32, bf16, or ``all``; fp32 always runs
    first (the baseline of the ratios)."""
    asked = list(PRECISIONS) if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in asked if p not in PRECISIONS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown precision {bad[0]!r}; use {', '.join(PRECISIONS)} or all")
    return ["fp32"] + [p for p in dict.fromkeys(asked) if p != "fp32"]


def measure(store, sizes, args, device, precision: str) -> dict:
    """The sequential executor's clients/s on a subset and one whole batched FedAvg round, each
    after a warm-up, at ``precision``; and the round's FedAvg model."""
    from mcfl.algorithms.fedavg import FedAvg
    from mcfl.engine import Task
    from mcfl.federation import build_federation
    from mcfl.precision import precision_ran

    train = {"lr": 0.004, "batch_size": 10, "local_epochs": 1, "rounds": 1, "precision": precision}
    out = {"ran": precision_ran(precision, device)}
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
            list(fed.trainer.run([Task(c, fed.w0) for c in range(min(fed.trainer.chunk, 8, args.clients))], 1))
            algo = FedAvg(fed, FedAvg.Params())
            state = algo.init()
            sync(device)
            t = time.perf_counter()
            state, _ = algo.round(state, np.arange(args.clients), 1)
            sync(device)
            out[ex] = (args.clients, time.perf_counter() - t)
            out["chunk"] = "auto" if fed.trainer.auto else fed.trainer.chunk
            out["w"], out["w0"] = state.w.cpu(), fed.w0.cpu()
        n, s = out[ex]
        print(f"{precision:<5} {ex:<10} {n:>5} clients in {s:8.2f} s: {n / s:9.1f} clients/s, "
              f"{int(sizes[:n].sum()) / s:10.0f} samples/s", flush=True)
    return out


def profile_round(store, args, device, n: int) -> None:
    """The first ``n`` clients of an fp32 FedAvg round under ``torch.profiler``: wall time, time
    the device (or, on a CPU, the operators) was busy, kernel launches, and the top operators."""
    from torch.profiler import ProfilerActivity, profile

    from mcfl.algorithms.fedavg import FedAvg
    from mcfl.federation import build_federation

    train = {"lr": 0.004, "batch_size": 10, "local_epochs": 1, "rounds": 1, "precision": "fp32",
             "executor": "batched", "executor_chunk": args.chunk}
    fed = build_federation(store, {"name": "femnist_cnn"}, train, 0, device)
    algo = FedAvg(fed, FedAvg.Params())
    state = algo.init()
    n = min(n, args.clients)
    algo.round(state, np.arange(min(n, 64)), 1)                      # warm-up
    sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        algo.round(state, np.arange(n), 1)
        sync(device)
    wall = time.perf_counter() - t
    events = prof.key_averages()
    cuda = device.type == "cuda"
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    if cuda:    # kernels only (an operator's own row repeats its kernels' time), as the table's total
        busy = sum(e.self_device_time_total for e in events
                   if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation) / 1e6
    else:
        busy = sum(e.self_cpu_time_total for e in events) / 1e6
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                       "cuLaunchKernelEx"))
    print(f"\n# profile: fp32 round on {n} clients: {wall:.2f} s wall (profiler on); "
          f"{'device' if cuda else 'operators'} busy {busy:.2f} s ({100 * busy / wall:.0f}%)"
          + (f"; {launches} kernel launches, {launches / n:.0f} a client" if cuda else ""))
    print(events.table(sort_by=key, row_limit=args.top))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=3550)
    ap.add_argument("--seq-clients", type=int, default=100, help="clients timed with the sequential executor")
    ap.add_argument("--min-samples", type=int, default=50)
    ap.add_argument("--max-samples", type=int, default=320)
    ap.add_argument("--chunk", type=int, default=None, help="batched executor: clients per chunk")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", type=precisions, default=["fp32"],
                    help="training precisions, comma-separated (fp32, tf32, bf16) or 'all'; each "
                         "against fp32, which always runs first (default: fp32 only)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="then profile the fp32 round's first N clients under torch.profiler")
    ap.add_argument("--top", type=int, default=15, help="operators listed by --profile")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    from mcfl.data import load
    from mcfl.runner import configure_torch

    configure_torch(device, args.threads)
    sizes = np.random.default_rng(0).integers(args.min_samples, args.max_samples + 1, args.clients)
    print(f"# FEMNIST-scale round: {args.clients} clients, {int(sizes.sum()):,} training samples, "
          f"1 epoch, batch 10\n# {machine(device)}")
    with tempfile.TemporaryDirectory() as tmp:
        store = load(fake_store(Path(tmp) / "femnist", "femnist_cnn", sizes))
        res = {p: measure(store, sizes, args, device, p) for p in args.precision}
        if args.profile:
            profile_round(store, args, device, args.profile)
    rate = lambda o, ex: o[ex][0] / o[ex][1]  # noqa: E731
    for p, o in res.items():
        ratio = rate(o, "batched") / rate(o, "sequential")
        goal = "4 s" if p == "fp32" else "1.5 s"
        print(f"{p}: batched (chunk {o['chunk']}) / sequential clients/s: {ratio:.1f}x (goal >= 40x on an "
              f"H100/H200); full round {o['batched'][1]:.1f} s (goal <= {goal} on an H100/H200)")
    if len(res) > 1:
        base = res["fp32"]
        step = float((base["w"] - base["w0"]).norm())
        print("\nprecision        | ran             | round s | round vs fp32 | seq clients/s | seq vs fp32 "
              "| model vs fp32")
        for p, o in res.items():
            dev = float((o["w"] - base["w"]).norm()) / step if step else float("nan")
            print(f"{p:<16} | {o['ran']:<15} | {o['batched'][1]:7.2f} | "
                  f"{base['batched'][1] / o['batched'][1]:12.2f}x | {rate(o, 'sequential'):13.1f} | "
                  f"{rate(o, 'sequential') / rate(base, 'sequential'):10.2f}x | {dev:.2e}")
        print("(round vs fp32: fp32's round seconds / this one's, > 1 is faster; model vs fp32: "
              "||w - w_fp32|| / ||w_fp32 - w_0|| after the round)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
