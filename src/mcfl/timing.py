"""Where a round's time goes, read from every run's own outputs (no instrumentation needed).

:class:`LocalClock` counts the seconds a federation's local trainer spends in local training: its
``run`` (time spent producing each client's result, including lazily built tasks), ``train`` and
``gradient``, nested calls counted once (the batched executor's ``run`` may call ``train``). On CUDA it
waits for the device before reading the clock, so the seconds are the GPU's work, not the launch.
The runner resets it before each round; a round's other seconds are the server's (*aggregation*:
E/M-steps, distances, matching, averaging). ``history.csv`` gets three columns per round, the
:data:`COLUMNS`; ``metrics.json`` their totals under ``time_s``. They vary from run to run, so they
are the only columns of ``history.csv`` that do (:func:`without_times` drops them for comparisons).
"""

from __future__ import annotations

import platform
import time
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: seconds per round: local training, the rest of the round (server side), evaluation (0 if none)
COLUMNS = ("local_s", "aggregate_s", "eval_s")


class LocalClock:
    def __init__(self, trainer, device: torch.device | str = "cpu"):
        self.seconds = 0.0
        self._depth = 0
        self._start = 0.0
        self._cuda = str(device).startswith("cuda")
        for name in ("train", "gradient"):
            setattr(trainer, name, self._timed(getattr(trainer, name)))
        run = trainer.run
        trainer.run = wraps(run)(lambda tasks, rnd, *a, **k: self._timed_iter(run(tasks, rnd, *a, **k)))

    def reset(self) -> None:
        self.seconds = 0.0

    def sync(self) -> None:
        if self._cuda:
            import torch        # (loaded already: the run trains on CUDA)

            torch.cuda.synchronize()

    def __enter__(self):
        if self._depth == 0:
            self._start = time.perf_counter()
        self._depth += 1

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            self.sync()
            self.seconds += time.perf_counter() - self._start

    def _timed(self, fn):
        @wraps(fn)
        def timed(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return timed

    def _timed_iter(self, it):
        it = iter(it)
        while True:
            with self:
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item


def without_times(history):
    """``history`` (a DataFrame) without the timing columns, for run-to-run comparisons."""
    return history.drop(columns=[c for c in COLUMNS if c in history.columns])


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what :mod:`platform` says): the
    machine a timing or a table was made on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
