"""Bring finished runs made on a device machine (a lent GPU) into this checkout's results directories.

A device call sends back at most 64 MiB, 16 MiB a file. A run's small outputs (metrics.json,
history.csv, predictions.csv, assignments.csv and its log) fit; a clustered run's ``state.pt`` may
not (FedCG's on the FEMNIST CNN is 356 MB: its GCN). Snakemake counts a training job as done only
when all five outputs exist, so for each run whose ``state.pt`` did not come back this writes one
that says so (``{"absent": reason}``): ``mcfl figure clusters`` refuses it by name, and nothing
else reads a run's state. The reports read metrics.json and predictions.csv, which are the device's
own.

Runs made before the runner recorded ``device_name`` get it from ``--device-name`` (what nvidia-smi
said on that machine), so the tables name the accelerator.

    python docs/tools/import_device_runs.py UNPACKED_DIR [--device-name "NVIDIA H200"]

UNPACKED_DIR holds ``results-*/runs/<dataset>/<run>/seed<s>/`` (and ``results-*/logs/``) as the
device wrote them. Existing finished runs here are left alone unless ``--overwrite``.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import io

import torch

from mcfl.io import write_bytes, write_json

ROOT = Path(__file__).resolve().parents[2]
FILES = ("metrics.json", "history.csv", "predictions.csv", "assignments.csv")


def import_runs(src: Path, dest: Path, device_name: str | None = None, overwrite: bool = False) -> list[Path]:
    done = []
    for metrics in sorted(src.glob("results-*/runs/*/*/seed*/metrics.json")):
        run = metrics.parent
        out = dest / run.relative_to(src)
        if (out / "metrics.json").is_file() and not overwrite:
            print(f"kept {out} (already finished here)")
            continue
        missing = [n for n in FILES if not (run / n).is_file()]
        if missing:
            raise SystemExit(f"{run}: incomplete run, lacks {', '.join(missing)}")
        out.mkdir(parents=True, exist_ok=True)
        for name in FILES[1:]:
            shutil.copyfile(run / name, out / name)
        m = json.loads(metrics.read_text())
        if device_name and m.get("device") == "cuda" and not m.get("device_name"):
            m["device_name"] = device_name
        state = out / "state.pt"
        if (run / "state.pt").is_file():
            shutil.copyfile(run / "state.pt", state)
        else:
            buf = io.BytesIO()
            torch.save({"absent": f"made on {m.get('device_name') or m.get('device')}; its state.pt was too "
                        "large to bring back from the device machine"}, buf)
            write_bytes(state, buf.getvalue())
        # metrics.json last (written then renamed): it is the file that marks the run finished
        write_json(out / "metrics.json", m)
        results = run.relative_to(src).parts[0]
        rel = run.relative_to(src / results / "runs")             # <dataset>/<run>/seed<s>
        log = src / results / "logs" / "train" / rel.parent / f"{rel.name}.log"
        if log.is_file():
            (dest / results / "logs" / "train" / rel.parent).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, dest / results / "logs" / "train" / rel.parent / log.name)
        done.append(out)
        print(f"imported {out}")
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--dest", type=Path, default=ROOT)
    ap.add_argument("--device-name")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args()
    import_runs(a.src, a.dest, a.device_name, a.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
