"""Choose FedMMD's penalty weight ``lam`` for config/femnist-sample/fedgsp.yaml on TRAINING data only:
for each candidate, train the config's FedMMD run for R rounds and print the global model's
cross-entropy on the whole training split of all writers (the federated objective) every few rounds.

FedMMD's paper gives no weight, and FedGSP's Table 1 gives none either. With the config's first
choice (0.1) seed 0 collapsed to one class (docs/methods/fedgsp.md), so the weight is chosen here:
the candidate with the lowest global training loss at round R, among lam > 0 (lam = 0 is FedAvg,
printed for reference). The test split is not read. Every candidate uses the config's seed, client
stream and start model, so the rows differ only in lam.

    python studies/fedmmd_select.py --lams 0,0.1,0.01,0.001 --rounds 30 --every 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import add_config_args, config_runs, machine, pick_run  # noqa: E402


def train_loss(fed, w: torch.Tensor) -> float:
    """The global model's mean cross-entropy over every training image of every client."""
    rows = torch.arange(len(fed.dev.y["train"]), device=fed.dev.device)
    with torch.no_grad():
        _, losses = fed.trainer.predict(w, rows, split="train", chunk=1024)
    return float(losses.double().mean())


def main(argv=None) -> int:
    from mcfl import algorithms
    from mcfl.federation import build_federation
    from mcfl.trainspec import TrainSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_args(ap)
    ap.add_argument("--run", default="FedMMD", help="run id in the config whose settings are used")
    ap.add_argument("--lams", default="0,0.1,0.01,0.001", help="comma-separated candidate weights")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--every", type=int, default=5, help="rounds between training-loss evaluations")
    a = ap.parse_args(argv)
    try:
        lams = [float(x) for x in a.lams.split(",")]
    except ValueError:
        raise SystemExit(f"--lams: {a.lams!r} is not a comma-separated list of numbers") from None
    if a.rounds < 1 or a.every < 1:
        raise SystemExit("--rounds and --every must be >= 1")
    torch.set_num_threads(a.threads)
    runs, data = config_runs(a.config, a.store)
    run = pick_run(runs, a.run, a.config)
    cls = algorithms.get(run["method"])
    if cls.name != "FedMMD":
        raise SystemExit(f"--run {a.run}: a {cls.name} run; this script chooses FedMMD's weight")
    bad = [lam for lam in lams if not lam >= 0]
    if bad:
        raise SystemExit(f"--lams: weights must be >= 0, got {', '.join(map(str, bad))}")
    marks = sorted({r for r in range(a.every, a.rounds + 1, a.every)} | {a.rounds})
    print(f"# FedMMD's weight chosen on the global training loss, {a.config[-1].name}, run {a.run}, "
          f"seed {run['seed']}, {a.rounds} rounds (test split not read)")
    print(f"# {machine(torch.device('cpu'))}, {a.threads} thread(s)")
    print("| lam | " + " | ".join(f"round {r}" for r in marks) + " | s |")
    print("|---|" + "---|" * (len(marks) + 1))
    final = {}
    for lam in lams:
        fed = build_federation(data, run["model"], TrainSpec.of(run["train"]), run["seed"], torch.device("cpu"))
        algo = cls(fed, cls.Params(**{**run["params"], "lam": lam}))
        state, cells, t0 = algo.init(), [], time.perf_counter()
        for rnd in range(1, a.rounds + 1):
            state, _ = algo.round(state, fed.clients(rnd), rnd)
            if rnd in marks:
                cells.append(train_loss(fed, state.w))
        final[lam] = cells[-1]
        print(f"| {lam:g} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {time.perf_counter() - t0:.0f} |",
              flush=True)
    chosen = [lam for lam in final if lam > 0]
    if chosen:
        best = min(chosen, key=final.get)
        print(f"# lowest global training loss at round {a.rounds} among lam > 0: lam = {best:g} ({final[best]:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
