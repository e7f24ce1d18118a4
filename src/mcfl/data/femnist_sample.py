"""``femnist_sample``: real FEMNIST writers embedded in the package, as LEAF's scripts wrote them.

Two independent runs of LEAF's FEMNIST pipeline (``./preprocess.sh -s niid --sf 0.05 -k 0 -t
sample``: LEAF's "small FEMNIST", train fraction 0.9, LEAF's seeds), read by the ``leaf_json``
source and packed as uint8 (``embedded/femnist-<run>.npz``, exact: LEAF's pixels are k/255):

=============  =======  =====================  ==================================================
``run``        writers  train / test images    published LEAF output it was read from
=============  =======  =====================  ==================================================
``leaf-torch`` 105      14,708 / 1,685         repository slz-ai/leaf-torch, commit 5a94e3b
``flic``       110      14,697 / 1,695         repository arakotom/flic, commit 4646796
=============  =======  =====================  ==================================================

The stores keep LEAF's samples as they are: every writer and image of the published shards (20 of
each run's 36: only shards published with both their train and test file; writers with many
samples are slightly under-represented), LEAF's train/test split, LEAF's duplicated first image per
writer (``group_by_writer.py``), writers with as few as 4 samples, ink ~0 on paper ~1 (not
inverted), labels 0-9, A-Z = 10-35, a-z = 36-61 (62 classes). 3 writer ids occur in both runs with
slightly different pixels (different Pillow versions): treat the runs as separate data sets, e.g.
choose hyperparameters on one and confirm on the other.

This is a sample for real-data tests, examples and studies that fit a CPU: numbers measured on it
are not the papers' full-FEMNIST numbers (3,550 writers), and reports say so.

Rebuild the embedded files from the two LEAF output folders they were packed from::

    python -m mcfl.data.femnist_sample SAMPLE_DIR      # SAMPLE_DIR/leaf-torch, SAMPLE_DIR/flic
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import numpy as np

from mcfl.data.leaf.leafjson import make_leaf_json
from mcfl.data.store import ClientData, load
from mcfl.data.write import write_store
from mcfl.io import atomic_path

EMBEDDED = Path(__file__).parent / "embedded"
N_CLASSES = 62
RUNS = {
    "leaf-torch": {"repository": "slz-ai/leaf-torch",
                   "commit": "5a94e3b721bf5920a25d59d800481380602b7862"},
    "flic": {"repository": "arakotom/flic", "commit": "4646796"},
}
LEAF_FLAGS = "./preprocess.sh -s niid --sf 0.05 -k 0 -t sample"


def embedded_file(run: str) -> Path:
    return EMBEDDED / f"femnist-{run}.npz"


def make_femnist_sample(out: str | Path, *, run: Literal["leaf-torch", "flic"] = "leaf-torch") -> Path:
    """Write the embedded LEAF run ``run`` as a store at ``out`` (no network, a second or two)."""
    with np.load(embedded_file(run), allow_pickle=False) as z:
        ids, xs, ys, offs = z["client_ids"], {}, {}, {}
        for split in ("train", "test"):
            xs[split], ys[split], offs[split] = z[f"x_{split}"], z[f"y_{split}"], z[f"offsets_{split}"]
    clients = []
    for i, u in enumerate(ids.tolist()):
        part = {s: slice(int(offs[s][i]), int(offs[s][i + 1])) for s in ("train", "test")}
        clients.append(ClientData(u, xs["train"][part["train"]], ys["train"][part["train"]],
                                  xs["test"][part["test"]], ys["test"][part["test"]]))
    params = {"run": run, **RUNS[run], "leaf": LEAF_FLAGS,
              "note": "LEAF's small FEMNIST sample, not the papers' full FEMNIST"}
    return write_store(out, clients, n_classes=N_CLASSES, source="femnist_sample", params=params,
                       x_scale=1 / 255)


def build(sample_dir: str | Path) -> list[Path]:
    """Pack each run's LEAF folder (read by the ``leaf_json`` source) into ``embedded/``."""
    import tempfile

    written = []
    for run in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            d = load(make_leaf_json(Path(tmp) / "store", dir=str(Path(sample_dir) / run),
                                    n_classes=N_CLASSES), mmap=False)
            if d.meta["x_dtype"] != "uint8":
                raise ValueError(f"{sample_dir}/{run}: pixels are not all k/255")
            arrays = {"client_ids": np.array(d.client_ids)}
            for split in ("train", "test"):
                arrays[f"x_{split}"] = getattr(d, f"x_{split}")
                arrays[f"y_{split}"] = getattr(d, f"y_{split}").astype(np.uint8)
                arrays[f"offsets_{split}"] = getattr(d, f"offsets_{split}").astype(np.int32)
        with atomic_path(embedded_file(run)) as tmp:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, **arrays)
            tmp.chmod(0o644)                  # package data: readable by all (mkstemp gives 0600)
        written.append(embedded_file(run))
    return written




if __name__ == "__main__":
    for path in build(sys.argv[1]):
        print(f"{path}: {path.stat().st_size / 1e6:.2f} MB")
