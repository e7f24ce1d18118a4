"""Writing a prepared store (:mod:`mcfl.data.store` says what one holds): every source ends here,
through :func:`write_store` (per-client data) or :func:`write_arrays` (arrays already concatenated),
which check the data as :func:`~mcfl.data.store.load` does and write the store atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mcfl.data.store import (ARRAYS, FORMAT, OPTIONAL, ClientData, StoreError, check_arrays, content_hash,
                             warn_untested)
from mcfl.io import atomic_path, named, sha256_file


def write_store(out: str | Path, clients: Sequence[ClientData], *, n_classes: int, source: str,
                params: dict[str, Any], x_scale: float = 1.0, x_dtype: str | None = None,
                domains: dict[str, Any] | None = None) -> Path:
    """Validate ``clients`` and write them as a store at ``out`` (atomically: all or nothing).
    Per-sample domain arrays are written when the clients carry them; ``domains`` (names, unseen
    ids) goes to ``meta["domains"]``."""
    out = Path(out)
    if not clients:
        raise StoreError(f"{out}: no clients to write")
    x_shape = tuple(np.asarray(clients[0].x_train).shape[1:])
    for c in clients:
        _check_client(out, c, x_shape)
    dtype = np.dtype(x_dtype or np.asarray(clients[0].x_train).dtype)
    arrays = {
        "x_train": np.concatenate([np.asarray(c.x_train, dtype=dtype).reshape(-1, *x_shape) for c in clients]),
        "y_train": np.concatenate([np.asarray(c.y_train, dtype=np.int64) for c in clients]),
        "offsets_train": _offsets([len(c.y_train) for c in clients]),
        "x_test": np.concatenate([np.asarray(c.x_test, dtype=dtype).reshape(-1, *x_shape) for c in clients]),
        "y_test": np.concatenate([np.asarray(c.y_test, dtype=np.int64) for c in clients]),
        "offsets_test": _offsets([len(c.y_test) for c in clients]),
        "cluster": np.asarray([int(c.cluster) for c in clients], dtype=np.int64),
    }
    has_domains = [c.domain_train is not None and c.domain_test is not None for c in clients]
    if any(has_domains):
        if not all(has_domains):
            bad = str(clients[has_domains.index(False)].id)
            raise StoreError(f"{out}: client {bad!r} has no domain_train/domain_test but others do")
        for split in ("train", "test"):
            arrays[f"domain_{split}"] = np.concatenate(
                [np.asarray(getattr(c, f"domain_{split}"), dtype=np.int64) for c in clients])
    meta = {
        "format": FORMAT,
        "source": source,
        "params": params,
        "n_clients": len(clients),
        "n_classes": int(n_classes),
        "n_train": int(len(arrays["y_train"])),
        "n_test": int(len(arrays["y_test"])),
        "x_shape": list(x_shape),
        "x_dtype": dtype.name,
        "x_scale": float(x_scale),
        "client_ids": [str(c.id) for c in clients],
    }
    if domains is not None:
        meta["domains"] = domains
    return write_arrays(out, arrays, meta)


def write_arrays(out: str | Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Path:
    """Validate pre-concatenated arrays (:func:`check_arrays`) and write them plus meta (adds file
    hashes and the content hash) atomically. The path for sources that build arrays directly."""
    out = Path(out)
    check_arrays(out, arrays, meta, finite=True)
    warn_untested(out, meta["client_ids"], np.diff(arrays["offsets_test"]))
    with atomic_path(out, is_dir=True, marker="meta.json") as tmp:
        files = {}
        for name in ARRAYS + tuple(n for n in OPTIONAL if n in arrays):
            try:
                np.save(tmp / f"{name}.npy", arrays[name], allow_pickle=False)
            except OSError as e:                # ENOSPC, or numpy's "N requested and M written"
                raise named(e, out / f"{name}.npy") from e
            files[f"{name}.npy"] = sha256_file(tmp / f"{name}.npy")
        meta = dict(meta, format=FORMAT, files=files)
        meta["content_hash"] = content_hash(meta)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out


def _offsets(sizes: Sequence[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _check_client(out: Path, c: ClientData, x_shape: tuple[int, ...]) -> None:
    """What concatenation would hide: row counts of x and y, and sample shapes across clients."""
    where = f"{out}: client {c.id!r}"
    for split in ("train", "test"):
        x, y = np.asarray(getattr(c, f"x_{split}")), np.asarray(getattr(c, f"y_{split}"))
        if len(x) != len(y):
            raise StoreError(f"{where}: x_{split} has {len(x)} rows but y_{split} has {len(y)}")
        if len(x) and tuple(x.shape[1:]) != x_shape:
            raise StoreError(f"{where}: x_{split} samples have shape {tuple(x.shape[1:])}, "
                             f"expected {x_shape} like the first client")
    for split in ("train", "test"):
        dom = getattr(c, f"domain_{split}")
        if dom is not None and np.asarray(dom).shape != (len(getattr(c, f"y_{split}")),):
            raise StoreError(f"{where}: domain_{split} has shape {np.asarray(dom).shape}, expected "
                             f"one domain id per {split} sample ({len(getattr(c, f'y_{split}'))})")
