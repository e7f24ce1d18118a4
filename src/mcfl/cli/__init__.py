"""The ``mcfl`` console script: Snakemake's rules call its sub-commands, and so can you
(``mcfl --help`` lists them; each has its own ``--help``). :mod:`.parser` builds the options,
:mod:`.commands` does each sub-command's work; :func:`main` runs one and turns every expected fault
into one line on stderr."""

from __future__ import annotations

import logging
import os
import signal
import sys

from mcfl.cli.commands import COMMANDS, available_cores, refuse_own_inputs
from mcfl.cli.parser import build_parser

__all__ = ["COMMANDS", "available_cores", "build_parser", "error_line", "main", "run"]


def _terminate(signum, frame):
    """SIGTERM (Snakemake stopping a job, a scheduler's time limit) unwinds like Ctrl-C: temporary
    files are removed, the MLflow run is marked KILLED, and the last checkpoint stays to resume."""
    raise SystemExit(128 + signum)


def _command(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names: its first word that is not an option (``mcfl``'s own options,
    -v and -h, take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def error_line(e: BaseException) -> str:
    """An exception as one line that is never empty: an OSError as ``FILE: what happened``
    (``results/r/state.pt: no space left on device``), a MemoryError or an exception without a
    message by its kind."""
    if isinstance(e, OSError) and e.strerror and not isinstance(e, ValueError):
        what = e.strerror[:1].lower() + e.strerror[1:]
        files = [str(f) for f in (e.filename, e.filename2) if f is not None]
        text = f"{files[-1]}: {what}" if files else what
    elif isinstance(e, MemoryError):
        text = f"out of memory ({e})" if str(e) else "out of memory"
    elif isinstance(e, RecursionError):
        text = f"input nested too deeply ({e})"
    else:
        text = str(e)
    return " ".join(text.split()) or type(e).__name__


#: the commands whose result is what they print: a failed stdout fails them
PRINTED_RESULT = ("check-config", "methods")
#: the exit status when even stderr cannot be written (a full disk under ``logs/``): sysexits'
#: EX_IOERR, which Snakemake shows in its own error message ("returned non-zero exit status 74")
EX_IOERR = 74


class _Stdout:
    """``sys.stdout`` for one command: a write that fails (``mcfl train > /dev/full``, a closed
    pipe) is remembered, not raised, so the command finishes its real outputs; :func:`main` then
    reports it."""

    def __init__(self, stream):
        self.stream, self.error = stream, None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self.stream.write(text)
            except OSError as e:
                self.error = e
        return len(text)

    def flush(self) -> None:
        if self.error is None:
            try:
                self.stream.flush()
            except OSError as e:
                self.error = e

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _say(line: str) -> int:
    """Print ``line`` on stderr; 0, or :data:`EX_IOERR` if stderr cannot be written either."""
    try:
        print(line, file=sys.stderr, flush=True)
        return 0
    except OSError:
        return EX_IOERR


def main(argv: list[str] | None = None) -> int:
    # cuBLAS reads this when CUDA first uses it; set here, before anything can (see federation.configure_torch)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(commands=[_command(argv)]).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    from mcfl.errors import DivergenceError

    previous = signal.signal(signal.SIGTERM, _terminate)
    out = sys.stdout = _Stdout(sys.stdout)
    try:
        refuse_own_inputs(args)
        code = COMMANDS[args.cmd](args)
        out.flush()
        return code if out.error is None else _stdout_failed(args.cmd, out.error, code)
    except (ValueError, OSError, MemoryError, RecursionError, DivergenceError) as e:   # ConfigError, StoreError too
        return _say(f"mcfl {args.cmd}: error: {error_line(e)}") or 1
    finally:
        sys.stdout = out.stream
        signal.signal(signal.SIGTERM, previous)


def _stdout_failed(cmd: str, e: OSError, code: int) -> int:
    """A command whose stdout could not be written: for :data:`PRINTED_RESULT` commands an error;
    for the others, whose results are their files (written in full by now), a warning, exit 0."""
    what = error_line(OSError(e.errno, e.strerror or str(e), "stdout"))
    if cmd in PRINTED_RESULT:
        return _say(f"mcfl {cmd}: error: {what}") or 1
    return _say(f"mcfl {cmd}: warning: {what}: the summary was not printed; the outputs are complete") or code


def run() -> None:
    """The ``mcfl`` console script: :func:`main`, then exit without finalising the interpreter.
    Tearing down an interpreter with torch loaded (its modules, then its C++ libraries' destructors)
    takes 0.5-1 s, paid again by every job of the DAG for nothing: the job has written and closed
    its outputs by then. Python's exit handlers still run (logging, temporary files, MLflow), and
    stdout/stderr are flushed; with a non-daemon thread still alive it exits the normal way, which
    waits for it. Errors, ``--help`` and usage errors leave through the normal exit as well."""
    code = main()
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):       # a closed or broken pipe: nothing more to write
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
