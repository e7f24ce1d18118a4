"""The cost estimate against the DAG's measured time: for each config, run the whole Snakemake DAG
from an empty folder and print the estimate it printed when it started (``mcfl.cost``: its jobs
packed on the cores) beside the time its jobs took.

The configs (``--configs``, default all three): ``default`` (``config/config.yaml``), ``fedcg``
(``config/fedcg-digits.yaml``) and ``own``: the README's own-data example (its ``my-leaf.yaml``,
read from the README) over the embedded FEMNIST writers exported as LEAF JSON with ``mcfl
export-leaf``; or any config files given with ``--config``. Each runs in a folder of its own
(``--workdir``, default a temporary one): its results, data, logs and Snakemake's metadata go there,
and nothing of this checkout is written; MLflow tracking is as the config says, with the MLflow
store in that folder (``--no-tracking`` turns it off).

Measured: from the estimate's line (printed at the workflow's start, once the DAG is built) to the
end of the invocation ("jobs"), and the whole invocation ("all", Snakemake's parsing and DAG
included). The estimate is meant to be within 30% of "jobs" on a machine doing nothing else; the
header gives the CPU, its vector extensions (PyTorch's CPU capability) and the load average, since a
shared machine inflates every measured time.

    python benchmarks/estimate_accuracy.py                          # the three configs, all cores
    python benchmarks/estimate_accuracy.py --configs own --cores 2
    python benchmarks/estimate_accuracy.py --config my-small.yaml   # any config
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from _common import ROOT, machine

#: the estimate's line: "... about 3.5 min on 2 cores (...)"
ABOUT = re.compile(r"about (\d+(?:\.\d+)?) (s|min|h) on (\d+) cores")
#: the training runs it counts: "... of <scope>: 39 training runs x 60 rounds = ..."
RUNS = re.compile(r"(\d+) training runs x")
UNIT = {"s": 1, "min": 60, "h": 3600}
SHIPPED = {"default": ROOT / "config" / "config.yaml", "fedcg": ROOT / "config" / "fedcg-digits.yaml"}


def readme_config() -> dict:
    """The README's own-data example, ``my-leaf.yaml``, as the README shows it."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(# my-leaf\.yaml\n.*?)```", text, re.S)
    if not block:
        raise SystemExit("README.md: no ```yaml block starting with '# my-leaf.yaml'")
    return yaml.safe_load(block.group(1))


def own_config(folder: Path) -> Path:
    """``my-leaf.yaml`` of the README over the embedded writers, exported as LEAF JSON in ``folder``."""
    store, leaf = folder / "embedded-store", folder / "leaf"
    mcfl = [str(Path(sys.executable).with_name("mcfl"))]         # the console script beside python
    if not leaf.exists():
        subprocess.run([*mcfl, "prepare", "femnist_sample", "--out", str(store)], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([*mcfl, "export-leaf", str(store), "--out", str(leaf)], check=True,
                       stdout=subprocess.DEVNULL)
    cfg = readme_config()
    for ds in cfg["datasets"].values():
        ds["prepare"]["dir"] = str(leaf.resolve())
    path = folder / "my-leaf.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def isolated(config: Path, folder: Path, tracking: bool) -> Path:
    """``config`` merged and named as the workflow reads it, with its results and data in ``folder``
    (and no tracking unless ``tracking``)."""
    from mcfl.config import load_config

    cfg = load_config(config)
    cfg.update(results=str(folder / "results"), data_dir=str(folder / "data"))
    if not tracking:
        cfg["tracking"] = False
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_dag(config: Path, folder: Path, cores: int, log) -> dict:
    """Run Snakemake on ``config`` in ``folder``; the estimate it printed and the times measured."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory",
           str(folder), "--cores", str(cores), "--configfile", str(config)]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    start = time.perf_counter()
    seen, estimate, runs, line_at = None, None, None, None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          cwd=folder) as p:
        for line in p.stdout:
            log.write(line)
            log.flush()
            if estimate is None and line.startswith("estimated cost"):
                line_at, seen = time.perf_counter(), line.strip()
                m, r = ABOUT.search(line), RUNS.search(line)
                estimate = float(m.group(1)) * UNIT[m.group(2)] if m else 0.0
                runs = int(r.group(1)) if r else 0
    end = time.perf_counter()
    if p.returncode:
        raise SystemExit(f"snakemake failed on {config} (exit {p.returncode}); its output: {log.name}")
    if seen is None:
        raise SystemExit(f"{config}: the workflow printed no estimate (nothing to do?); its output: {log.name}")
    return {"line": seen, "estimate_s": estimate, "runs": runs, "jobs_s": end - line_at, "all_s": end - start}


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="own,fedcg,default",
                    help="comma-separated among default, fedcg, own (default: all three, smallest first)")
    ap.add_argument("--config", type=Path, action="append", help="a config file to measure instead")
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="Snakemake's --cores (default: all)")
    ap.add_argument("--workdir", type=Path, help="folder for the runs (default: a temporary one, removed)")
    ap.add_argument("--no-tracking", dest="tracking", action="store_false",
                    help="no MLflow tracking (default: as the config says, the store in the workdir)")
    args = ap.parse_args(argv)
    names = [(p.stem, p) for p in args.config] if args.config else [(n, None) for n in args.configs.split(",")]
    for name, _ in names:
        if not args.config and name not in (*SHIPPED, "own"):
            raise SystemExit(f"--configs: unknown {name!r}; use default, fedcg, own")
    tmp = tempfile.TemporaryDirectory(prefix="estimate-accuracy-") if args.workdir is None else None
    work = Path(tmp.name if tmp else args.workdir).resolve()
    print(f"# {machine(torch.device('cpu'))}; vector extensions: {torch.backends.cpu.get_cpu_capability()}")
    print(f"# snakemake --cores {args.cores}, tracking {'as configured' if args.tracking else 'off'}, "
          f"from empty folders under {work}")
    print("| config | training runs | estimate | measured (jobs) | measured (all) | estimate / jobs |")
    print("|---|---|---|---|---|---|", flush=True)
    for name, path in names:
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        path = path or (own_config(folder) if name == "own" else SHIPPED[name])
        with open(folder / "snakemake.log", "w") as log:
            r = run_dag(isolated(path.resolve(), folder, args.tracking), folder, args.cores, log)
        print(f"| {name} | {r['runs']} | {minutes(r['estimate_s'])} | {minutes(r['jobs_s'])} | "
              f"{minutes(r['all_s'])} | {r['estimate_s'] / r['jobs_s']:.2f} |", flush=True)
        print(f"<!-- {r['line']} -->", flush=True)
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
