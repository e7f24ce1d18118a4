"""The prepared on-disk store: one format for every dataset (embedded, synthetic, LEAF).

A store is a directory::

    meta.json          source, parameters, seeds, client ids, shapes, per-file sha256, content hash
    x_train.npy        all clients' training inputs, client after client   (N_train, *x_shape)
    y_train.npy        int64 labels                                        (N_train,)
    offsets_train.npy  int64, client i owns rows offsets[i]:offsets[i+1]   (m + 1,)
    x_test.npy, y_test.npy, offsets_test.npy                               (same, for test)
    cluster.npy        int64 true cluster per client, -1 where unknown     (m,)
    domain_train.npy   optional: int64 domain id per training sample       (N_train,)
    domain_test.npy    optional: int64 domain id per test sample           (N_test,)

The two ``domain_*`` arrays are optional (stores without them load as before; their hash enters the
content hash only when present). They label *samples*, not clients, for data whose domains are mixed
inside clients (FedCG's setting); ``meta["domains"]`` may name the domains (``names``) and list the
ids that occur only in test data (``unseen``).

Inputs are stored compactly: ``uint8`` images with ``x_scale = 1/255`` (or ``1/16`` for sklearn's
digits), or ``float32`` features with ``x_scale = 1``. Arrays are memory-mapped on load, so opening
the FEMNIST store (~630 MB) costs nothing until rows are read. The content hash covers every array
file and the metadata that gives the arrays their meaning (:data:`CONTENT_KEYS`: shapes, dtype,
``x_scale``, ``n_classes``, client ids, domains; not provenance such as ``source`` or ``params``),
and is what each training run logs as its data hash.

Verification (:func:`verify_store`, :func:`load`): every command opens a store through
:func:`load`, whose default ``verify=True`` re-hashes every array file (a full read: 0.73 s per GB
here, page cache warm; benchmarks/verify_store.py), recomputes the content hash from ``meta.json``
(so an edited ``x_scale``, ``n_classes`` or ``content_hash`` is caught), checks each file's size
against its header, checks the metadata against the arrays themselves (counts, dtypes, byte order,
the sample shape's rank, at most :data:`MAX_CLASSES` classes) and scans float features for
NaN/inf, all before anything is read or written: ``partition``, ``export-leaf``, ``init-centres``,
``select-k`` and the figures refuse a changed store as ``train`` does (``mcfl train`` verifies
before it trains or resumes; a checkpoint resumes only on the data hash it was written with).
``verify=False`` (the cheap check) is for a store the same process has just written.

Data faults are checked once, on the concatenated arrays (:func:`check_arrays`), both when a store
is written (``write_store``/``write_arrays``, so no source can write a bad store) and when it is
loaded (so a damaged or hand-made store is caught before training); messages name the file or the
client:

* a client without training samples, labels outside ``[0, n_classes)``, samples whose shape differs
  from ``x_shape``, NaN/inf features, duplicate client ids, inconsistent offsets: :class:`StoreError`;
* a store without any test sample (e.g. ``tf=1.0``, to be re-split later): written with a warning;
  training on it is a :class:`StoreError` (``mcfl train`` checks before any work);
* a client without test samples: allowed; it trains, is left out of the test metrics (see
  :mod:`mcfl.metrics`), and a warning names it when the store is written and when a run starts;
* a client with a single training sample: allowed (its minibatches have one sample).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mcfl.inputs import MAX_JSON_BYTES, InputError, read_limited
from mcfl.io import sha256_file

log = logging.getLogger("mcfl")

FORMAT = "mcfl-store/2"   # /2: the content hash covers CONTENT_KEYS of meta.json (/1: arrays only)
#: the keys of meta.json that the content hash covers (what changes how the arrays are read)
CONTENT_KEYS = ("format", "n_clients", "n_classes", "n_train", "n_test", "x_shape", "x_dtype",
                "x_scale", "client_ids", "domains")
ARRAYS = ("x_train", "y_train", "offsets_train", "x_test", "y_test", "offsets_test", "cluster")
OPTIONAL = ("domain_train", "domain_test")
#: the most classes a store may have: a label of 10^9 would otherwise become a model whose output
#: layer alone takes gigabytes (the papers' data sets have 2 to 62 classes)
MAX_CLASSES = 100_000
#: the dtypes a store's inputs may have (``x_dtype``), and of every other array (labels, offsets ...)
X_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
INDEX_DTYPE = np.dtype(np.int64)


class StoreError(ValueError):
    """A store (or the data being written into one) is malformed; the message names file and fault."""


@dataclass
class ClientData:
    """One client's data, as handed to :func:`write_store`."""

    id: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    cluster: int = -1
    domain_train: np.ndarray | None = None   # optional int domain id per sample (both or neither)
    domain_test: np.ndarray | None = None


@dataclass
class FederatedData:
    """A loaded store. ``train(i)`` / ``test(i)`` give client i's arrays (scaled to float32)."""

    path: Path
    meta: dict[str, Any]
    x_train: np.ndarray
    y_train: np.ndarray
    offsets_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    offsets_test: np.ndarray
    cluster: np.ndarray
    client_ids: list[str] = field(default_factory=list)
    domain_train: np.ndarray | None = None
    domain_test: np.ndarray | None = None

    @property
    def unseen_domains(self) -> list[int]:
        """Domain ids that occur only at test time (from ``meta["domains"]["unseen"]``)."""
        return [int(d) for d in self.meta.get("domains", {}).get("unseen", [])]

    @property
    def n_clients(self) -> int:
        return len(self.client_ids)

    @property
    def n_classes(self) -> int:
        return int(self.meta["n_classes"])

    @property
    def x_shape(self) -> tuple[int, ...]:
        return tuple(self.meta["x_shape"])

    @property
    def x_scale(self) -> float:
        return float(self.meta["x_scale"])

    @property
    def content_hash(self) -> str:
        return str(self.meta["content_hash"])

    @property
    def true_clusters(self) -> np.ndarray | None:
        """True cluster id per client, or None when the source has no ground truth."""
        return None if (self.cluster < 0).all() else np.asarray(self.cluster)

    def n_train(self) -> np.ndarray:
        return np.diff(self.offsets_train)

    def n_test(self) -> np.ndarray:
        return np.diff(self.offsets_test)

    def _rows(self, x, y, off, i) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(off[i]), int(off[i + 1])
        return np.asarray(x[a:b], dtype=np.float32) * np.float32(self.x_scale), np.asarray(y[a:b])

    def train(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self._rows(self.x_train, self.y_train, self.offsets_train, i)

    def test(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self._rows(self.x_test, self.y_test, self.offsets_test, i)


def content_hash(meta: dict[str, Any]) -> str:
    """sha256 over the array files' hashes (``meta["files"]``) and the :data:`CONTENT_KEYS` of meta."""
    h = hashlib.sha256()
    for name in sorted(meta["files"]):
        h.update(f"{name}:{meta['files'][name]}\n".encode())
    h.update(json.dumps({k: meta.get(k) for k in CONTENT_KEYS}, sort_keys=True).encode())
    return h.hexdigest()


def check_arrays(where: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any], *,
                 finite: bool = False) -> None:
    """Validate a store's arrays against its meta (see the module docstring); ``finite`` also
    scans floating-point features for NaN/inf (done on write; on load only with ``verify``)."""
    ids = [str(i) for i in meta["client_ids"]]
    m, n_classes, x_shape = len(ids), int(meta["n_classes"]), tuple(meta["x_shape"])
    if m == 0:
        raise StoreError(f"{where}: no clients")
    _check_meta_against_arrays(where, arrays, meta)
    if len(set(ids)) != m:
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise StoreError(f"{where}: duplicate client ids {dup}")
    for split in ("train", "test"):
        off, x, y = (arrays[f"{a}_{split}"] for a in ("offsets", "x", "y"))
        if off.shape != (m + 1,) or off[0] != 0 or (np.diff(off) < 0).any():
            raise StoreError(f"{where}/offsets_{split}.npy: expected {m + 1} non-decreasing "
                             f"offsets starting at 0 for {m} clients")
        if len(x) != off[-1] or len(y) != off[-1]:
            raise StoreError(f"{where}/x_{split}.npy: {len(x)} rows and y_{split}.npy "
                             f"{len(y)} rows, but offsets_{split}.npy ends at {off[-1]}")
        if len(x) and tuple(x.shape[1:]) != x_shape:
            raise StoreError(f"{where}/x_{split}.npy: sample shape {tuple(x.shape[1:])}, "
                             f"meta.json says {x_shape}")
        bad = np.flatnonzero((np.asarray(y) < 0) | (np.asarray(y) >= n_classes))
        if len(bad):
            c = ids[int(np.searchsorted(off, bad[0], side="right")) - 1]
            raise StoreError(f"{where}/y_{split}.npy: {len(bad)} labels outside [0, {n_classes - 1}] "
                             f"(first: {int(y[bad[0]])}, client {c!r})")
        if finite and len(x) and np.issubdtype(x.dtype, np.floating):
            rows = np.flatnonzero(~np.isfinite(np.asarray(x).reshape(len(x), -1)).all(1))
            if len(rows):
                c = ids[int(np.searchsorted(off, rows[0], side="right")) - 1]
                raise StoreError(f"{where}/x_{split}.npy: {len(rows)} samples contain NaN or inf "
                                 f"(first in client {c!r})")
    empty = [ids[i] for i in np.flatnonzero(np.diff(arrays["offsets_train"]) == 0)]
    if empty:
        raise StoreError(f"{where}: {len(empty)} clients have no training samples ({', '.join(empty[:5])}"
                         f"{', ...' if len(empty) > 5 else ''}); drop them, or lower the test fraction")
    if arrays["offsets_test"][-1] == 0:
        log.warning("%s: no client has test samples: the store can be re-split (partition stage) "
                    "but not trained on", where)
    if arrays["cluster"].shape != (m,):
        raise StoreError(f"{where}/cluster.npy: expected {m} entries, found {arrays['cluster'].shape}")
    _check_counts(where, arrays, meta)


def _check_meta_against_arrays(where: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """What meta.json says about the arrays is what they are: counts, dtypes (little-endian or
    native, labels and offsets int64, inputs ``x_dtype``), one dimension per index array, the
    sample shape's rank and the number of classes within bounds. A store whose hashes were
    recomputed after its metadata was edited is caught here, with the file and key named."""
    mp = f"{where}/meta.json"
    n_classes, x_shape = int(meta["n_classes"]), tuple(meta["x_shape"])
    if n_classes > MAX_CLASSES:
        raise StoreError(f"{mp}: n_classes {n_classes} is larger than {MAX_CLASSES}, the most a store "
                         f"may have (a stray label?)")
    if not 1 <= len(x_shape) <= 3:
        raise StoreError(f"{mp}: x_shape {list(x_shape)} has {len(x_shape)} dimensions; a sample is a "
                         f"vector (d,) or an image (channels, height, width)")
    for name, a in arrays.items():
        f = f"{where}/{name}.npy"
        dt = np.asarray(a[:0]).dtype if hasattr(a, "dtype") else np.asarray(a).dtype
        if dt.byteorder == (">" if np.little_endian else "<"):
            raise StoreError(f"{f}: stored {'big' if dt.byteorder == '>' else 'little'}-endian "
                             f"({dt.str}); a store holds native byte order (prepare it again)")
        if name.startswith("x_"):
            if dt.name not in X_DTYPES:
                raise StoreError(f"{f}: dtype {dt.name}; inputs are one of {', '.join(X_DTYPES)}")
            if "x_dtype" in meta and meta["x_dtype"] != dt.name:
                raise StoreError(f"{f}: dtype {dt.name} but meta.json's x_dtype says {meta['x_dtype']!r:.40}")
            if np.ndim(a) != 1 + len(x_shape):
                raise StoreError(f"{f}: {np.ndim(a)}-D array; meta.json's x_shape {list(x_shape)} "
                                 f"implies {1 + len(x_shape)}-D (samples, *x_shape)")
        else:
            if dt != INDEX_DTYPE:
                what = "labels" if name.startswith("y_") else "entries"
                raise StoreError(f"{f}: {what} of dtype {dt.name}; expected int64")
            if np.ndim(a) != 1:
                raise StoreError(f"{f}: {np.ndim(a)}-D array of shape {tuple(np.shape(a))}; expected "
                                 f"one dimension")


def _check_counts(where: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """meta.json's ``n_clients``, ``n_train`` and ``n_test`` agree with the client ids and offsets."""
    want = {"n_clients": len(meta["client_ids"]), "n_train": int(arrays["offsets_train"][-1]),
            "n_test": int(arrays["offsets_test"][-1])}
    for key, n in want.items():
        if key in meta and (type(meta[key]) is not int or meta[key] != n):
            src = "client_ids" if key == "n_clients" else f"offsets_{key[2:]}.npy"
            raise StoreError(f"{where}/meta.json: {key} is {meta[key]!r:.40} but {src} says {n}")


def warn_untested(where, client_ids, n_test) -> None:
    """Log the clients without test samples: they train but are left out of the test metrics."""
    idle = [str(client_ids[i]) for i in np.flatnonzero(np.asarray(n_test) == 0)]
    if idle:
        log.warning("%s: %d of %d clients have no test samples (%s%s); they train but are left out "
                    "of the test metrics", where, len(idle), len(client_ids), ", ".join(idle[:5]),
                    ", ..." if len(idle) > 5 else "")


# ------------------------------------------------------------------------------------------ loading
def load(path: str | Path, *, verify: bool = True, mmap: bool = True) -> FederatedData:
    """Open a store after :func:`verify_store`: the one way every command opens a store. The
    default ``verify=True`` is the full check (every file's sha256, metadata against the arrays,
    NaN/inf features), made before anything is read or written from the store; ``verify=False``
    (the cheap check: meta.json and file sizes) is for a store this process has just written."""
    path = Path(path)
    meta = verify_store(path, full=verify)
    arrays = {}
    for name in _array_names(meta):
        f = path / f"{name}.npy"
        try:
            arrays[name] = np.load(f, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise StoreError(f"{f}: unreadable ({e})") from e
    for split in ("train", "test"):
        dom, n = arrays.get(f"domain_{split}"), len(arrays[f"y_{split}"])
        if dom is not None and dom.shape != (n,):
            raise StoreError(f"{path}/domain_{split}.npy: expected one domain id per {split} "
                             f"sample ({n}), found shape {dom.shape}")
    check_arrays(path, arrays, meta, finite=verify)
    return FederatedData(path=path, meta=meta, client_ids=list(meta["client_ids"]), **arrays)


def _array_names(meta: dict) -> tuple[str, ...]:
    return ARRAYS + tuple(n for n in OPTIONAL if f"{n}.npy" in meta["files"])


#: meta.json keys every store has, and the check each value must pass
_META_TYPES = {
    "client_ids": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v)),
    "n_classes": ("an integer >= 1", lambda v: type(v) is int and v >= 1),
    "x_shape": ("a list of integers >= 1", lambda v: isinstance(v, list)
                and all(type(i) is int and i >= 1 for i in v)),
    "x_scale": ("a finite number > 0", lambda v: type(v) in (int, float) and math.isfinite(v) and v > 0),
    "files": ("an object of file hashes", lambda v: isinstance(v, dict) and all(
        isinstance(h, str) for h in v.values()) and all(f"{a}.npy" in v for a in ARRAYS)),
    "content_hash": ("a string", lambda v: isinstance(v, str)),
}


def verify_store(path: str | Path, *, full: bool = False) -> dict[str, Any]:
    """Check a store before it is used and return its meta; :class:`StoreError` names the file.

    Always (cheap: reads meta.json and the .npy headers): format, the type of every meta key, the
    content hash recomputed from meta.json, every array file present with the size its header
    implies. ``full``: every array file's sha256 against meta.json (a full read)."""
    path = Path(path)
    meta_path = path / "meta.json"
    if not (meta_path.exists() or meta_path.is_symlink()):       # not a regular file: read_limited says
        raise StoreError(f"{meta_path}: missing; {path} is not a prepared store "
                         f"(make one with `mcfl prepare`)")
    try:
        meta = json.loads(read_limited(meta_path, MAX_JSON_BYTES, what="store's meta.json"))
    except InputError as e:
        raise StoreError(str(e)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StoreError(f"{meta_path}: not valid JSON ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        fmt = meta.get("format") if isinstance(meta, dict) else None
        old = " (written by an older mcfl: prepare it again)" if fmt == "mcfl-store/1" else ""
        raise StoreError(f"{meta_path}: format {fmt!r}, expected {FORMAT!r}{old}")
    for key, (want, ok) in _META_TYPES.items():
        if key not in meta:
            raise StoreError(f"{meta_path}: missing key {key!r}")
        if not ok(meta[key]):
            raise StoreError(f"{meta_path}: {key} must be {want}, found {meta[key]!r:.60}")
    if content_hash(meta) != meta["content_hash"]:
        raise StoreError(f"{meta_path}: content hash does not match the file hashes and metadata "
                         f"(meta.json edited or corrupt); prepare the store again")
    for name in _array_names(meta):
        f = path / f"{name}.npy"
        if not f.is_file():
            raise StoreError(f"{f}: missing from the store")
        _check_npy_size(f)
        if full and sha256_file(f) != meta["files"][f"{name}.npy"]:
            raise StoreError(f"{f}: sha256 differs from meta.json (file changed or corrupt)")
    return meta


def _check_npy_size(f: Path) -> None:
    """The file is as long as its .npy header says (a truncated or extended file fails here)."""
    try:
        with open(f, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read(fh)
            want = fh.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    except (ValueError, OSError) as e:
        raise StoreError(f"{f}: not a readable .npy file ({e})") from e
    if dtype.hasobject or f.stat().st_size != want:
        raise StoreError(f"{f}: {f.stat().st_size} bytes, its header implies {want} "
                         f"(file truncated or changed)")
