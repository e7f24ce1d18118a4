"""The convolution forms of the batched executor (:mod:`mcfl.models.conv`: PyTorch's grouped
convolution against one dense Toeplitz product per client) timed side by side, and a FedAvg round
on the 105 real FEMNIST writers of the embedded ``femnist_sample`` (LEAF CNN, hidden 2048, one
local epoch, batch 10, lr 0.1) with the batched executor against a plain PyTorch loop (one
``nn.Module`` and ``torch.optim.SGD`` per writer, then the weighted mean), with the fraction of the
CPU's fp32 peak each reaches.

Every figure is the least of ``--reps`` repeats with the contenders interleaved in one process (on
a shared machine other load only ever adds time), so the ratios are what to read. Run it once
natively and once with the kernels of an AVX2 CPU, ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2`` (the capability PyTorch runs is printed):

    python benchmarks/conv_forms_round.py --out docs/results/avx2-forms.md          # a few minutes
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/conv_forms_round.py \\
        --out docs/results/avx2-forms.md --append
    python benchmarks/conv_forms_round.py --quick                                   # about a minute

Fraction of peak: the round's floating-point operations are counted from the model's shapes
(:func:`mcfl.executors.forward_macs`: multiply-adds of the convolutions and dense layers in one
forward pass of a sample; a training step counted as 3 forward passes, forward, input gradient and
weight gradient; 2 FLOPs a multiply-add) times the samples trained, over the round's seconds. The
peak is cores x GHz x FLOPs per cycle, with FLOPs per cycle = fp32 lanes of the vector width
PyTorch's kernels use (8 for AVX2, 16 for AVX512) x 2 (a fused multiply-add) x ``--fma-units``
(2 on current x86 cores; AMD's Zen 4 runs AVX512 as two 256-bit halves, so there its AVX512 peak is
its AVX2 one: pass ``--fma-units 1`` to count it so), GHz from ``--ghz`` or else the CPU's current
clock in /proc/cpuinfo, cores = the torch threads used.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _common import ROOT, machine

LANES = {"AVX512": 16, "AVX2": 8, "DEFAULT": 4}


def vector_extensions() -> str:
    """The CPU's vector extensions (from /proc/cpuinfo's flags) and the kernels PyTorch runs."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    have = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"CPU flags {' '.join(have) or 'unknown'}; PyTorch kernels {torch.backends.cpu.get_cpu_capability()}"


def cpu_ghz() -> float:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":", 1)[1]) / 1000
    except (OSError, ValueError):
        pass
    return float("nan")


def peak_gflops(threads: int, ghz: float, fma_units: int) -> float:
    lanes = LANES.get(torch.backends.cpu.get_cpu_capability(), 4)
    return threads * ghz * lanes * 2 * fma_units


# ----------------------------------------------------------------------------------- conv forms
def digits_step_forms(clients: int, batch: int, reps: int) -> list[tuple[str, float, str]]:
    """The digits CNN's stacked training step (``clients`` x ``batch``, vmap) in each form: least
    seconds, and the largest gradient difference to the grouped form."""
    from mcfl.executors.forms import step_seconds
    from mcfl.models import build
    from mcfl.models.conv import FORMS, conv_form
    from torch.func import functional_call, vmap

    model = build("digits_cnn", (1, 8, 8), 10)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(clients, batch, 1, 8, 8, generator=g), torch.randint(0, 10, (clients, batch), generator=g)
    best = {f: float("inf") for f in FORMS}
    for r in range(reps + 1):
        for f in FORMS:
            s = step_seconds(model, f, x, y)
            best[f] = min(best[f], s) if r else best[f]

    def grads(form):
        params = {n: p.detach().expand(clients, *p.shape).clone().requires_grad_() for n, p in model.named_parameters()}
        with conv_form(model, form):
            logits = vmap(lambda p, xb: functional_call(model, p, (xb,)))(params, x)
            return torch.autograd.grad(F.cross_entropy(logits.flatten(0, 1), y.flatten()), list(params.values()))

    ref = grads("grouped")
    out = []
    for f in FORMS:
        diff = max(float((a - b).abs().max()) for a, b in zip(grads(f), ref))
        out.append((f, best[f], "bitwise equal" if diff == 0 else f"max diff {diff:.1e}"))
    return out


# ----------------------------------------------------------------------------------- the round
def real_writers(store: Path):
    """The embedded 105 FEMNIST writers, prepared as ``config/femnist-sample.yaml`` does."""
    from mcfl.data import load, prepare

    if not store.exists():
        prepare("femnist_sample", store, run="leaf-torch")
    return load(store)


def plain_round(model0: torch.nn.Module, data, clients, lr: float, batch: int, seed: int) -> torch.Tensor:
    """FedAvg's round as a plain PyTorch loop: per writer a copy of the global model, one epoch of
    SGD over its shuffled samples, then the mean of the models weighted by samples. Returns the
    flat averaged weights."""
    import copy

    total, n_all = None, 0
    for c in clients:
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        rows = data.client_rows(int(c))
        order = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed + int(c)))]
        for a in range(0, len(order), batch):
            r = order[a:a + batch]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(data.inputs(r)), data.y["train"][r]).backward()
            opt.step()
        w = torch.nn.utils.parameters_to_vector(model.parameters()).detach() * len(rows)
        total = w if total is None else total + w
        n_all += len(rows)
    return total / n_all


def round_side_by_side(store: Path, writers: int, reps: int, threads: int, fma_units: int, ghz: float) -> dict:
    """The batched executor's FedAvg round and the plain loop's on the first ``writers`` writers,
    interleaved, least of ``reps``; FLOPs and fraction of peak of each."""
    from mcfl.algorithms.fedavg import FedAvg
    from mcfl.executors import forward_macs
    from mcfl.federation import build_federation

    data_store = real_writers(store)
    train = {"lr": 0.1, "batch_size": 10, "local_epochs": 1, "rounds": 1, "executor": "batched"}
    fed = build_federation(data_store, {"name": "femnist_cnn", "hidden": 2048}, train, 0, torch.device("cpu"))
    data = fed.trainer.data                                     # the store's arrays as tensors
    clients = np.arange(min(writers, data.n_clients))
    algo = FedAvg(fed, FedAvg.Params())
    state = algo.init()
    model0 = fed.model.module
    samples = int(data.n_train[clients].sum())
    macs = forward_macs(model0, data.inputs(torch.tensor([0])))
    flops = 2 * 3 * macs * samples
    best = {"batched": float("inf"), "plain": float("inf")}
    algo.round(state, clients[:4], 1)                                             # warm-up
    plain_round(model0, data, clients[:2], 0.1, 10, 0)
    for _ in range(reps):
        t = time.perf_counter()
        algo.round(state, clients, 1)
        best["batched"] = min(best["batched"], time.perf_counter() - t)
        t = time.perf_counter()
        plain_round(model0, data, clients, 0.1, 10, 0)
        best["plain"] = min(best["plain"], time.perf_counter() - t)
    peak = peak_gflops(threads, ghz, fma_units)
    return {"writers": len(clients), "samples": samples, "macs": macs, "flops": flops, "peak": peak,
            "ghz": ghz, "form": fed.trainer.conv_form, **{k: v for k, v in best.items()}}


def report(args) -> str:
    from mcfl.executors.forms import PROBE_MARGIN

    env = "".join(f"{k}={os.environ[k]} " for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ)
    lines = [f"Output of `{env}python benchmarks/conv_forms_round.py{args.command}`, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC:", "", "```text",
             f"# {machine(torch.device('cpu'))}", f"# {vector_extensions()}"]
    forms = digits_step_forms(args.clients, 10, args.reps)
    base = forms[0][1]
    lines += [f"digits CNN stacked step, {args.clients} clients x batch 10 (vmap), least of {args.reps}:",
              "| form | ms a step | vs grouped | gradients vs grouped |", "|---|---|---|---|"]
    lines += [f"| {f} | {s * 1e3:.1f} | {base / s:.2f}x | {d} |" for f, s, d in forms]
    kept = "toeplitz" if base >= PROBE_MARGIN * forms[1][1] else "grouped"
    lines.append(f"(the start-up choice takes the Toeplitz form only at >= {PROBE_MARGIN}x: here {kept})")
    r = round_side_by_side(args.store, args.writers, args.round_reps, torch.get_num_threads(), args.fma_units,
                           args.ghz or cpu_ghz())
    lines += ["", f"FedAvg round, {r['writers']} real FEMNIST writers ({r['samples']:,} samples, LEAF CNN hidden "
              f"2048, 1 epoch, batch 10), least of {args.round_reps}; {r['macs'] / 1e6:.1f}M multiply-adds a "
              f"sample forward, {r['flops'] / 1e9:.1f} GFLOP a round (3 passes); peak {r['peak']:.0f} GFLOP/s "
              f"({torch.get_num_threads()} thread(s) x {r['ghz']:.2f} GHz x "
              f"{LANES.get(torch.backends.cpu.get_cpu_capability(), 4)} lanes x 2 x {args.fma_units} FMA units):",
              "| loop | round s | vs plain | GFLOP/s | of fp32 peak |", "|---|---|---|---|---|"]
    for k in ("plain", "batched"):
        gf = r["flops"] / r[k] / 1e9
        lines.append(f"| {k}{' (' + r['form'] + ' convolutions)' if k == 'batched' else ''} | {r[k]:.2f} | "
                     f"{r['plain'] / r[k]:.2f}x | {gf:.1f} | {100 * gf / r['peak']:.0f}% |")
    return "\n".join(lines + ["```", ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer clients, writers and repeats: about a minute")
    ap.add_argument("--clients", type=int, default=100, help="stacked clients of the digits step")
    ap.add_argument("--reps", type=int, default=20, help="repeats of the digits step")
    ap.add_argument("--writers", type=int, default=105, help="real writers in the round (at most 105)")
    ap.add_argument("--round-reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fma-units", type=int, default=2, help="FMA pipes a core (fraction of peak)")
    ap.add_argument("--ghz", type=float, default=None, help="clock for the peak (default: /proc/cpuinfo's)")
    ap.add_argument("--store", type=Path, default=ROOT / "data" / "femnist_sample")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures to this Markdown file")
    ap.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    args = ap.parse_args(argv)
    words = list(sys.argv[1:] if argv is None else argv)
    for flag, n in (("--out", 2), ("--append", 1)):          # where it was written: not part of the figures
        while flag in words:
            i = words.index(flag)
            del words[i:i + n]
    args.command = "".join(f" {w}" for w in words)
    if args.quick:
        args.reps, args.writers, args.round_reps = 5, 21, 1
    torch.set_num_threads(args.threads)
    from mcfl.runner import configure_torch

    configure_torch(torch.device("cpu"), args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.store.parent.is_dir():
            args.store = Path(tmp) / "femnist_sample"
        text = report(args)
    print(text)
    if args.out:
        old = args.out.read_text() if args.append and args.out.exists() else ""
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(old + ("\n" if old else "") + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
