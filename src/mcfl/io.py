"""Small I/O helpers: atomic writes, content hashes, and the git revision.

Every file the package produces goes through :func:`atomic_path` (or a helper built on it) so that a
killed process never leaves a half-written output that Snakemake or the report could mistake for a
result: content is written to a temporary sibling (``.<name>.<pid>.<random>.tmp``) and renamed into
place. A process killed mid-write (SIGKILL) leaves its temporary behind; the next write of the same
path removes every such temporary whose process is gone (:func:`remove_stale_temps`). Files and
directories are created with the permissions the umask allows (as ``open`` would), not the private
ones of :mod:`tempfile`. A command that writes a set of files stages them all first and renames the
set into place (:func:`staged`), so a failure leaves the earlier set as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import numbers
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

from mcfl.inputs import MAX_JSON_BYTES, InputError, check_regular, present, read_limited
from mcfl.paths import plain_name


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, is_dir: bool = False,
                marker: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it onto ``path``.

    On error the temporary file or directory is removed and ``path`` is left untouched. A directory
    (``is_dir``) replaces an earlier one only if that is empty or holds ``marker`` (the file that
    shows it is an output of the same kind, e.g. a store's ``meta.json``): a folder the command did
    not make is refused with a ValueError before anything is written.
    """
    path = Path(path)
    if is_dir:
        _check_replaceable(path, marker)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(path)
        prefix = f".{path.name}.{os.getpid()}."
        if is_dir:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=path.parent))
            tmp.chmod(0o777 & ~umask())
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
            os.fchmod(fd, 0o666 & ~umask())
            os.close(fd)
            tmp = Path(name)
    except OSError as e:
        raise named(e, path) from e
    try:
        yield tmp
        if is_dir and path.exists():
            _check_replaceable(path, marker)
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and (e.filename is None or str(e.filename).startswith(str(tmp))):
            raise named(e, path) from e         # the output's name, not the temporary's
        raise


def _check_replaceable(path: Path, marker: str | None) -> None:
    """A ValueError unless the directory ``path`` is absent, empty, or holds ``marker``."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise ValueError(f"{path}: exists and is not a directory; refusing to replace it")
    if path.is_dir() and any(path.iterdir()) and not (marker and (path / marker).exists()):
        what = f"has no {marker}" if marker else "is not empty"
        raise ValueError(f"{path}: a folder this command did not write ({what}); refusing to "
                         f"replace it: choose another --out or remove it first")


def umask() -> int:
    """The process's umask, read without changing it where Linux tells it (``/proc``); elsewhere
    set and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


@contextlib.contextmanager
def staged(out: str | os.PathLike) -> Iterator[Path]:
    """Write a set of files into the directory ``out`` all or nothing: yield a staging directory
    (a hidden temporary inside ``out``, named as :func:`atomic_path` names its temporaries) to
    write them into under their relative names (subfolders allowed); when every file is written,
    rename each into place. A failure or a kill while writing (a full disk, SIGTERM) removes the
    staging directory and leaves the earlier files in ``out`` as they were; only the final renames,
    which write no data, stand between the two sets. Files of ``out`` the set does not name stay;
    an ``out`` this call created is removed again when the set fails, if nothing else is in it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: --out must be a directory, not a file")
    created, done = not out.exists(), False
    try:
        out.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out / _STAGED)
        tmp = Path(tempfile.mkdtemp(prefix=f".{_STAGED}.{os.getpid()}.", suffix=".tmp", dir=out))
        tmp.chmod(0o777 & ~umask())
    except OSError as e:
        raise named(e, out) from e
    try:
        yield tmp
        files = sorted(f.relative_to(tmp) for f in tmp.rglob("*") if not f.is_dir())
        for f in files:
            (out / f).parent.mkdir(parents=True, exist_ok=True)
        for f in files:
            os.replace(tmp / f, out / f)
        done = True
    except OSError as e:
        if e.filename is None:
            raise named(e, out) from e
        if str(e.filename).startswith(str(tmp)):           # the output's name, not the stage's
            raise named(e, out / os.path.relpath(e.filename, tmp)) from e
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if created and not done:
            with contextlib.suppress(OSError):
                out.rmdir()


_STAGED = "staged"


def named(e: OSError, path: str | os.PathLike) -> OSError:
    """``e`` (say ENOSPC from a ``write()``, which names no file) as an OSError of the same kind
    naming ``path``: the CLI prints it as ``PATH: no space left on device``."""
    what = e.strerror or str(e) or type(e).__name__
    if e.errno is None:                          # numpy's "1433 requested and 496 written"
        what = f"write failed ({what}; is the disk full?)"
    return OSError(e.errno, what, str(path))


def remove_stale_temps(path: str | os.PathLike) -> None:
    """Remove the temporaries of :func:`atomic_path` for ``path`` left by processes that are gone."""
    path = Path(path)
    if not path.parent.is_dir():
        return
    for tmp in path.parent.iterdir():
        # (``.tmp-journal``: SQLite's journal beside a temporary database, mcfl.track_store)
        if not (tmp.name.startswith(f".{path.name}.") and tmp.name.endswith((".tmp", ".tmp-journal"))):
            continue
        pid = tmp.name[len(path.name) + 2:].split(".", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):       # another file's temporary, or a live writer
            continue
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:         # another user's process
        return True
    return True


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def state_on(state: dict, device: Any) -> dict:
    """A saved algorithm state where ``init()`` would have made it, whichever device wrote it:
    float tensors (models, centres) on ``device``, index tensors (assignments, groups) on the CPU,
    where the algorithms read them with ``.numpy()``."""
    import torch

    return {k: v.to(device) if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in state.items()}


def load_tensors(path: str | os.PathLike, what: str, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` whose every failure is one ValueError naming the
    file (an OSError stays one): a pickle of anything but tensors, numbers and containers is
    refused without running it, and a file that is no torch archive at all says so; so is
    anything but a regular file (a FIFO would block the read)."""
    import pickle
    import zipfile

    import torch

    import warnings

    if os.path.lexists(path):                   # absent: torch.load's FileNotFoundError, as before
        check_regular(path, "regular file")
    try:
        with warnings.catch_warnings():      # a foreign pickle's protocol: the error below says it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location=map_location, weights_only=True)
    except OSError:
        raise
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: not {what}: it holds objects other than tensors, which are "
                         f"not loaded ({first[:120]})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, TypeError, AttributeError,
            KeyError, IndexError, MemoryError) as e:
        raise ValueError(f"{path}: not {what} ({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def canonical_json(obj: Any) -> str:
    """The one JSON spelling of a config: sorted keys, no whitespace. Used for hashes and params."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)


def config_hash(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


def git_revision(cwd: str | os.PathLike | None = None) -> str:
    """``<sha>`` or ``<sha>-dirty`` of the checkout holding ``cwd``; ``unknown`` outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ------------------------------------------------------------------------------------------- CSV
def _null(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v) or type(v).__name__ in ("NAType", "NaTType") \
        or (hasattr(v, "dtype") and getattr(v, "ndim", 1) == 0 and v.dtype.kind == "f" and v != v)


def _kind(v: Any) -> str:
    """'b', 'i', 'f' or 'o' (anything else) of a non-null scalar, as pandas infers a column."""
    if isinstance(v, bool) or type(v).__name__ in ("bool", "bool_"):  # numpy's bool: not a Number
        return "b"
    if isinstance(v, numbers.Integral):
        return "i"
    if isinstance(v, numbers.Real):
        return "f"
    return "o"


def _cells(values) -> list:
    """One column's CSV cells as ``pandas.DataFrame(...).to_csv`` writes them: the column's dtype
    as pandas infers it from the values (ints with a missing value are floats, bools with one are
    objects ...), floats in numpy's spelling (pandas' ``astype(str)``), missing values empty."""
    import numpy as np

    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
        if values.dtype.kind == "f":
            out = values.astype(str).astype(object)
            out[np.isnan(values)] = ""
            return out.tolist()
        return values.tolist() if values.dtype.kind != "b" else [str(bool(v)) for v in values]
    if isinstance(values, np.ndarray) and values.dtype.kind in "US":
        return values.astype(str).tolist()
    if not isinstance(values, (list, tuple, np.ndarray)) and hasattr(values, "__array__"):
        return _cells(np.asarray(values))                              # a tensor ...
    values = list(values.tolist() if isinstance(values, np.ndarray) else values)
    null = [_null(v) for v in values]
    kinds = {_kind(v) for v, n in zip(values, null) if not n}
    if kinds == {"i"} and not any(null):
        return [int(v) for v in values]
    if kinds and kinds <= {"i", "f"}:
        f = np.array([np.nan if n else float(v) for v, n in zip(values, null)], dtype=np.float64)
        return _cells(f)
    if kinds == {"b"} and not any(null):
        return [str(bool(v)) for v in values]
    return ["" if n else v for v, n in zip(values, null)]


def csv_text(columns: dict[str, Any], n_rows: int | None = None) -> str:
    """The CSV that ``pandas.DataFrame(columns).to_csv(path, index=False)`` writes, byte for byte,
    for columns of numbers, bools and strings (a scalar fills its column), without importing pandas
    (a training job's outputs need nothing else of it). ``tests/test_io.py`` compares the two."""
    import csv
    import io

    if n_rows is None:
        n_rows = next((len(v) for v in columns.values() if not _scalar(v)), 0)
    cols = [_cells([v] * n_rows if _scalar(v) else v) for v in columns.values()]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator=os.linesep, quoting=csv.QUOTE_MINIMAL)
    w.writerow(list(columns))
    w.writerows(zip(*cols))
    return buf.getvalue()


def rows_csv(rows: list[dict[str, Any]]) -> str:
    """``csv_text`` of ``pandas.DataFrame(rows)``: a column per key in order of first appearance,
    empty where a row lacks the key."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return csv_text({k: [r.get(k) for r in rows] for k in keys}, len(rows))


def _scalar(v: Any) -> bool:
    return not isinstance(v, (list, tuple)) and getattr(v, "ndim", 0) == 0


#: the files of a finished run directory (``mcfl train``), in the order they are written
OUTPUTS = ("history.csv", "assignments.csv", "predictions.csv", "metrics.json")


def read_run(run_dir: str | os.PathLike, *, history: bool = False, predictions: bool = False,
             clusters: bool = False, need: tuple[str, ...] = ()) -> dict[str, Any]:
    """A finished run directory's ``metrics.json`` (with ``dir``), its ``history.csv`` as a
    DataFrame under ``history`` if asked, and if asked and the run wrote ``predictions.csv``, per
    test image its label ``y``, whether the run got it right ``hit`` and (where the file names it)
    its writer ``client``; with ``clusters``, each client's final cluster (``cluster_of``, from
    ``assignments.csv``; absent for unclustered methods): the one reader of run directories for
    every report. ``need``: the keys the caller reads (``final.micro_acc`` for a key of ``final``);
    a run without one is a one-line ValueError naming its metrics.json and the key."""
    d = Path(run_dir)
    m = read_metrics(d / "metrics.json")
    for key in need:
        top, _, sub = key.partition(".")
        if top not in m or (sub and sub not in m[top]):
            raise InputError(f"{d / 'metrics.json'}: no {key} (a report reads it from a run `mcfl train` wrote)")
    m["dir"] = d
    if history:
        check_regular(d / "history.csv", "run's history.csv")
        m["history"] = read_csv(d / "history.csv")
    if predictions and present(d / "predictions.csv", "run's predictions.csv"):
        p = read_run_csv(d / "predictions.csv", ("y", "pred"), usecols=lambda c: c in ("client", "y", "pred"),
                     dtype={"client": str})
        m["y"], m["hit"] = p["y"].to_numpy(), (p["y"] == p["pred"]).to_numpy()
        if "client" in p:
            m["client"] = p["client"].to_numpy()
    if clusters and present(d / "assignments.csv", "run's assignments.csv"):
        a = read_run_csv(d / "assignments.csv", ("client", "cluster"), dtype={"client": str}).dropna(subset=["cluster"])
        if len(a):
            m["cluster_of"] = dict(zip(a["client"], a["cluster"].astype(int)))
    return m


#: the keys of a run's ``metrics.json`` that become parts of paths (figure names, run folders)
NAME_KEYS = ("dataset", "method", "label", "run_id")


def read_metrics(path: str | os.PathLike) -> dict[str, Any]:
    """A run's ``metrics.json``, checked: a JSON object whose names (:data:`NAME_KEYS`, where
    present) are plain names (:func:`mcfl.paths.plain_name`); otherwise a one-line ValueError
    naming the file (a truncated or binary file, a ``dataset`` of ``../../x``). Read with a byte
    limit, regular files only (:func:`mcfl.inputs.read_limited`)."""
    return parse_metrics(read_limited(path, MAX_JSON_BYTES, what="run's metrics.json"), path)


def parse_metrics(raw: bytes, path: str | os.PathLike) -> dict[str, Any]:
    """:func:`read_metrics` of the bytes ``raw`` read from ``path``."""
    try:
        m = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InputError(f"{path}: not a run's metrics (not UTF-8 JSON: {' '.join(str(e).split())[:100]})") from None
    if not isinstance(m, dict):
        raise InputError(f"{path}: not a run's metrics.json (a JSON object): a JSON {type(m).__name__}, not an object")
    for key in NAME_KEYS:
        if key in m:
            plain_name(m[key], f"{path}: {key}")
    final = m.get("final", {})
    if not isinstance(final, dict):
        raise InputError(f"{path}: final is a JSON {type(final).__name__}, not an object of metrics")
    for key, value in final.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InputError(f"{path}: final.{key} is {str(value)[:40]!r}, not a number")
    return m


def read_csv(path: str | os.PathLike, **kwargs: Any):
    """``pandas.read_csv`` whose failures on a damaged file (not UTF-8, not CSV) are one
    ValueError naming it."""
    import pandas as pd

    try:
        return pd.read_csv(path, **kwargs)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise ValueError(f"{path}: not a readable CSV file ({' '.join(str(e).split())[:100]})") from None


def read_run_csv(path: Path, columns: tuple[str, ...], **kw):
    """A run's CSV file read with pandas, holding ``columns``; an empty, malformed or non-UTF-8
    file, or one without those columns, is one ValueError naming it."""
    import pandas as pd

    try:
        t = pd.read_csv(path, **kw)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a run's CSV ({' '.join(str(e).split())[:120]})") from None
    missing = [c for c in columns if c not in t.columns]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r}; is it a file `mcfl train` wrote?")
    return t
