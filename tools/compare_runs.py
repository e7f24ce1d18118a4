"""Summaries of finished runs and image-by-image comparisons between them, for the
docs/methods pages: final micro / macro accuracy, the round a run first reaches ``--target``
micro accuracy, its final and lowest test loss, its seconds of training and evaluation (the history's
time columns, summed over resumed segments) and its machine; for a pair, the test images only the first and
only the second gets right and the exact two-sided sign test of those counts.

    python tools/compare_runs.py results-femnist-sample-fedgsp FedYogi/1 FedYogi/1:FedAvg/1

A run is ``RUN/SEED`` (``RUN:SEED`` is a pair's separator, so ``A/1:B/1`` compares A seed 1 with B
seed 1). It is read from ``RESULTS/runs/DATASET/RUN/seedSEED`` or, when not there, from its archive
``archived-runs/RESULTS/DATASET/...`` (tools/archive_runs.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from mcfl.metrics import paired_counts, sign_test_p  # noqa: E402
from mcfl.report.format import machine  # noqa: E402

TIME_COLUMNS = ("local_s", "aggregate_s", "eval_s")


def run_dir(results: Path, dataset: str, spec: str) -> Path:
    run, _, seed = spec.rpartition("/")
    if not run or not seed.isdigit():
        raise SystemExit(f"{spec!r}: expected RUN/SEED, for example FedAvg/0")
    for base in (results / "runs", ROOT / "archived-runs" / results.name):
        d = base / dataset / run / f"seed{seed}"
        if (d / "metrics.json").exists():
            return d
    raise SystemExit(f"{spec}: no finished run (metrics.json) under {results / 'runs' / dataset} "
                     f"or its archive in archived-runs/{results.name}")


def summary(d: Path, target: float) -> str:
    m = json.loads((d / "metrics.json").read_text())
    h = pd.read_csv(d / "history.csv")
    scored = h.dropna(subset=["micro_acc"])
    reached = scored.loc[scored["micro_acc"] >= target, "round"]
    low = scored.loc[scored["test_loss"].idxmin()]
    seconds = sum(h[c].sum() for c in TIME_COLUMNS if c in h)
    f = m["final"]
    return (f"{d.parent.name} {d.name}: micro {100 * f['micro_acc']:.1f}% macro {100 * f['macro_acc']:.1f}%, "
            f"{100 * target:g}% at round {int(reached.min()) if len(reached) else 'never'}, test loss "
            f"{scored['test_loss'].iloc[-1]:.3f} (lowest {low['test_loss']:.3f} at round {int(low['round'])}), "
            f"{seconds:,.0f} s of training and evaluation, {machine(m)}, git {str(m.get('git', '?'))[:7]}")


def pair(a: Path, b: Path) -> str:
    pa, pb = pd.read_csv(a / "predictions.csv"), pd.read_csv(b / "predictions.csv")
    if len(pa) != len(pb) or not np.array_equal(pa["y"].to_numpy(), pb["y"].to_numpy()):
        raise SystemExit(f"{a} and {b}: their predictions.csv are not over the same test images")
    only_a, only_b = paired_counts(pa["y"] == pa["pred"], pb["y"] == pb["pred"])
    return (f"{a.parent.name} {a.name} vs {b.parent.name} {b.name}: {only_a} / {only_b} test images "
            f"only one of them gets right, p = {sign_test_p(only_a, only_b):.2g}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a results directory, e.g. results-femnist-sample-fedgsp")
    ap.add_argument("runs", nargs="+", help="RUN/SEED (a summary) or RUN/SEED:RUN/SEED (a pair)")
    ap.add_argument("--dataset", default="femnist_sample")
    ap.add_argument("--target", type=float, default=0.8, help="micro accuracy to reach (default 0.8)")
    a = ap.parse_args(argv)
    for spec in a.runs:
        if ":" in spec:
            left, right = spec.split(":", 1)
            print(pair(run_dir(a.results, a.dataset, left), run_dir(a.results, a.dataset, right)))
        else:
            print(summary(run_dir(a.results, a.dataset, spec), a.target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
