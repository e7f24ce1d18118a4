"""Time and peak memory of `mcfl partition` on a FEMNIST-shaped store, against a plain copy.

A fake store with LEAF-FEMNIST's shapes (28x28 uint8 images, 62 classes, writers of unequal size) is
written once; then each scheme re-partitions it. The baseline is `natural` + `split: keep`, which
reads and rewrites every array unchanged (the workflow skips that case; here it measures the I/O
floor). Prints seconds, the ratio to the baseline, and the peak memory each call allocates (tracemalloc, which sees numpy's arrays), against the
store's size.

    PYTHONPATH=src python benchmarks/partition_store.py [--samples 200000] [--clients 900]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np


def fake_store(out: Path, samples: int, clients: int) -> Path:
    from mcfl.data.store import FORMAT
    from mcfl.data.write import write_arrays

    rng = np.random.default_rng(0)
    sizes = rng.lognormal(0, 0.6, clients)
    sizes = np.maximum(10, (sizes / sizes.sum() * samples).astype(int))
    n = int(sizes.sum())
    n_tr = (sizes * 0.9).astype(int)
    n_te = sizes - n_tr
    x = rng.integers(0, 256, size=(n, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 62, size=n)
    tr = np.concatenate([np.arange(o, o + a) for o, a in zip(np.cumsum(sizes) - sizes, n_tr)])
    te = np.setdiff1d(np.arange(n), tr)
    arrays = {"x_train": x[tr], "y_train": y[tr], "offsets_train": np.concatenate([[0], np.cumsum(n_tr)]),
              "x_test": x[te], "y_test": y[te], "offsets_test": np.concatenate([[0], np.cumsum(n_te)]),
              "cluster": np.full(clients, -1)}
    meta = {"format": FORMAT, "source": "fake", "params": {}, "n_clients": clients, "n_classes": 62,
            "n_train": len(tr), "n_test": len(te), "x_shape": [1, 28, 28], "x_dtype": "uint8",
            "x_scale": 1 / 255, "client_ids": [f"w{i}" for i in range(clients)]}
    return write_arrays(out, arrays, meta)


def main() -> None:
    from mcfl.data.repartition import partition_store

    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--clients", type=int, default=900)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = fake_store(Path(tmp) / "src", a.samples, a.clients)
        mb = sum(f.stat().st_size for f in src.glob("*.npy")) / 2**20
        print(f"store: {mb:.0f} MB, {a.samples} samples of 1x28x28 uint8, {a.clients} clients (machine may be shared)")
        base = None
        for kw in [dict(scheme="natural"), dict(scheme="iid"), dict(scheme="iid", sizes="natural"),
                   dict(scheme="dirichlet", alpha=0.5), dict(scheme="classes", classes_per_client=5),
                   dict(scheme="natural", split="redo")]:
            tracemalloc.start()
            t = time.perf_counter()
            partition_store(src, Path(tmp) / "out", **kw)
            s = time.perf_counter() - t
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            base = base or s
            print(f"  {str(kw):<48} {s:6.2f} s  x{s / base:4.2f}  peak {peak:5.0f} MB "
                  f"(x{peak / mb:.1f} the store)")


if __name__ == "__main__":
    main()
