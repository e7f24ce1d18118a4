"""Run the ``mcfl`` console script with the job's phases timed; used by job_overhead.py.

    MCFL_PROBE_ENTRY=run python -X importtime benchmarks/_job_probe.py train --run ... --store ...

Imports nothing beyond what the interpreter has loaded at start-up, so that ``-X importtime`` sees
the job's own imports. The functions named in :data:`PHASES` are wrapped as their module is first
imported (a finder ahead of the others on ``sys.meta_path``), so the import order is the job's own.
Each call writes ``@@phase B|E NAME T`` to stderr (fd 2, the stream ``-X importtime`` writes to, so
the two interleave in order); ``T`` is ``time.monotonic()``, the clock the parent reads too.
"""

import os
import sys
import time


def _mark(what: str, name: str = "") -> None:
    os.write(2, f"\n@@phase {what} {name} {time.monotonic():.6f}\n".encode())


_mark("S")

#: module -> {attribute: phase}; phases in WORK are the job's work (the rounds, k-means), the rest
#: its fixed cost. ``algorithms.get`` wraps the class it returns (``__init__``, ``init``, ``round``).
PHASES = {
    "mcfl.cli": {"build_parser": "command line (argparse)", "_resolve_k": "config: parse --run"},
    "mcfl.config": {"parse_run": "config: parse --run"},
    "mcfl.track": {"make_tracker": "tracking"},
    "mcfl.data.store": {"load": "store: load and verify", "warn_untested": "store: load and verify"},
    "mcfl.federation": {"build_federation": "model build (federation)",
                        "resolve_device": "torch set-up"},
    "mcfl.runner": {"configure_torch": "torch set-up", "_load_checkpoint": "checkpoint",
                    "_write_outputs": "write outputs", "_progress": "progress bar"},
    "mcfl.io": {"git_revision": "git revision"},
    "mcfl.evaluation": {"evaluate": "rounds: evaluation", "evaluate_protocol": "rounds: evaluation"},
    "mcfl.algorithms": {"get": None},
    "mcfl.cluster.init": {"init_centres": "k-means init (first local models, restarts)",
                          "save_centres": "write outputs"},
    "mcfl.report.table": {"write_report": "report: tables and figures"},
}
WORK = ("rounds: training", "rounds: evaluation", "k-means init (first local models, restarts)")


def _timed(fn, name):
    def wrapper(*args, **kwargs):
        _mark("B", name)
        try:
            return fn(*args, **kwargs)
        finally:
            _mark("E", name)
    wrapper.__wrapped__ = fn
    return wrapper


def _tracker(fn):
    def make(*args, **kwargs):
        t = fn(*args, **kwargs)
        for m in ("start", "log", "flush", "artifacts", "end"):
            if hasattr(t, m):
                setattr(t, m, _timed(getattr(t, m), "tracking"))
        return t
    return _timed(make, "tracking")


def _algorithm(get):
    def wrapped(name):
        cls = get(name)
        if "__probe" not in cls.__dict__:
            cls.__init__ = _timed(cls.__init__, "model build (algorithm)")
            cls.init = _timed(cls.init, "algorithm init")
            cls.round = _timed(cls.round, "rounds: training")
            cls.__probe = True
        return cls
    return wrapped


def _patch(module) -> None:
    for attr, phase in PHASES[module.__name__].items():
        fn = getattr(module, attr, None)
        if fn is None:
            continue
        if attr == "make_tracker":
            setattr(module, attr, _tracker(fn))
        elif attr == "get":
            setattr(module, attr, _algorithm(fn))
        else:
            setattr(module, attr, _timed(fn, phase))


class _Finder:
    """Finds nothing itself: wraps the loader of a module named in PHASES to patch it once loaded."""

    def find_spec(self, name, path=None, target=None):
        if name not in PHASES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec

    def invalidate_caches(self):
        pass


sys.meta_path.insert(0, _Finder())
sys.argv = ["mcfl", *sys.argv[1:]]
_mark("M")              # the job starts: everything before is the probe's own set-up
import mcfl.cli  # noqa: E402

_main = mcfl.cli.main


def _marked_main(argv=None):
    try:
        return _main(argv)
    finally:
        _mark("X")      # the command is done: what follows is the interpreter's exit


mcfl.cli.main = _marked_main
# the console script's function (pyproject.toml's entry point, e.g. mcfl.cli:run), which calls main
sys.exit(getattr(mcfl.cli, os.environ.get("MCFL_PROBE_ENTRY", "main"))())
