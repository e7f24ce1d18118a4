"""A per-machine cache of :mod:`mcfl.cost.probe`'s timings: the estimate that ``mcfl check-config`` and
every start of the workflow print probes a model's step, a method's round and a job's start-up
once per machine, not at every invocation.

An entry is keyed by what changes the cost it records: the machine (CPU model, PyTorch's CPU
capability such as ``AVX512`` or ``AVX2``, the GPU's name on a CUDA device), the PyTorch and Python
versions, the probe's threads (one, as a workflow job has), the package's code (a hash of its
modules: an edit to a model, a method or the probe itself reprobes) and the entry's own subject: a
model's step on a batch shape, a run's method, hyperparameters, model and train settings on its
dataset's sizes, a job's imports. A key that changed is simply a miss, probed again.

The entries live in one JSON file, ``probe.json``, in the user's cache folder
(``$XDG_CACHE_HOME/mcfl``, else ``~/.cache/mcfl`` on Linux; ``MCFL_CACHE_DIR`` names another
folder, and ``MCFL_NO_CACHE=1`` turns the cache off). The file is replaced atomically
(:func:`mcfl.io.write_json`), so concurrent invocations at worst probe twice; a file that cannot be
read, or is not this cache's, is named in one line on stderr and probed over."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

from mcfl.io import write_json
from mcfl.cost.probe import MethodCost, StepTimer, measure_startup, measure_step, method_costs, method_key
from mcfl.cost.workload import DataSize
from mcfl.timing import cpu_model

CACHE_DIR_ENV = "MCFL_CACHE_DIR"
NO_CACHE_ENV = "MCFL_NO_CACHE"
#: what the cache file says it is (a file without it is another program's, or an older format)
FORMAT = "mcfl-probe-cache/1"
#: at most this many entries are kept (the most recently written)
MAX_ENTRIES = 2000
#: the threads a probe measures on (:func:`mcfl.cost.probe.measure_step`: one, as a workflow job)
PROBE_THREADS = 1


def cache_dir() -> Path | None:
    """The folder of the cache: ``MCFL_CACHE_DIR``, else the user's cache folder for ``mcfl``;
    None when ``MCFL_NO_CACHE`` is set (to anything but ``0``)."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("mcfl", appauthor=False))


@functools.cache
def code_hash() -> str:
    """A hash of the installed package's modules (their paths and contents)."""
    root = Path(__file__).resolve().parents[1]          # src/mcfl: every module of the package
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def machine(device: str) -> dict[str, Any]:
    """What a timing on ``device`` depends on beside its subject (see the module docstring)."""
    import torch

    out = {"cpu": cpu_model(), "arch": platform.machine(),
           "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
           "python": platform.python_version(), "threads": PROBE_THREADS, "code": code_hash(),
           "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out


class ProbeCache:
    """The timings of the cache file in ``folder`` (none, and nothing written, when ``folder`` is
    None); :meth:`step`, :meth:`method_costs` and :meth:`startup` are :mod:`mcfl.cost.probe`'s
    measurements through it."""

    def __init__(self, folder: Path | None):
        self.path = Path(folder) / "probe.json" if folder is not None else None
        self._noted = False

    @classmethod
    def of_user(cls) -> "ProbeCache":
        """The cache in :func:`cache_dir`."""
        return cls(cache_dir())

    def step(self, timer: StepTimer | None = None) -> StepTimer:
        """``timer`` (default :func:`~mcfl.cost.probe.measure_step`) answering from the cache where it can."""
        timer = timer or measure_step

        def timed(model, x_shape, n_classes, batch_size, device):
            subject = [model, list(x_shape), n_classes, batch_size]
            got = self.lookup("step", subject, device)
            if _numbers(got, 2):
                return tuple(got)
            out = timer(model, x_shape, n_classes, batch_size, device)
            self.store("step", subject, device, list(out))
            return out
        return timed

    def method_costs(self, runs: list[dict], size: DataSize, device: str,
                     timer: StepTimer) -> dict[str, MethodCost]:
        """:func:`~mcfl.cost.probe.method_costs` of ``runs``, probing only the runs whose method has
        no entry (a method probed beside other runs is reused as it was probed)."""
        sizes = [list(size.x_shape), size.n_classes, size.n_clients, size.n_train, size.n_test]
        found: dict[str, MethodCost] = {}
        for run in runs:
            got = self.lookup("method", [method_key(run), sizes], device)
            if isinstance(got, dict) and _numbers([got.get(f.name) for f in _FIELDS], len(_FIELDS)):
                found[method_key(run)] = MethodCost(**{f.name: got[f.name] for f in _FIELDS})
        missing = [r for r in runs if method_key(r) not in found]
        fresh = method_costs(missing, size, device, timer) if missing else {}
        self.store_many("method", [([k, sizes], dataclasses.asdict(v)) for k, v in fresh.items()], device)
        return {**found, **fresh}

    def startup(self, imports: str, measure: Callable[[str], float] | None = None) -> float:
        """A job's start-up with ``imports`` (``measure``, default :func:`~mcfl.cost.probe.measure_startup`)."""
        measure = measure or measure_startup
        subject = [imports, sys.executable]
        got = self.lookup("startup", subject, "cpu")
        if _numbers([got], 1) and got > 0:
            return float(got)
        out = measure(imports)
        if out > 0:                                  # 0: it could not start; measure again next time
            self.store("startup", subject, "cpu", out)
        return out

    def lookup(self, kind: str, subject: Any, device: str) -> Any:
        """The value stored for ``subject`` of ``kind`` on ``device`` (None: not there)."""
        if self.path is None:
            return None
        entry = self._read().get(_key(kind, subject, device))
        return entry.get("value") if isinstance(entry, dict) else None

    def store(self, kind: str, subject: Any, device: str, value: Any) -> None:
        self.store_many(kind, [(subject, value)], device)

    def store_many(self, kind: str, pairs: list[tuple[Any, Any]], device: str) -> None:
        """Add ``pairs`` (subject, value) to the file, keeping the newest :data:`MAX_ENTRIES`;
        a file that cannot be written is named once and the cache goes on without it."""
        if self.path is None or not pairs:
            return
        entries = self._read()
        now = time.time()
        for subject, value in pairs:
            entries[_key(kind, subject, device)] = {"kind": kind, "value": value, "written": now}
        newest = sorted(entries.items(), key=lambda kv: _written(kv[1]))[-MAX_ENTRIES:]
        try:
            write_json(self.path, {"format": FORMAT, "entries": dict(newest)})
        except OSError as e:
            self._note(f"cannot write it ({e.strerror or e})")
            self.path = None

    def _read(self) -> dict:
        """The file's entries ({} when absent; named once when unreadable or foreign)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except OSError as e:
            self._note(f"cannot read it ({e.strerror or e})")
            return {}
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self._note(f"not JSON ({e})")
            return {}
        if not (isinstance(data, dict) and data.get("format") == FORMAT
                and isinstance(data.get("entries"), dict)):
            self._note(f'not a "{FORMAT}" file')
            return {}
        return data["entries"]

    def _note(self, why: str) -> None:
        if not self._noted:
            print(f"note: ignoring the probe cache {self.path}: {why}; probing again", file=sys.stderr)
            self._noted = True


_FIELDS = dataclasses.fields(MethodCost)


def _key(kind: str, subject: Any, device: str) -> str:
    text = json.dumps([kind, machine(str(device)), subject], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _numbers(values: Any, n: int) -> bool:
    """Whether ``values`` is a list of ``n`` finite non-negative numbers."""
    return (isinstance(values, (list, tuple)) and len(values) == n
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf")
                    for v in values))


def _written(entry: Any) -> float:
    w = entry.get("written") if isinstance(entry, dict) else None
    return w if isinstance(w, (int, float)) else 0.0
