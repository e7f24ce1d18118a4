"""Decode the images a LEAF split selected, in worker processes, straight into the store's arrays.

:func:`write_split_store` takes the clients (``(user, train refs, test refs)``, refs indexing
``names``), reads each distinct member once from the archive in the main process, decodes chunks
of them in ``workers`` processes (``spawn``: the children do not inherit the parent's large member
tables) with at most a few chunks in flight, and scatters each decoded image into every row that
references it (LEAF's duplicated first images are rows sharing one reference). Memory is the output
arrays plus a few chunks.
"""

from __future__ import annotations

import io
import logging
import multiprocessing
import os
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from PIL import Image

from mcfl.data.leaf import DataSourceError
from mcfl.data.leaf.archive import Archive
from mcfl.data.store import FORMAT
from mcfl.data.write import write_arrays

log = logging.getLogger("mcfl")
CHUNK = 256


def femnist_pixels(names: Sequence[str], blobs: Sequence[bytes]) -> np.ndarray:
    """LEAF's ``data_to_json.py``: grayscale, ``thumbnail((28, 28), LANCZOS)`` (128 -> 28), no
    inversion; uint8 (k, 1, 28, 28); LEAF's floats are these values / 255."""
    out = np.empty((len(blobs), 1, 28, 28), dtype=np.uint8)
    for i, (name, blob) in enumerate(zip(names, blobs)):
        img = _open(name, blob, "PNG").convert("L")
        img.thumbnail((28, 28), Image.LANCZOS)
        if img.size != (28, 28):
            raise DataSourceError(f"{name}: thumbnail is {img.size[0]}x{img.size[1]}, expected 28x28 "
                                  f"(NIST images are 128x128)")
        out[i, 0] = np.asarray(img)
    return out


def celeba_pixels(names: Sequence[str], blobs: Sequence[bytes]) -> np.ndarray:
    """LEAF's CelebA loader (``models/celeba/cnn.py``): ``resize((84, 84))`` then ``convert('RGB')``,
    with the filter pinned to BICUBIC (Pillow's default for ``resize`` since 7.0; LEAF passes none,
    so its output depended on the Pillow version). The 178x218 image is squashed, not cropped.
    uint8 (k, 3, 84, 84), channels first."""
    out = np.empty((len(blobs), 3, 84, 84), dtype=np.uint8)
    for i, (name, blob) in enumerate(zip(names, blobs)):
        img = _open(name, blob, "JPEG").resize((84, 84), Image.BICUBIC).convert("RGB")
        out[i] = np.asarray(img).transpose(2, 0, 1)
    return out


def _open(name: str, blob: bytes, fmt: str) -> Image.Image:
    try:
        img = Image.open(io.BytesIO(blob), formats=(fmt,))     # no probing of other formats
        img.load()
        return img
    except (OSError, SyntaxError) as e:
        raise DataSourceError(f"{name}: not a readable image ({e})") from None


def decode_members(archive: Archive, names: Sequence[str], decode: Callable, *, workers: int = 1,
                   on_blob: Callable[[int, bytes], None] | None = None) -> Iterator[np.ndarray]:
    """Decoded chunks of ``names`` in order; ``on_blob(i, bytes)`` sees each raw member first."""
    def chunks():
        for a in range(0, len(names), CHUNK):
            part = list(names[a:a + CHUNK])
            blobs = []
            for i, name in enumerate(part, a):
                blobs.append(archive.read(name))
                if on_blob is not None:
                    on_blob(i, blobs[-1])
            yield part, blobs

    if workers <= 1 or len(names) <= CHUNK:
        for part, blobs in chunks():
            yield decode(part, blobs)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pending: deque = deque()
        for item in chunks():
            pending.append(pool.apply_async(decode, item))
            if len(pending) >= 2 * workers + 2:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def resolve_workers(workers: int) -> int:
    return workers if workers > 0 else min(os.cpu_count() or 1, 8)


def write_split_store(out: str | Path, clients: list[tuple[str, list[int], list[int]]],
                      archive: Archive, names: Sequence[str], decode: Callable, *,
                      labels: Callable[[np.ndarray], np.ndarray] | np.ndarray, n_classes: int,
                      source: str, params: dict[str, Any], x_scale: float, workers: int = 1,
                      on_blob: Callable[[int, bytes], None] | None = None,
                      domains: np.ndarray | None = None, domain_meta: dict | None = None) -> Path:
    """Write the store: client after client, train rows then test rows, rows in the split's order.

    ``labels`` is an array over ``names`` or a function called, after decoding, with the distinct
    refs (sorted) and returning their labels (FEMNIST labels come from hashing the decoded members).
    ``domains`` (an int array over ``names``) is stored per sample (``domain_train``/``domain_test``),
    ``domain_meta`` as ``meta["domains"]``.
    """
    from tqdm import tqdm

    if not clients or not any(tr for _, tr, _ in clients):
        raise DataSourceError(f"{out}: the sampling left no clients (raise sf or lower k)")
    train = np.array([r for _, tr, _ in clients for r in tr], dtype=np.int64)
    test = np.array([r for _, _, te in clients for r in te], dtype=np.int64)
    refs = np.concatenate([train, test])
    uniq, inv = np.unique(refs, return_inverse=True)
    order = np.argsort(inv, kind="stable")             # rows grouped by distinct reference
    starts = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
    x = None
    done = 0
    with tqdm(total=len(uniq), unit="img", desc=f"decoding {source}", disable=None) as bar:
        for pix in decode_members(archive, [names[i] for i in uniq], decode,
                                  workers=resolve_workers(workers),
                                  on_blob=None if on_blob is None else lambda i, b: on_blob(int(uniq[i]), b)):
            if x is None:
                x = np.empty((len(refs), *pix.shape[1:]), dtype=pix.dtype)
            rows = order[starts[done]:starts[done + len(pix)]]
            x[rows] = pix[inv[rows] - done]
            done += len(pix)
            bar.update(len(pix))
    y_uniq = labels(uniq) if callable(labels) else np.asarray(labels)[uniq]
    y = np.asarray(y_uniq, dtype=np.int64)[inv]
    n_tr = len(train)
    arrays = {
        "x_train": x[:n_tr], "y_train": y[:n_tr],
        "offsets_train": np.cumsum([0] + [len(tr) for _, tr, _ in clients]).astype(np.int64),
        "x_test": x[n_tr:], "y_test": y[n_tr:],
        "offsets_test": np.cumsum([0] + [len(te) for _, _, te in clients]).astype(np.int64),
        "cluster": np.full(len(clients), -1, dtype=np.int64),
    }
    if domains is not None:
        dom = np.asarray(domains, dtype=np.int64)[refs]
        arrays["domain_train"], arrays["domain_test"] = dom[:n_tr], dom[n_tr:]
    meta = {"format": FORMAT, "source": source, "params": params, "n_clients": len(clients),
            "n_classes": int(n_classes), "n_train": int(n_tr), "n_test": int(len(test)),
            "x_shape": list(x.shape[1:]), "x_dtype": x.dtype.name, "x_scale": float(x_scale),
            "client_ids": [u for u, _, _ in clients]}
    if domain_meta is not None:
        meta["domains"] = domain_meta
    log.info("%s: writing %d clients, %d train / %d test samples", out, len(clients), n_tr, len(test))
    return write_arrays(out, arrays, meta)
