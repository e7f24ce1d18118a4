"""Keep a study's finished runs in git: copy each run's small outputs (metrics.json, history.csv,
predictions.csv, assignments.csv; not state.pt, 76 MB for three FEMNIST CNNs) from a results
directory to ``archived-runs/<results dir>/<dataset>/<run>/seed<s>/`` (the top-level folder whose
README lists each study's config and published tables).

Results directories stay out of git, so a long study's finished runs would otherwise live only on
the machine that made them. The archived runs are what the reports read:
``mcfl report-protocols --out OUT RUN_DIR ...`` and ``mcfl report-writers`` take run directories,
so paired comparisons with archived runs need no retraining.

    python tools/archive_runs.py results-femnist-sample [results-femnist-sample-h248 ...]

On a new machine, ``--restore`` copies a study's archived runs back into its results directory
(runs already there are left alone), so its reports can be remade by the DAG without retraining:
restored runs have no state.pt, so let Snakemake use only the report rules, which then take the
restored metrics.json files as given, e.g.

    python tools/archive_runs.py --restore results-femnist-sample-fedgsp
    snakemake results-femnist-sample-fedgsp/docs/results/femnist-sample-fedgsp.md --cores 1 \
        --configfile config/femnist-sample.yaml config/femnist-sample/fedgsp.yaml --allowed-rules prepare fedgsp_cpd fedgsp_table fedgsp_publish
    make docs-results        # the page and its figures into docs/

To continue a study on a new machine, train only what neither the archive nor the results directory
holds: ``--pending CONFIG [OVERLAY ...]`` prints the ``metrics.json`` target of every such run of the
config, and exits with 1 (as grep does) when there is none; Snakemake orders them (its priorities:
longest first). Without targets Snakemake would train the archived runs again (they have no
state.pt), hence the guard:

    c="config/femnist-sample.yaml config/femnist-sample/authors.yaml"
    t=$(.venv/bin/python tools/archive_runs.py --pending $c) && \
        .venv/bin/snakemake $t --cores 2 --rerun-incomplete --configfile $c
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = "archived-runs"   # the top-level folder of archived runs, under ROOT
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


def restore(kept: Path, results: Path) -> list[Path]:
    """Copy the archived runs under ``kept`` (``archived-runs/<results dir>``) back into
    ``results/runs/``; a run directory that already exists there is skipped, never overwritten.
    Each run is copied beside its place and renamed into it, so an interrupted restore leaves no
    half-copied run that a later restore would skip."""
    restored = []
    for metrics in sorted(kept.glob("*/*/seed*/metrics.json")):
        out = results / "runs" / metrics.parent.relative_to(kept)
        if out.exists():
            continue
        tmp = out.with_name(out.name + ".restoring")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(metrics.parent, tmp)
        tmp.rename(out)
        restored.append(out)
    return restored


def pending(configs: list[str]) -> list[str]:
    """The ``metrics.json`` targets of the config's runs that neither its results directory nor the
    archive (``archived-runs/<results dir>/``) holds finished, in config order."""
    from mcfl.config import read_configs, validate
    from mcfl.plan import Plan

    plan = Plan(validate(read_configs(configs)))
    kept = ROOT / ARCHIVE / Path(plan.results).name
    out = []
    for run in plan.configured.values():
        d = Path(plan.dir_of(run))
        if not (d / "metrics.json").is_file() and not (kept / d.relative_to(Path(plan.results) / "runs")
                                                        / "metrics.json").is_file():
            out.append(f"{d.as_posix()}/metrics.json")
    return out


def main(argv: list[str]) -> int:
    if not argv or argv in (["--restore"], ["--pending"]):
        print(__doc__)
        return 2
    if argv[0] == "--pending":
        todo = pending(argv[1:])
        if not todo:
            print("nothing to train: every run of the config is finished or archived", file=sys.stderr)
            return 1
        print("\n".join(todo))
        return 0
    if argv[0] == "--restore":
        for d in argv[1:]:
            results = Path(d)
            kept = ROOT / ARCHIVE / results.name
            if not kept.is_dir():
                print(f"{kept}: no archived runs for {results.name}", file=sys.stderr)
                return 1
            for out in restore(kept, results):
                print(out)
        return 0
    for d in argv:
        results = Path(d)
        if not (results / "runs").is_dir():
            print(f"{results}: no runs/ folder (not a results directory)", file=sys.stderr)
            return 1
        for out in archive(results, ROOT / ARCHIVE):
            print(out.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
