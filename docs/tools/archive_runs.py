"""Keep a study's finished runs in git: copy each run's small outputs (metrics.json, history.csv,
predictions.csv, assignments.csv; not state.pt, 76 MB for three FEMNIST CNNs) from a results
directory to ``docs/results/runs/<results dir>/<dataset>/<run>/seed<s>/``.

Results directories stay out of git and a session's machine is not kept, so a long study's
finished runs would otherwise be lost with it. The archived runs are what the reports read:
``mcfl report-protocols --out OUT RUN_DIR ...`` and ``mcfl report-writers`` take run directories,
so paired comparisons with archived runs need no retraining.

    python docs/tools/archive_runs.py results-femnist-sample [results-femnist-sample-h248 ...]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ("metrics.json", "history.csv", "predictions.csv", "assignments.csv")


def archive(results: Path, dest: Path) -> list[Path]:
    """Copy the small outputs of every finished run (one with a metrics.json) under ``results``."""
    copied = []
    for metrics in sorted(results.glob("runs/*/*/seed*/metrics.json")):
        run = metrics.parent
        out = dest / results.name / run.relative_to(results / "runs")
        out.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            if (run / name).is_file():
                shutil.copyfile(run / name, out / name)
        copied.append(out)
    return copied


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for d in argv:
        results = Path(d)
        if not (results / "runs").is_dir():
            print(f"{results}: no runs/ folder (not a results directory)", file=sys.stderr)
            return 1
        for out in archive(results, ROOT / "docs" / "results" / "runs"):
            print(out.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
