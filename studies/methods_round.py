"""Seconds per round of every method of FeSEM's Table 2 (config/paper-femnist.yaml) and FedGSP's
Table 1 (config/paper-fedgsp-femnist.yaml) on real FEMNIST writers, under the sequential and the
batched executor, and each method's ratio to FedAvg's.

Every method gets the same training settings and hence the same clients each round (the LEAF CNN,
``--clients`` a round, 1 local epoch, ``--batch`` 10, lr 0.05; the configs' per-method ``train``
overrides, FeSEM's ``local_steps: 1`` and the GSP methods' ``clients_per_round: null``, are
dropped), so the rows compare what each method's round costs. Each method runs side by side with FedAvg, both
under both executors, their rounds interleaved (round r of the four runs, then round r + 1), so that
load changes on a shared machine hit the four alike and the ratios compare like with like; the first ``--warmup`` rounds are not timed; the figure is the
median. Initialisation (FeSEM's k-means centres, ...) and evaluation are not timed. The last two
columns but one split the batched round: seconds inside the local trainer (``mcfl.timing.LocalClock``:
local SGD and gradients) and the rest (the server's work, and client-side inference outside local
training such as HypoCluster's choice of hypothesis). The last is the largest difference between
the two executors' final states (models, centres, server moments): float rounding only.

    python studies/methods_round.py --leaf LEAF_DIR     # LEAF's train/ and test/ JSON
    python studies/methods_round.py --store /tmp/femnist-store --methods FedAvg,FeSEM-K3 --rounds 3

``--device cuda`` times the GPU; ``--fallback stacked`` forces the batched executor's stacked path
where the device would pick another (on a CPU, the LEAF CNN trains custom losses one client at a
time), and ``--model`` takes another model (``'{"name": "femnist_cnn", "hidden": 248}'``).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import ROOT, machine  # noqa: E402

CONFIGS = ("paper-femnist.yaml", "paper-fedgsp-femnist.yaml")


def leaf_store(leaf: Path, out: Path) -> Path:
    """Import a LEAF directory (``train/``, ``test/``; ``.json`` or ``.json.gz``) into a store."""
    from mcfl.data.leaf.leafjson import import_leaf

    plain = out.with_suffix(".json")
    for split in ("train", "test"):
        (plain / split).mkdir(parents=True)
        for f in sorted((leaf / split).iterdir()):
            if f.name.endswith(".json.gz"):
                with gzip.open(f, "rb") as src, open(plain / split / f.name[:-3], "wb") as dst:
                    shutil.copyfileobj(src, dst)
            elif f.suffix == ".json":
                shutil.copy(f, plain / split / f.name)
    return import_leaf(plain, out)


def methods() -> list[tuple[str, str, dict]]:
    """(label, method, params) of every method of both tables, each once (FedAvg first)."""
    from mcfl.config import expand_runs, load_config

    out = {}
    for name in CONFIGS:
        for run in expand_runs(load_config(ROOT / "config" / name)):
            out.setdefault(run["run_id"], (run["run_id"], run["method"], run["params"]))
    return sorted(out.values(), key=lambda m: m[0] != "FedAvg")


def time_methods(todo: list[tuple[str, dict]], data, model: dict, train: dict, seed: int, rounds: int,
                 warmup: int, device: str = "cpu", fallback: str | None = None) -> list[dict[str, float]]:
    """Median seconds per round of each (method, params) under each executor, all their rounds
    interleaved (round r of every run before round r + 1 of any)."""
    import mcfl.federation
    from mcfl import algorithms
    from mcfl.executors import BatchedTrainer, make_trainer
    from mcfl.federation import build_federation
    from mcfl.timing import LocalClock

    if fallback:            # the batched executor with the given fallback path
        mcfl.federation.make_trainer = lambda ex, *a, chunk=None: (
            BatchedTrainer(*a, chunk=chunk, fallback=fallback) if ex == "batched" else make_trainer(ex, *a, chunk=chunk))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    runs = []
    for method, params in todo:
        cls = algorithms.get(method)
        runs.append({})
        for ex in ("sequential", "batched"):
            fed = build_federation(data, model, {**train, "executor": ex}, seed, device)
            algo = cls(fed, cls.Params(**params))
            # the trainer the algorithm trains with (FedCG and FedFusion build their own), as the runner
            runs[-1][ex] = [algo, algo.init(), fed, [], LocalClock(algo.fed.trainer), []]
    for r in range(1, warmup + rounds + 1):
        for run in (run for pair in runs for run in pair.values()):
            algo, state, fed, wall, clock, local = run
            sync()
            clock.reset()
            t = time.perf_counter()
            run[1], _ = algo.round(state, fed.clients(r), r)
            sync()
            if r > warmup:
                wall.append(time.perf_counter() - t)
                local.append(clock.seconds)
    return [{**{ex: statistics.median(run[3]) for ex, run in pair.items()},
             "batched_local": statistics.median(pair["batched"][5]),
             "diff": state_diff(*(run[0].state_dict(run[1]) for run in pair.values()))} for pair in runs]


def state_diff(a: dict, b: dict) -> float:
    """Largest absolute difference between two runs' final states (their float tensors: models,
    centres, server moments): the executors agree up to float rounding."""
    return max((float((torch.as_tensor(v) - torch.as_tensor(b[k])).abs().max()) for k, v in a.items()
                if torch.is_tensor(v) and v.is_floating_point() and v.numel()), default=0.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--leaf", type=Path, help="LEAF data directory (train/, test/), imported first")
    src.add_argument("--store", type=Path, help="an imported store (mcfl import-leaf)")
    ap.add_argument("--methods", help="comma-separated run ids (default: every method of both tables)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per method (median reported)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--clients", type=int, default=10, help="clients per round")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=10, help="minibatch size (FedGSP's Table 1: 5)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default='{"name": "femnist_cnn"}', help="the model, as JSON")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fallback", choices=("sequential", "stacked"),
                    help="the batched executor's path for what cannot go low-rank (default: the device's faster)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from mcfl.data import load

    todo = methods()
    if args.methods:
        wanted = args.methods.split(",")
        todo = [m for m in todo if m[0] in wanted or m[0] == "FedAvg"]
    import json

    model = json.loads(args.model)
    train = {"rounds": args.warmup + args.rounds, "clients_per_round": args.clients, "lr": args.lr,
             "batch_size": args.batch, "local_epochs": 1}
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or leaf_store(args.leaf, Path(tmp) / "store")
        data = load(store)
        print(f"# seconds per round, {data.n_clients} clients ({store.name}), model {args.model}, "
              f"{args.clients} clients a round, 1 epoch, batch {args.batch}, lr {args.lr}; median of {args.rounds} "
              f"rounds after {args.warmup} warm-up, executors interleaved; batched fallback "
              f"{args.fallback or 'the device default'}\n# {machine(torch.device(args.device))}")
        print(f"| {'method':<14} | {'sequential s':>12} | {'batched s':>9} | {'seq / batched':>13} | "
              f"{'seq / FedAvg seq':>16} | {'batched / FedAvg batched':>24} | {'batched: local s':>16} | "
              f"{'batched: rest s':>15} | {'seq vs batched diff':>19} |")
        print(f"|{'-' * 16}|{'-' * 14}|{'-' * 11}|{'-' * 15}|{'-' * 18}|{'-' * 26}|{'-' * 18}|{'-' * 17}|{'-' * 21}|",
              flush=True)
        fedavg = todo[0][1:]
        for label, method, params in todo:         # each with FedAvg, interleaved: the ratios
            pair = [fedavg] if method == "FedAvg" else [fedavg, (method, params)]    # see the same load
            times = time_methods(pair, data, model, train, args.seed, args.rounds, args.warmup, args.device,
                                 args.fallback)
            base, t = times[0], times[-1]
            print(f"| {label:<14} | {t['sequential']:12.2f} | {t['batched']:9.2f} | "
                  f"{t['sequential'] / t['batched']:12.2f}x | {t['sequential'] / base['sequential']:15.2f}x | "
                  f"{t['batched'] / base['batched']:23.2f}x | {t['batched_local']:16.2f} | "
                  f"{t['batched'] - t['batched_local']:15.2f} | {t['diff']:19.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
