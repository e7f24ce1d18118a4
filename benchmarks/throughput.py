"""Client-training throughput of the mcfl executors against a conventional per-client PyTorch loop
with a DataLoader, measured in the same process (interleaved repeats; the median is reported).

The baseline is the loop most PyTorch FL code runs for each client (e.g. shaoxiongji/federated-
learning's ``LocalUpdate``, PFLlib's ``clientAVG``): ``copy.deepcopy`` of the global model, a new
``torch.optim.SGD``, a ``DataLoader`` over the client's ``Dataset``, then per batch ``.to(device)``,
``zero_grad``, forward, cross-entropy, ``backward``, ``step``, ``loss.item()``; a copy of the
``state_dict`` is returned. It is given the engine's batch plan through its ``batch_sampler``, so
every method runs the same SGD steps on the same batches from the same start, and must end at the
same weights: the largest absolute weight difference to the baseline is printed.

Data: FEMNIST- / CelebA-shaped random uint8 images (the speed does not depend on pixel values), in
a store like the real ones; clients get uneven sizes drawn uniformly in [min, max].

The batched executor is timed with its low-rank dense layers (``mcfl.executors.LOWRANK``; one row
per ``--chunk`` and ``--lowrank`` value) and, with ``--stacked``, without them (``lowrank=0``).

    python benchmarks/throughput.py                                   # FEMNIST and CelebA CNN, CPU
    python benchmarks/throughput.py --models femnist_cnn --clients 16 --chunk 4 8 16 --stacked
    python benchmarks/throughput.py --device cuda --clients 256       # on a GPU
"""

from __future__ import annotations

import argparse
import copy
import time
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from _common import SHAPES, fake_store, machine, median

from mcfl.data import load
from mcfl.engine import Task
from mcfl.executors import LOWRANK, BatchedTrainer
from mcfl.federation import build_federation


def dataloader_loop(fed, lr: float, rnd: int):
    """The conventional per-client loop; returns {client: state_dict}."""
    global_model = fed.model.module
    dev, data = fed.device, fed.data
    out = {}
    for c in range(fed.n_clients):
        a, b = data.offsets_train[c], data.offsets_train[c + 1]
        x = torch.from_numpy(np.array(data.x_train[a:b])).float() * float(data.x_scale)
        ds = TensorDataset(x, torch.from_numpy(np.array(data.y_train[a:b])))
        plan = fed.trainer.plan(c, rnd) - a                          # the engine's batches
        batches = [r[r >= 0].tolist() for r in plan]
        model = copy.deepcopy(global_model)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        model.train()
        losses = []
        for xb, yb in DataLoader(ds, batch_sampler=batches):
            xb, yb = xb.to(dev), yb.to(dev)
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out[c] = model.state_dict()         # the model is this client's own copy: no clone needed
    return out


def flat(state: dict, fed) -> torch.Tensor:
    return torch.cat([state[n].reshape(-1).float() for n in fed.model.slices])


def engine_pass(trainer, fed, rnd: int):
    """Our executors; results are already the caller's (sequential: a copy; batched: views of the
    chunk's stacked weights), like the baseline's state_dicts."""
    tasks = [Task(c, fed.w0) for c in range(fed.n_clients)]
    return {t.client: r.weights for t, r in trainer.run(tasks, rnd)}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_model(name: str, args, device: torch.device, tmp: Path) -> list[dict]:
    rng = np.random.default_rng(0)
    sizes = rng.integers(args.min_samples, args.max_samples + 1, args.clients)
    store = fake_store(tmp / name, name, sizes)
    train = {"lr": args.lr, "batch_size": args.batch, "local_epochs": args.epochs, "rounds": 1}
    fed = build_federation(load(store), {"name": name}, train, seed=0, device=device)
    w0 = fed.w0.clone()
    if device.type == "cpu":
        print(f"# {name}: {fed.model.n_params:,} parameters", flush=True)
    methods = {"DataLoader loop": lambda r: dataloader_loop(fed, args.lr, r),
               "sequential": lambda r: engine_pass(fed.trainer, fed, r)}
    skipped = None
    variants = [("stacked", 0.0)] if args.stacked else []
    variants += [("low-rank" + (f" r={r:g}" if r != LOWRANK else ""), r) for r in args.lowrank]
    for chunk in args.chunk:
        for kind, lowrank in variants:
            try:
                tr = BatchedTrainer(fed.model, fed.dev, fed.trainer.spec, fed.seed, chunk=chunk,
                                    lowrank=lowrank)
            except ValueError as e:
                skipped = str(e).split(";")[0]
                break
            methods[f"batched {kind} c={chunk or 'auto'}"] = lambda r, tr=tr: engine_pass(tr, fed, r)
    # warm-up pass of each method (not timed) gives the weights to compare
    weights = {}
    for m, fn in methods.items():
        fed.model.load(w0)
        weights[m] = fn(1)
    ref = {c: flat(sd, fed) for c, sd in weights["DataLoader loop"].items()}
    times = {m: [] for m in methods}
    cpu = {m: [] for m in methods}
    for rep in range(args.repeats):                       # interleaved, so load changes hit all
        for m, fn in methods.items():
            fed.model.load(w0)
            sync(device)
            t, c = time.perf_counter(), time.process_time()
            fn(1)
            sync(device)
            times[m].append(time.perf_counter() - t)
            cpu[m].append(time.process_time() - c)
    samples = int(sum(sizes)) * args.epochs
    rows = []
    base, base_cpu = median(times["DataLoader loop"]), median(cpu["DataLoader loop"])
    for m in methods:
        t = median(times[m])
        diff = 0.0 if m == "DataLoader loop" else \
            max(float((weights[m][c] - ref[c]).abs().max()) for c in ref)
        rows.append({"model": name, "method": m, "s": t, "clients/s": args.clients / t,
                     "samples/s": samples / t, "speed-up": base / t,
                     "cpu speed-up": base_cpu / median(cpu[m]), "max|dw|": diff})
    if skipped:
        rows.append({"model": name, "method": "batched", "note": skipped})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["femnist_cnn", "celeba_cnn"], choices=sorted(SHAPES))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--min-samples", type=int, default=20)
    ap.add_argument("--max-samples", type=int, default=60)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--chunk", type=int, nargs="+", default=[None],
                    help="batched executor: clients per chunk (several: one row each; default: automatic)")
    ap.add_argument("--stacked", action="store_true",
                    help="also time the batched executor without low-rank dense layers (lowrank=0)")
    ap.add_argument("--lowrank", type=float, nargs="+", default=[LOWRANK],
                    help="batched executor: history limit of lazy dense layers, as a fraction of "
                         "min(in, out) (mcfl.executors.LOWRANK; several: one row each)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"# client-training throughput, {args.clients} clients x U[{args.min_samples}, "
          f"{args.max_samples}] samples, batch {args.batch}, {args.epochs} epoch(s), median of "
          f"{args.repeats}\n# {machine(device)}")
    print(f"{'model':<12} {'method':<24} {'s/pass':>8} {'clients/s':>10} {'samples/s':>10} "
          f"{'vs DataLoader':>13} {'(CPU time)':>10} {'max|dw|':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for r in bench_model(name, args, device, Path(tmp)):
                if "note" in r:
                    print(f"{r['model']:<12} {r['method']:<24} n/a: {r['note']}")
                    continue
                print(f"{r['model']:<12} {r['method']:<24} {r['s']:8.3f} {r['clients/s']:10.1f} "
                      f"{r['samples/s']:10.0f} {r['speed-up']:12.2f}x {r['cpu speed-up']:9.2f}x "
                      f"{r['max|dw|']:9.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
