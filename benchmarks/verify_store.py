"""Cost of store verification (mcfl.data.store.verify_store), in seconds per GB of array files.

    python benchmarks/verify_store.py [GB] [DIR]

Writes a uint8 image store of about GB gigabytes (28x28 samples, FEMNIST's shape; 1 GB by default)
in DIR (a temporary directory by default), then times the cheap check that every `load` does and the
full check (`load(verify=True)`: sha256 of every array file and the NaN scan) that `mcfl train` does,
each after dropping nothing from the page cache (the usual case: the store was just read or written).
"""

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mcfl.data.store import load, verify_store
from mcfl.data.write import write_arrays


def main(gb: float = 1.0, where: str | None = None) -> None:
    n = int(gb * 1e9 / 784)
    m = 1000
    off = np.linspace(0, n, m + 1).astype(np.int64)
    x = np.random.default_rng(0).integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    y = np.zeros(n, np.int64)
    arrays = {"x_train": x, "y_train": y, "offsets_train": off, "x_test": x[: n // 10],
              "y_test": y[: n // 10], "offsets_test": (off // 10).astype(np.int64),
              "cluster": np.full(m, -1, np.int64)}
    meta = {"source": "bench", "params": {}, "n_clients": m, "n_classes": 62, "n_train": n,
            "n_test": n // 10, "x_shape": [28, 28], "x_dtype": "uint8", "x_scale": 1 / 255,
            "client_ids": [f"u{i}" for i in range(m)]}
    with tempfile.TemporaryDirectory(dir=where) as d:
        store = write_arrays(Path(d) / "s", arrays, meta)
        del x, arrays
        size = sum(f.stat().st_size for f in store.glob("*.npy")) / 1e9
        for full in (False, True):
            t = time.perf_counter()
            verify_store(store, full=full)
            dt = time.perf_counter() - t
            print(f"verify_store(full={full}): {dt:.3f} s for {size:.2f} GB = {dt / size:.3f} s/GB")
        t = time.perf_counter()
        load(store, verify=True)
        dt = time.perf_counter() - t
        print(f"load(verify=True): {dt:.3f} s for {size:.2f} GB = {dt / size:.3f} s/GB")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0, sys.argv[2] if len(sys.argv) > 2 else None)
