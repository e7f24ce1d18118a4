"""``make reproduce``: set up ``.venv``, run the DAG through ``dvc repro``, and write what it took.

Runs ``make setup`` and then ``.venv/bin/dvc repro`` (Snakemake on the config ``params.yaml`` names,
``$MCFL_CORES`` cores), passing their output through, and writes ``logs/reproduce.json`` (beside the
DAG's logs, not among the outputs DVC records, so ``dvc status dvc.yaml`` stays clean after it): the
seconds each took, the number of Snakemake jobs that ran, the run folders the DAG holds, the sum of
the jobs' own times (``<results>/benchmarks/``), the machine and the git revision. ``make
docs-results`` turns that file into the sentence the README and the quickstart show, so the figures
there are always a real run's.

Usage (from the repository root, with any Python 3): python3 workflow/scripts/reproduce.py
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: where the record goes (the default config's log folder; not a DVC output)
RECORD = "logs/reproduce.json"
STEPS = re.compile(r"(\d+) of (\d+) steps \(100%\) done")
#: the DAG's closing lines (where the tables are, what opens the runs), said again at the very end,
#: after DVC's own advice
TAIL = ("Tables: ", "MLflow: ")


def run(cmd: list[str], env: dict | None = None, tail: dict | None = None) -> tuple[int, int]:
    """Run ``cmd`` with its output passed through; its exit code and the Snakemake jobs it ran. The
    last line starting with each of :data:`TAIL` goes into ``tail``."""
    jobs = 0
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if m := STEPS.search(line):
                jobs += int(m.group(2))
            if tail is not None and line.startswith(TAIL):
                tail[line[:line.index(":")]] = line.rstrip("\n")
    return proc.returncode, jobs


def params_value(key: str, default: str) -> str:
    """One plain ``key: value`` line of ``params.yaml`` (this script runs before any package is there)."""
    try:
        for line in (ROOT / "params.yaml").read_text().splitlines():
            if m := re.match(rf"{key}:\s*(\S+)\s*$", line):
                return m.group(1).strip("'\"")
    except OSError:
        pass
    return default


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def job_seconds(results: Path) -> float:
    """The jobs' own wall times, summed over ``results/benchmarks/`` (Snakemake's benchmark files)."""
    total = 0.0
    for f in results.glob("benchmarks/**/*.tsv"):
        try:
            lines = f.read_text().splitlines()
            total += float(lines[1].split("\t")[0])
        except (OSError, IndexError, ValueError):
            continue
    return total


def main() -> int:
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    code, _ = run(["make", "--no-print-directory", "setup"])
    if code:
        return code
    t1 = time.monotonic()
    env = {**os.environ, "MCFL_CORES": os.environ.get("MCFL_CORES") or "all"}
    tail: dict[str, str] = {}
    code, jobs = run([str(ROOT / ".venv" / "bin" / "dvc"), "repro"], env, tail)
    t2 = time.monotonic()
    if code:
        return code
    results = ROOT / params_value("results", "results")
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip() or "unknown"
    record = {"started": started.strftime("%Y-%m-%d %H:%M UTC"), "setup_s": round(t1 - t0, 1),
              "dag_s": round(t2 - t1, 1), "jobs": jobs,
              "run_folders": len(list(results.glob("runs/*/*/seed*/metrics.json"))),
              "job_s": round(job_seconds(results), 1), "config": params_value("config", "config/config.yaml"),
              "cpu": cpu_model(), "cores": os.cpu_count(), "git": git}
    out = ROOT / RECORD
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"make reproduce: {record['setup_s'] + record['dag_s']:.0f} s ({record['setup_s']:.0f} s setup, "
          f"{record['dag_s']:.0f} s for {jobs} jobs) -> {RECORD}")
    if "MLflow" not in tail and (ROOT / "mlflow.db").exists():   # DVC started nothing: still say it
        tail["MLflow"] = "MLflow: make mlflow (.venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db)"
    print("\n".join(tail.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
