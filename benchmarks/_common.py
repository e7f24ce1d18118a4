"""Helpers shared by the benchmark scripts: the machine description printed with every figure,
FEMNIST/CelebA-shaped synthetic stores, timing and peak memory."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))          # run from a checkout without installing

#: model name -> (input shape, classes) of the dataset it was designed for
SHAPES = {"femnist_cnn": ((1, 28, 28), 62), "celeba_cnn": ((3, 84, 84), 2),
          "digits_cnn": ((1, 8, 8), 10), "logreg": ((60,), 5)}


def machine(device: torch.device) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    load = ", load average %.2f %.2f %.2f" % os.getloadavg() if hasattr(os, "getloadavg") else ""
    return (f"{cpu} ({os.cpu_count()} cores{load}){gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}, {torch.get_num_threads()} torch thread(s)")


def fake_store(path: Path, model: str, sizes, seed: int = 0) -> Path:
    """A store with ``len(sizes)`` clients of random uint8 images (or float features for logreg)
    shaped for ``model``; client i has ``sizes[i]`` training samples."""
    from mcfl.data import ClientData, write_store

    shape, classes = SHAPES[model]
    rng = np.random.default_rng(seed)
    clients = []
    for i, n in enumerate(sizes):
        if model == "logreg":
            x = rng.normal(size=(n + 1, *shape)).astype(np.float32)
        else:
            x = rng.integers(0, 256, size=(n + 1, *shape), dtype=np.uint8)
        y = rng.integers(0, classes, n + 1)
        clients.append(ClientData(f"u{i}", x[:n], y[:n], x[n:], y[n:]))
    scale = 1.0 if model == "logreg" else 1 / 255
    return write_store(path, clients, n_classes=classes, source="benchmark", params={"model": model},
                       x_scale=scale)


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def median(xs) -> float:
    return statistics.median(xs)


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (Linux: ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def config_runs(config: list[Path], store: Path):
    """The runs of ``config``'s first seed by run id, and the prepared store they train on (made
    from the config's ``prepare`` block of their dataset if ``store`` does not exist yet)."""
    from mcfl.config import expand_runs, load_config
    from mcfl.data import load, prepare

    cfg = load_config(*config)
    runs = {r["run_id"]: r for r in expand_runs(cfg) if r["seed"] == cfg["seeds"][0]}
    if not store.exists():
        prep = dict(cfg["datasets"][next(iter(runs.values()))["dataset"]]["prepare"])
        prepare(prep.pop("source"), store, **prep)
    return runs, load(store)


def add_config_args(ap, config: tuple[str, ...] = ("femnist-sample.yaml", "femnist-sample/fedgsp.yaml"),
                    store: str = "femnist_sample") -> None:
    """--config, --store and --threads, for the scripts that time or probe a config's runs."""
    ap.add_argument("--config", type=Path, nargs="+", default=[ROOT / "config" / c for c in config],
                    help="a config file and any overlays merged over it, in order")
    ap.add_argument("--store", type=Path, default=ROOT / "data" / store,
                    help="the prepared store (made from the config's prepare block if absent)")
    ap.add_argument("--threads", type=int, default=1)


def pick_run(runs: dict, run_id: str, config: list[Path]) -> dict:
    """``runs[run_id]``, or an exit naming the config and the run ids it has."""
    if run_id not in runs:
        raise SystemExit(f"{' + '.join(map(str, config))}: no run {run_id!r}; there are: {', '.join(sorted(runs))}")
    return runs[run_id]
