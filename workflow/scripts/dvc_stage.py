"""Run one `dvc.yaml` stage: Snakemake on the config that `params.yaml` names.

DVC calls it (``dvc repro``) with the three values of `params.yaml`: the config, and the two folders
DVC tracks as the stages' outputs. They must be the folders that config writes (its ``data_dir:`` and
``results:`` keys, with their defaults), or DVC would record one folder while Snakemake fills
another; a mismatch stops here, before anything runs, with the values to set. Then it starts
Snakemake from this interpreter's environment with the given targets, on ``$MCFL_CORES`` cores
(``make reproduce CORES=N`` sets it; every core when unset).

Usage: python workflow/scripts/dvc_stage.py CONFIG DATA_DIR RESULTS [TARGET ...]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    config, data_dir, results, *targets = argv
    try:
        from mcfl.config import ConfigError, load_config
    except ImportError:
        print(f"{sys.executable}: the mcfl package is not installed here: run `make setup` first", file=sys.stderr)
        return 1

    try:
        cfg = load_config(config)
    except ConfigError as e:
        print(f"params.yaml: config: {e}", file=sys.stderr)
        return 1
    wrong = {k: (given, cfg[k]) for k, given in (("data_dir", data_dir), ("results", results))
             if Path(given) != Path(cfg[k])}
    if wrong:
        says = ", ".join(f"{k} is {given!r} but {config} writes {actual!r}" for k, (given, actual) in wrong.items())
        sets = " ".join(f"-S {k}={actual}" for k, (_, actual) in wrong.items())
        print(f"params.yaml: {says}; set them together: dvc exp run -S config={config} {sets}", file=sys.stderr)
        return 1
    # Snakemake's rules call the `mcfl` command: this interpreter's folder first on PATH, so the jobs
    # find the environment's scripts without an activated environment.
    bindir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    # --quiet rules: the progress, the job counts and any failure, without each job's details (the
    # report and track jobs list every run's files: lines of thousands of characters); each job's own
    # log is in the config's log folder, and a plain `snakemake` shows the details
    args = [*targets, "--cores", os.environ.get("MCFL_CORES") or "all", "--quiet", "rules",
            "--configfile", config]  # --configfile takes all that follows
    print("+ snakemake " + " ".join(args), flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "snakemake", *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
