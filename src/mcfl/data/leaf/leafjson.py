"""LEAF's JSON format in and out of the store: the ``leaf_json`` source and ``mcfl export-leaf``.

A LEAF data directory has ``train/`` and ``test/`` (and ``all_data/``) holding JSON files of
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``, as
LEAF's ``preprocess.sh`` writes them. The source reads a researcher's own LEAF output::

    datasets: {femnist_leaf: {prepare: {source: leaf_json, dir: path/to/leaf/data/femnist/data}}}
    mcfl prepare leaf_json --dir DIR --out STORE          # mcfl import-leaf DIR --out STORE: same
    mcfl.data.prepare("leaf_json", out, dir=DIR)

It reads every ``*.json`` and ``*.json.gz`` of ``train/`` and ``test/`` (sorted; users may spread
over files, as LEAF's shards do) and writes one client per user, sorted by user id as LEAF's
reference loader does. Every test user must also be a train user (LEAF's ``-t sample``). Inputs:

* numeric ``x`` vectors: stored uint8 with ``x_scale = 1/255`` when every value is k/255 (FEMNIST;
  exact), float32 otherwise. LEAF's image sizes are reshaped: 784 values to (1, 28, 28), 3*84*84 to
  (3, 84, 84). Pixel data (every value k/255) of any other length is refused unless ``x_shape``
  says what it is (a truncated image is not taken for a feature vector); other float vectors (LEAF's
  synthetic data) are stored as they are;
* CelebA's image-file names: decoded from ``images`` (``img_align_celeba/`` or its zip) exactly as
  ``mcfl prepare celeba`` does;
* ``y``: integers (CelebA's 0.0/1.0 floats too); ``n_classes`` defaults to the largest label + 1
  (give it, e.g. 62 for FEMNIST, when a sample may miss the last classes).

Malformed input stops before anything is written, with the file, the user and the fault named: bad
JSON or gzip, a missing key, ``users``/``num_samples`` that are not equal-length lists, a user id that
is not a string, a user in ``user_data`` but not in ``users`` (or the reverse), x/y lengths that
differ, a non-numeric or boolean value, ragged samples, an empty split. Export writes ``all_data/``
(train then test samples of each user), ``train/`` and ``test/``, 100 users per file, x as flat
row-major lists of floats (``stored * x_scale``; uint8 / 255 gives LEAF's FEMNIST values), so a
round trip is exact.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import zlib
from pathlib import Path
from typing import Annotated

import numpy as np
from annotated_types import Ge

from mcfl.data.leaf import DataSourceError
from mcfl.data.leaf.archive import Archive
from mcfl.data.store import MAX_CLASSES, ClientData, StoreError, load
from mcfl.data.write import write_store
from mcfl.inputs import InputError, check_regular, read_limited
from mcfl.io import atomic_path

USERS_PER_FILE = 100
SHAPES = {784: (1, 28, 28), 3 * 84 * 84: (3, 84, 84)}
PATTERNS = ("*.json", "*.json.gz")
#: a JSON true/false used as a value (a list entry or a mapping value), not inside a string
_BOOL = re.compile(rb"[\[,:]\s*(?:true|false)\s*[,\]}]")


#: the most bytes one LEAF JSON file may hold, and a ``.json.gz`` once decompressed (LEAF's
#: FEMNIST shards hold a few hundred MB each)
MAX_FILE_BYTES = 1 << 32


def leaf_files(folder: str | Path) -> list[Path]:
    """The LEAF JSON files of one split folder (``*.json`` and ``*.json.gz``), sorted. A name that
    matches but is not a regular file (a dangling symbolic link, a FIFO, a device, a directory) is
    refused by name: skipping it would write a store without that shard's users."""
    files = sorted(f for pattern in PATTERNS for f in Path(folder).glob(pattern))
    for f in files:
        try:
            check_regular(f, "LEAF JSON file")
        except InputError as e:
            raise DataSourceError(str(e)) from None
    return files


def _read_bytes(f: Path) -> bytes:
    """A LEAF file's JSON bytes (decompressed for ``.gz``), at most :data:`MAX_FILE_BYTES`."""
    try:
        raw = read_limited(f, MAX_FILE_BYTES, what="LEAF JSON file")
    except InputError as e:
        raise DataSourceError(str(e)) from None
    except OSError as e:
        raise DataSourceError(f"{f}: cannot read ({e.strerror or e})") from None
    if not f.name.endswith(".gz"):
        return raw
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
            raw = g.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise DataSourceError(f"{f}: not a readable gzip file ({e})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise DataSourceError(f"{f}: more than {MAX_FILE_BYTES} bytes once decompressed; a LEAF "
                              f"JSON file may hold at most {MAX_FILE_BYTES} bytes")
    return raw


def _read_doc(f: Path) -> dict:
    raw = _read_bytes(f)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataSourceError(f"{f}: not valid JSON ({e})") from None
    except RecursionError:
        raise DataSourceError(f"{f}: not valid LEAF JSON (nested too deeply)") from None
    except ValueError as e:                     # an integer of more than 4300 digits, ...
        raise DataSourceError(f"{f}: not valid LEAF JSON ({' '.join(str(e).split())[:160]})") from None
    if not isinstance(data, dict):
        raise DataSourceError(f"{f}: top level must be an object with 'users' and 'user_data'")
    for key in ("users", "user_data"):
        if key not in data:
            raise DataSourceError(f"{f}: missing key {key!r}")
    users, entries = data["users"], data["user_data"]
    counts = data.get("num_samples", [None] * len(users) if isinstance(users, list) else None)
    if not isinstance(users, list) or not isinstance(counts, list) or len(counts) != len(users):
        raise DataSourceError(f"{f}: 'users' and 'num_samples' must be lists of equal length")
    if not users:
        raise DataSourceError(f"{f}: 'users' is empty")
    if not isinstance(entries, dict):
        raise DataSourceError(f"{f}: 'user_data' must be an object (user -> x, y)")
    bad = next((u for u in users if not isinstance(u, str)), None)
    if bad is not None:
        raise DataSourceError(f"{f}: user id {bad!r} is not a string")
    stray = sorted(set(entries) - set(users))
    if stray:
        raise DataSourceError(f"{f}: user {stray[0]!r} is in 'user_data' but not in 'users'")
    if _BOOL.search(raw):                        # rare: find the user and say which
        for u in users:
            e = entries.get(u) if isinstance(entries.get(u), dict) else {}
            for key in ("x", "y"):
                if any(isinstance(v, bool) for v in _flat(e.get(key))):
                    raise DataSourceError(f"{f}: user {u!r}: {key} has a boolean value")
    return data


def _flat(values) -> list:
    if not isinstance(values, list):
        return []
    return [v for row in values for v in (row if isinstance(row, list) else [row])]


def read_leaf_split(folder: Path) -> dict[str, tuple[list, list, str]]:
    """user -> (x, y, file) over every LEAF file of ``folder``, each file checked."""
    files = leaf_files(folder)
    if not folder.is_dir() or not files:
        raise DataSourceError(f"{folder}: missing or holds no *.json / *.json.gz files (expected "
                              f"LEAF's train/ and test/ directories)")
    users: dict[str, tuple[list, list, str]] = {}
    for f in files:
        data = _read_doc(f)
        for user, n in zip(data["users"], data.get("num_samples", [None] * len(data["users"]))):
            where = f"{f}: user {user!r}"
            entry = data["user_data"].get(user)
            if not isinstance(entry, dict):
                raise DataSourceError(f"{where}: missing from 'user_data'")
            for key in ("x", "y"):
                if not isinstance(entry.get(key), list):
                    raise DataSourceError(f"{where}: missing key {key!r} (a list)")
            x, y = entry["x"], entry["y"]
            if len(x) != len(y):
                raise DataSourceError(f"{where}: x has {len(x)} samples but y has {len(y)}")
            if n is not None and n != len(y):
                raise DataSourceError(f"{where}: num_samples says {n!r} but there are {len(y)} samples")
            if user in users:
                raise DataSourceError(f"{where}: also in {users[user][2]}")
            users[user] = (x, y, str(f))
    return users


def _numeric(values: list, where: str, what: str) -> np.ndarray:
    """``values`` as a float64 array, or an error naming the first non-numeric entry."""
    bad = "non-numeric"
    try:
        a = np.array(values)
        if a.dtype.kind in "iuf":
            return a.astype(np.float64)
    except ValueError:
        bad = "ragged (samples of different lengths)"
    flat = values if what == "y" else [v for row in values for v in (row if isinstance(row, list) else [row])]
    for v in flat:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DataSourceError(f"{where}: {what} has a non-numeric value {v!r:.60}")
    big = next((v for v in flat if isinstance(v, int) and abs(v) > 2**53), None)
    if big is not None and bad == "non-numeric":
        raise DataSourceError(f"{where}: {what} has a value too large to store ({str(big)[:30]}...)")
    raise DataSourceError(f"{where}: {what} is {bad}")


def _check_float32(x: np.ndarray, where: str) -> None:
    """Every value of ``x`` (float64, one row per sample) is finite in float32, the precision the
    store keeps and training uses; checked before any arithmetic on ``x``, so numpy warns of
    nothing. The error names the file, the user and the sample."""
    bad = ~(np.abs(x) <= np.finfo(np.float32).max)          # NaN compares False: bad too
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise DataSourceError(f"{where}: x of sample {i} holds {x[i, j]:g} (value {j}): not a finite "
                              f"float32 (magnitude at most {np.finfo(np.float32).max:.2e}), the "
                              f"precision the store keeps")


def _labels(y: list, where: str) -> np.ndarray:
    a = _numeric(y, where, "y")
    if a.ndim != 1 or not np.all(np.isfinite(a)) or np.any(a != np.round(a)) or np.any(a < 0):
        raise DataSourceError(f"{where}: y must be non-negative integers")
    if len(a) and a.max() >= MAX_CLASSES:
        raise DataSourceError(f"{where}: y has the label {int(a.max())}; labels must be below "
                              f"{MAX_CLASSES} (the most classes a store may have)")
    return a.astype(np.int64)


def _check_options(n_classes, x_shape) -> None:
    """The flags, before any file is read: ``--n-classes`` within the store's bound, ``--x-shape``
    positive sizes of a vector or an image."""
    if n_classes is not None and (type(n_classes) is not int or not 1 <= n_classes <= MAX_CLASSES):
        raise DataSourceError(f"n_classes (--n-classes): {n_classes!r:.40} is not allowed; give a "
                              f"number of classes from 1 to {MAX_CLASSES}")
    if any(type(v) is not int or v < 1 for v in x_shape) or len(x_shape) > 3:
        raise DataSourceError(f"x_shape (--x-shape): {list(x_shape)!r:.60} is not allowed; give one "
                              f"sample's shape as 1 to 3 positive sizes (e.g. 1 28 28)")


def make_leaf_json(out: str | Path, *, dir: str, images: str | None = None,
                   n_classes: Annotated[int, Ge(1)] | None = None,
                   x_shape: tuple[int, ...] = (), workers: int = 0) -> Path:
    """Read a LEAF data directory ``dir`` (``train/``, ``test/``) into a store at ``out``.

    ``images``: the ``img_align_celeba`` folder or zip, when ``x`` holds CelebA's file names;
    ``n_classes``: default the largest label + 1; ``x_shape``: the shape of one sample, needed only
    for pixel data of a size LEAF does not make (see the module docstring)."""
    src = Path(dir)
    x_shape = tuple(int(v) if isinstance(v, str) and v.strip().lstrip("-").isdigit() else v
                    for v in x_shape)             # the command line's --x-shape gives strings
    _check_options(n_classes, x_shape)
    try:
        return _make_leaf_json(out, src, images, n_classes, x_shape, workers)
    except (DataSourceError, StoreError, OSError):
        raise
    except (ValueError, TypeError, OverflowError, IndexError, KeyError, RecursionError) as e:
        raise DataSourceError(f"{src}: malformed LEAF data ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:160]})") from None


def _make_leaf_json(out, src: Path, images, n_classes, x_shape, workers) -> Path:
    train, test = read_leaf_split(src / "train"), read_leaf_split(src / "test")
    extra = sorted(set(test) - set(train))
    if extra:
        raise DataSourceError(f"{test[extra[0]][2]}: user {extra[0]!r} has test data but no "
                              f"training data (a store needs LEAF's -t sample split)")
    ids = sorted(train)
    if not any(len(y) for _, y, _ in test.values()):
        raise DataSourceError(f"{src / 'test'}: no user has test samples; a store needs test data "
                              f"(LEAF's -t sample split)")
    filenames = any(isinstance(v, str) for x, _, _ in train.values() for v in x[:1])
    if filenames:
        return _import_images(src, out, ids, train, test, images, n_classes, workers)
    dim, parts = None, {}
    for split, users in (("train", train), ("test", test)):
        for u in ids:
            x, y, f = users.get(u, ([], [], ""))
            where = f"{f}: user {u!r}"
            xa = _numeric(x, where, "x") if x else None
            if xa is not None and (xa.ndim != 2 or xa.shape[1] != (dim or xa.shape[1])):
                raise DataSourceError(f"{where}: x must hold vectors of {dim or 'equal'} numbers")
            if xa is not None and xa.shape[1] == 0:
                raise DataSourceError(f"{where}: x holds samples of no values")
            if xa is not None:
                _check_float32(xa, where)
            dim = dim or (xa.shape[1] if xa is not None else None)
            parts[split, u] = (_compact(xa), _labels(y, where))
    exact = all(x is None or x.dtype == np.uint8 for x, _ in parts.values())
    shape = _sample_shape(src, dim, tuple(int(v) for v in x_shape), pixels=exact)

    def conv(x):
        if x is None:
            return np.zeros((0, *shape), np.uint8 if exact else np.float32)
        x = x if exact or x.dtype != np.uint8 else (x / 255).astype(np.float32)
        return x.reshape(len(x), *shape)

    clients = [ClientData(u, conv(parts["train", u][0]), parts["train", u][1],
                          conv(parts["test", u][0]), parts["test", u][1]) for u in ids]
    return _write(out, clients, src, n_classes, 1 / 255 if exact else 1.0)


def leaf_inputs(*, dir: str, images: str | None = None, **_) -> list[str]:
    """The files a ``leaf_json`` store is made from (the workflow's inputs of its prepare job, so
    that a changed LEAF file re-prepares the store and reruns what depends on it)."""
    files = [str(f) for split in ("train", "test") for f in leaf_files(Path(dir) / split)]
    return files + ([images] if images else [])


def check_leaf_dir(*, dir: str, images: str | None = None, **_) -> None:
    """Config validation (before any job): ``dir`` holds LEAF's ``train/`` and ``test/`` files and
    ``images``, if given, exists. The files' content is checked when the store is prepared."""
    for split in ("train", "test"):
        if not leaf_files(Path(dir) / split):
            raise ValueError(f"dir: {Path(dir) / split} is missing or holds no *.json / *.json.gz "
                             f"files (expected a LEAF data directory with train/ and test/)")
    if images and not Path(images).exists():
        raise ValueError(f"images: {images} does not exist (the img_align_celeba folder or zip)")


make_leaf_json.inputs = leaf_inputs
make_leaf_json.check = check_leaf_dir


def import_leaf(src: str | Path, out: str | Path, **params) -> Path:
    """``mcfl import-leaf``: the ``leaf_json`` source with the directory first."""
    return make_leaf_json(out, dir=str(src), **params)


def _sample_shape(src: Path, dim: int | None, x_shape: tuple[int, ...], pixels: bool) -> tuple:
    """One sample's stored shape: ``x_shape`` if given, LEAF's image shape for its sizes, a flat
    vector for float features; pixel data of another size is an error (a truncated image)."""
    if x_shape:
        if math.prod(x_shape) != dim:
            raise DataSourceError(f"{src}: x_shape {list(x_shape)} holds {math.prod(x_shape)} "
                                  f"values but the samples have {dim}")
        return x_shape
    if dim in SHAPES:
        return SHAPES[dim]
    if pixels and dim:
        known = ", ".join(f"{n} ({'x'.join(map(str, s))})" for n, s in SHAPES.items())
        raise DataSourceError(f"{src}: the samples look like images (every value k/255) but hold "
                              f"{dim} values, not one of LEAF's sizes {known}; a file may be "
                              f"truncated. Give x_shape if {dim} values is what you mean")
    return (dim or 0,)


def _compact(x: np.ndarray | None) -> np.ndarray | None:
    """uint8 when every value is k/255 (LEAF's FEMNIST pixels; exact), else float32."""
    if x is None:
        return None
    q = np.round(x * 255)
    if np.all((x >= 0) & (x <= 1)) and np.all(np.abs(x * 255 - q) < 1e-6):
        return q.astype(np.uint8)
    return x.astype(np.float32)


def _import_images(src, out, ids, train, test, images, n_classes, workers):
    from mcfl.data.leaf.images import celeba_pixels, write_split_store     # deferred: Pillow, for CelebA only

    if not images:
        raise DataSourceError(f"{src}: x holds image file names (LEAF's CelebA); pass --images with "
                              f"the img_align_celeba folder or zip")
    with Archive(images) as archive:
        member = {n.rsplit("/", 1)[-1]: n for n in archive.names}
        ref: dict[str, int] = {}                  # image name -> index into `names` / `labels`
        labels: list[int] = []
        clients = []
        for u in ids:
            refs = []
            for users in (train, test):
                x, y, f = users.get(u, ([], [], ""))
                for name, lab in zip(x, _labels(y, f"{f}: user {u!r}").tolist()):
                    if not isinstance(name, str) or name not in member:
                        raise DataSourceError(f"{f}: user {u!r}: {name!r} is not an image in {images}")
                    if name not in ref:
                        ref[name] = len(labels)
                        labels.append(lab)
                    elif labels[ref[name]] != lab:
                        raise DataSourceError(f"{f}: user {u!r}: {name} has two different labels")
                    refs.append(ref[name])
            clients.append((u, refs[:len(train[u][1])], refs[len(train[u][1]):]))
        top = max(labels)
        if n_classes is not None and n_classes <= top:
            raise DataSourceError(f"{src}: labels go up to {top} but n_classes is {n_classes}")
        return write_split_store(out, clients, archive, [member[n] for n in ref], celeba_pixels,
                                 labels=np.asarray(labels), n_classes=n_classes or top + 1,
                                 source="leaf_json", params=_params(src), x_scale=1.0,
                                 workers=workers)


def _write(out, clients, src, n_classes, x_scale):
    top = max(int(c.y_train.max(initial=0)) for c in clients)
    top = max([top] + [int(c.y_test.max(initial=0)) for c in clients])
    if n_classes is not None and n_classes <= top:
        raise DataSourceError(f"{src}: labels go up to {top} but n_classes is {n_classes}")
    return write_store(out, clients, n_classes=n_classes or top + 1, source="leaf_json",
                       params=_params(src), x_scale=x_scale)


def _params(src: Path) -> dict:
    """Provenance in the store's meta: the folder's name and each LEAF file's size."""
    files = {str(f.relative_to(src)): f.stat().st_size
             for split in ("train", "test") for f in leaf_files(src / split)}
    return {"from": src.name, "files": files}


def _floats(x: np.ndarray, scale: float) -> list:
    """Stored values as LEAF floats: x / 255 exactly when x_scale = 1/255."""
    flat = x.reshape(len(x), -1)
    inv = 1 / scale
    if abs(inv - round(inv)) < 1e-9:
        return (flat / float(round(inv))).tolist()
    return (flat.astype(np.float64) * scale).tolist()


def export_leaf(store: str | Path, out: str | Path) -> Path:
    """Write a store as a LEAF data directory (``all_data/``, ``train/``, ``test/``) at ``out``."""
    d = load(store)
    n = d.n_clients
    with atomic_path(out, is_dir=True, marker="all_data") as tmp:
        for sub in ("all_data", "train", "test"):
            (tmp / sub).mkdir()
        for j in range(math.ceil(n / USERS_PER_FILE)):
            ids = range(j * USERS_PER_FILE, min(n, (j + 1) * USERS_PER_FILE))
            sets = {"train": {}, "test": {}, "all_data": {}}
            for i in ids:
                u = d.client_ids[i]
                for split, (a, b) in (("train", d.offsets_train[i:i + 2]), ("test", d.offsets_test[i:i + 2])):
                    x = np.asarray(getattr(d, f"x_{split}")[a:b])
                    sets[split][u] = {"x": _floats(x, d.x_scale),
                                      "y": np.asarray(getattr(d, f"y_{split}")[a:b]).tolist()}
                sets["all_data"][u] = {k: sets["train"][u][k] + sets["test"][u][k] for k in ("x", "y")}
            for split, user_data in sets.items():
                users = list(user_data)
                doc = {"users": users, "num_samples": [len(user_data[u]["y"]) for u in users],
                       "user_data": user_data}
                name = f"all_data_{j}.json" if split == "all_data" else f"all_data_{j}_{split}.json"
                (tmp / split / name).write_text(json.dumps(doc))
    return Path(out)
