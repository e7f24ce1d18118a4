"""What a training precision (``train.precision``) does to accuracy on the real writers: each run
trained in tf32 or bf16 against the same (dataset, method, seed) trained in fp32, on the same
machine and the same client stream.

Per method and precision: final micro accuracy (mean ± std over seeds), the paired difference to
fp32, the test images only one of the two classifies correctly (summed over seeds) and the exact
two-sided sign test on them. Reads run directories (a results directory's ``runs/`` or its
archived copy); the fp32 runs are the base config's. Speed is ``femnist_round.py --precision``'s.

    python studies/precision_accuracy.py                        # the archived femnist-sample runs
    python studies/precision_accuracy.py --md docs/results/precision-accuracy.md
    python studies/precision_accuracy.py --fp32 results-femnist-sample --other results-femnist-sample-bf16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import ROOT  # noqa: E402

ARCHIVE = ROOT / "archived-runs"


def runs(results: Path) -> dict[tuple[str, str, int], dict]:
    """(dataset, label, seed) -> the run (``mcfl.io.read_run``: metrics and per-image hits), for
    every finished run under ``results``."""
    from mcfl.io import read_run

    base = results / "runs" if (results / "runs").is_dir() else results
    out = {}
    for m in sorted(base.glob("*/*/seed*/metrics.json")):
        run = read_run(m.parent, predictions=True)
        if "hit" not in run:
            raise SystemExit(f"{m.parent}: no predictions.csv, so no paired comparison")
        out[(run["dataset"], run["label"], int(run["seed"]))] = run
    return out


def compare(fp32: dict, other: dict) -> list[dict]:
    """One row per (dataset, label) of ``other`` with an fp32 twin for every seed it has."""
    from mcfl.metrics import paired_counts, sign_test_p

    rows = []
    for ds, label in sorted({(d, lab) for d, lab, _ in other}):
        seeds = sorted(s for d, lab, s in other if (d, lab) == (ds, label) and (d, lab, s) in fp32)
        if not seeds:
            continue
        acc = [100 * other[(ds, label, s)]["hit"].mean() for s in seeds]
        base = [100 * fp32[(ds, label, s)]["hit"].mean() for s in seeds]
        only = np.sum([paired_counts(other[(ds, label, s)]["hit"], fp32[(ds, label, s)]["hit"]) for s in seeds], axis=0)
        ms = [other[(ds, label, s)] for s in seeds]
        rows.append({"dataset": ds, "method": label, "precision": ms[0].get("precision", "fp32"),
                     "device": ms[0].get("device_name") or ms[0].get("device"), "seeds": len(seeds),
                     "acc": (np.mean(acc), np.std(acc, ddof=1) if len(acc) > 1 else 0.0),
                     "fp32": (np.mean(base), np.std(base, ddof=1) if len(base) > 1 else 0.0),
                     "delta": (np.mean(np.subtract(acc, base)),
                               np.std(np.subtract(acc, base), ddof=1) if len(acc) > 1 else 0.0),
                     "only": (int(only[0]), int(only[1])), "p": sign_test_p(int(only[0]), int(only[1]))})
    return rows


def table(rows: list[dict]) -> str:
    pm = lambda v: f"{v[0]:.1f} ± {v[1]:.1f}"  # noqa: E731
    p = lambda x: "<0.001" if x < 1e-3 else f"{x:.2g}"  # noqa: E731
    out = ["| method | precision | micro acc | same runs in fp32 | Δ vs fp32 | images only this / only fp32 "
           "| sign test p | seeds | machine |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['method']} | {r['precision']} | {pm(r['acc'])} | {pm(r['fp32'])} | {r['delta'][0]:+.1f} ± "
                   f"{r['delta'][1]:.1f} | {r['only'][0]} / {r['only'][1]} | {p(r['p'])} | {r['seeds']} | "
                   f"{r['device']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fp32", type=Path, default=ARCHIVE / "results-femnist-sample",
                    help="results directory (or its archived copy) of the fp32 runs")
    ap.add_argument("--other", type=Path, nargs="+",
                    default=[ARCHIVE / "results-femnist-sample-tf32", ARCHIVE / "results-femnist-sample-bf16"],
                    help="results directories of the runs in another precision")
    ap.add_argument("--md", type=Path, help="also write the table as Markdown to this file")
    args = ap.parse_args(argv)
    fp32 = runs(args.fp32)
    rows = [r for other in args.other for r in compare(fp32, runs(other))]
    if not rows:
        raise SystemExit(f"no run of {', '.join(map(str, args.other))} has an fp32 twin in {args.fp32}")
    text = table(rows)
    print(text, end="")
    if args.md:
        args.md.write_text("Final micro accuracy in percent over the seeds; Δ paired by seed against the same "
                           "run in fp32 (same machine, same client stream); the sign test counts the test "
                           "images only one of the two classifies correctly (summed over seeds; exact "
                           "two-sided binomial). Written by `studies/precision_accuracy.py`.\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
