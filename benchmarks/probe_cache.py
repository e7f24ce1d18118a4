"""What the per-machine probe cache (``mcfl.cost.probe_cache``) saves at each start of the workflow:
the cost estimate of a config timed with an empty cache (cold: every model's step, every method's
round and a job's start-up probed) and again with the cache it left (warm: nothing probed), in
wall seconds and in the CPU seconds of the process (user + system: the steadier figure on a shared
machine, where the wall time waits for the other processes).

The estimate is the one the workflow prints when it starts (its ``onstart``), timed here through
``mcfl check-config``, which prints it for every run of the config: what the workflow estimates from
an empty results folder. Each invocation is a fresh process (the package's imports included, as a
Snakemake start pays them), with ``MCFL_CACHE_DIR`` pointing at a temporary folder, so the user's
own cache is neither read nor written. The two estimates must agree line for line.

    python benchmarks/probe_cache.py                               # config/config.yaml, 2 warm runs
    python benchmarks/probe_cache.py --config config/fedcg-digits.yaml --repeats 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import ROOT, machine


def check_config(config: Path, cache: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + system) of ``mcfl check-config config`` with the probe cache in
    ``cache``, and its output."""
    env = {**os.environ, "MCFL_CACHE_DIR": str(cache)}
    env.pop("MCFL_NO_CACHE", None)
    mcfl = str(Path(sys.executable).with_name("mcfl"))               # the console script beside python
    t, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run([mcfl, "check-config", str(config)], cwd=ROOT, env=env, text=True,
                          capture_output=True)
    seconds, cpu = time.perf_counter() - t, _children_cpu() - cpu
    if done.returncode:
        raise SystemExit(f"mcfl check-config {config} failed:\n{done.stdout}{done.stderr}")
    return seconds, cpu, done.stdout


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def estimate_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("estimated cost", "note:", "hint:"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml")
    ap.add_argument("--repeats", type=int, default=2, help="warm invocations (their median is shown)")
    args = ap.parse_args(argv)
    print(f"machine: {machine(torch.device('cpu'))}")
    print(f"config: {args.config}")
    with tempfile.TemporaryDirectory(prefix="mcfl-probe-cache-") as tmp:
        cold, cold_cpu, cold_out = check_config(args.config, Path(tmp))
        warm_runs = [check_config(args.config, Path(tmp)) for _ in range(max(1, args.repeats))]
    warm = statistics.median(s for s, _, _ in warm_runs)
    warm_cpu = statistics.median(c for _, c, _ in warm_runs)
    same = all(estimate_lines(out) == estimate_lines(cold_out) for _, _, out in warm_runs)
    print(f"{'':12}{'cold cache':>12}{'warm cache':>12}{'cold/warm':>11}   (warm: median of {len(warm_runs)})")
    print(f"{'wall s':12}{cold:12.1f}{warm:12.1f}{cold / warm:10.1f}x")
    print(f"{'CPU s':12}{cold_cpu:12.1f}{warm_cpu:12.1f}{cold_cpu / warm_cpu:10.1f}x")
    print(f"estimate, cold and warm {'identical' if same else 'DIFFERENT'}:")
    print("\n".join("  " + line for line in estimate_lines(cold_out)))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
