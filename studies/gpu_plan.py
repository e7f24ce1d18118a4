"""How long the real-writer studies and FeSEM's Table 2 on full FEMNIST take on one GPU, estimated
from the GPU runs behind the published tables (their ``metrics.json``: device name, rounds and the
seconds spent in local training, evaluation and aggregation).

A run is priced from the archived runs of its label (FedAvg, FeSEM(3) ...): the one whose round
did the nearest amount of local work, scaled linearly,

    local training per round  = (its local seconds per round) x (client steps) / (its client steps)
    one evaluation            = (its seconds per evaluation) x (test samples) / (its test samples)

where a round's client steps are its clients (``clients_per_round``, ``clients_per_cluster`` x K,
or every client) times each client's local SGD steps (``local_steps``, or ``local_epochs`` passes
over the mean client's training samples), as ``mcfl check-config`` counts them. A label without an
archived GPU run takes a least-squares fit over all of them (``a + b x client steps`` a round;
``d x test samples`` an evaluation), and the table says how many runs that was. One run on the GPU
at a time, the runs' own (batched) executor; start-up, data preparation, centre initialisation and
reports are left out.

    python studies/gpu_plan.py                                     # the archived runs and studies
    python studies/gpu_plan.py --md docs/results/gpu-plan.md       # also as the Performance page's table
    python studies/gpu_plan.py --runs RESULTS_DIR --study paper-femnist=config/paper-femnist.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import ROOT  # noqa: E402

from mcfl import cost
from mcfl.cost import workload
from mcfl.config import load_config, expand_runs
from mcfl.trainspec import TrainSpec

#: the studies priced by default: name -> config files merged in order
STUDIES = {
    "femnist-sample (Table 2, standard)": ["config/femnist-sample.yaml"],
    "femnist-sample-paper": ["config/femnist-sample.yaml", "config/femnist-sample/paper.yaml"],
    "femnist-sample-authors": ["config/femnist-sample.yaml", "config/femnist-sample/authors.yaml"],
    "femnist-sample-fedgsp": ["config/femnist-sample.yaml", "config/femnist-sample/fedgsp.yaml"],
    "femnist-sample-fedcg": ["config/femnist-sample.yaml", "config/femnist-sample/fedcg.yaml"],
    "FeSEM Table 2, full FEMNIST (paper-femnist)": ["config/paper-femnist.yaml"],
}
NOWHERE = Path("/nonexistent-store")      # size every dataset from its source, not a local store


def work(run: dict, size: workload.DataSize) -> tuple[int, int, int]:
    """(client steps per round, evaluations, test samples per evaluation) of a run."""
    train = TrainSpec.of(run["train"])
    steps = workload.round_clients(run, size.n_clients) * workload.local_steps(train, size.n_train / size.n_clients)
    return steps, workload.evaluations(train.rounds, train.eval_every), size.n_test


def archived(root: Path) -> list[dict]:
    """Every GPU run under ``root`` with the work it did."""
    out = []
    for f in sorted(root.rglob("metrics.json")):
        m = json.loads(f.read_text())
        if m.get("device") != "cuda" or "time_s" not in m:
            continue
        run = m["config"]
        ds = {"model": run["model"], "prepare": run["data"], "train": run["train"]}
        size = workload.data_size(ds, NOWHERE, NOWHERE)
        steps, evals, n_test = work(run, size)
        out.append({"gpu": m.get("device_name", "cuda"), "label": m["label"], "rounds": m["rounds"],
                    "steps": steps, "evals": evals, "n_test": n_test,
                    "local_s": m["time_s"]["local"] / m["rounds"],
                    "eval_s": m["time_s"]["eval"] / max(evals, 1)})
    return out


def fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares y = a + b x with a, b >= 0."""
    A = np.stack([np.ones_like(x), x], 1)
    a, b = np.linalg.lstsq(A, y, rcond=None)[0]
    if a < 0:
        a, b = 0.0, float((x @ y) / (x @ x))
    return float(a), float(max(b, 0.0))


def price(paths: list[str], model: dict, by_label: dict[str, list[dict]]) -> tuple[int, int, float]:
    """(runs, runs priced by the fit, seconds) of a config."""
    cfg = load_config(*[ROOT / p for p in paths])
    sizes = {d: workload.data_size(ds, NOWHERE, NOWHERE) for d, ds in cfg["datasets"].items()}
    total, fitted, runs = 0.0, 0, expand_runs(cfg)
    for run in runs:
        steps, evals, n_test = work(run, sizes[run["dataset"]])
        rounds = run["train"]["rounds"]
        same = by_label.get(run["label"])
        if same:
            ref = min(same, key=lambda r: abs(np.log(max(steps, 1) / max(r["steps"], 1))))
            local = ref["local_s"] * steps / max(ref["steps"], 1)
            one_eval = ref["eval_s"] * n_test / max(ref["n_test"], 1)
        else:
            fitted += 1
            local, one_eval = model["a"] + model["b"] * steps, model["d"] * n_test
        total += rounds * local + evals * one_eval
    return len(runs), fitted, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "archived-runs")
    ap.add_argument("--study", action="append", default=[], metavar="NAME=A.yaml[,B.yaml]",
                    help="price this config (base, then overlays) instead of the default studies")
    ap.add_argument("--md", type=Path, help="also write the study table as Markdown to this file")
    args = ap.parse_args(argv)
    runs = archived(args.runs)
    if not runs:
        print(f"no GPU runs (device cuda, with time_s) under {args.runs}")
        return 1
    gpus = sorted({r["gpu"] for r in runs})
    x = np.array([r["steps"] for r in runs], float)
    y = np.array([r["local_s"] for r in runs], float)
    a, b = fit(x, y)
    e = np.array([r["eval_s"] for r in runs], float)
    d = float((np.array([r["n_test"] for r in runs], float) @ e) / sum(r["n_test"] ** 2 for r in runs))
    err = np.abs(a + b * x - y) / y
    print(f"# {len(runs)} GPU runs under {args.runs} ({', '.join(gpus)})")
    print(f"local training per round = {a:.3f} s + {b * 1e3:.3f} ms x client steps "
          f"(median error {np.median(err):.0%}, largest {err.max():.0%})")
    print(f"one evaluation           = {d * 1e6:.3f} us x test samples (observed {e.min():.2f}-{e.max():.2f} s)")
    print("(the fit prices only labels without an archived GPU run)")
    model = {"a": a, "b": b, "d": d}
    by_label: dict[str, list[dict]] = {}
    for r in runs:
        by_label.setdefault(r["label"], []).append(r)
    studies = dict(s.split("=", 1) for s in args.study) if args.study else None
    studies = {k: v.split(",") for k, v in studies.items()} if studies else STUDIES
    print(f"\n{'study':<46} {'runs':>5} {'by the fit':>10} {'one run at a time':>18}")
    md = ["| study | config | runs | priced by the fit | one run at a time |", "|---|---|---|---|---|"]
    for name, paths in studies.items():
        n, fitted, s = price(paths, model, by_label)
        print(f"{name:<46} {n:>5} {fitted:>10} {cost.duration(s):>18}")
        md.append(f"| {name} | {' + '.join(f'`{p}`' for p in paths)} | {n} | {fitted} | {cost.duration(s)} |")
    if args.md:
        md.append(f"\n*Written by `studies/gpu_plan.py --md` from {len(runs)} archived GPU runs "
                  f"({', '.join(gpus)}): each run priced from an archived run of its label, scaled by "
                  f"its local work and test samples; labels without one by the fit, whose median "
                  f"error over the archived runs is {np.median(err):.0%}.*")
        args.md.write_text("\n".join(md) + "\n")
        print(f"-> {args.md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
