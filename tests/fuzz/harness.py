"""Running one ``mcfl`` command on a sandbox and checking what it promises: exit 0, or exit 1 with
one ``mcfl <command>: error: ...`` line naming the input at fault; no traceback; no hang; nothing
created, changed or removed outside ``--out``; an earlier output left as it was when the command
fails."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from mcfl import cli

#: seconds one in-process command may take before it counts as a hang
IN_PROCESS_LIMIT = 30
#: a subprocess's limits: seconds, and bytes of address space (a read without end hits it at once)
SUBPROCESS_LIMIT = 30
SUBPROCESS_MEMORY = 6 * 2**30


class Hang(Exception):
    """The command ran past its time limit."""


@dataclass
class Outcome:
    """What a command did: its exit code, what it printed, and a traceback if an exception escaped
    ``mcfl.cli.main`` (a bug: the console script would print it)."""
    argv: list[str]
    code: int | None
    out: str
    err: str
    escaped: str = ""
    seconds: float = 0.0

    def __str__(self) -> str:
        return (f"mcfl {' '.join(map(repr, self.argv))} -> exit {self.code} in {self.seconds:.1f} s\n"
                f"stdout: {self.out[-2000:]}\nstderr: {self.err[-2000:]}\n{self.escaped}")


def _alarm(signum, frame):
    raise Hang(f"no answer within {IN_PROCESS_LIMIT} s")


def run_in_process(argv: list[str], cwd: Path) -> Outcome:
    """``mcfl ARGV`` through :func:`mcfl.cli.main` in this process, in ``cwd``, stdout and stderr
    captured, stopped (as a failure) after :data:`IN_PROCESS_LIMIT` seconds."""
    out, err = io.StringIO(), io.StringIO()
    here, start = os.getcwd(), time.monotonic()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, IN_PROCESS_LIMIT)
    code, escaped = None, ""
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    except SystemExit as e:                      # argparse: --help, or a usage error (exit 2)
        code = e.code if isinstance(e.code, int) else 1
    except Hang:
        escaped = f"HANG: no answer within {IN_PROCESS_LIMIT} s"
    except BaseException:                        # noqa: BLE001 - any escape is what we look for
        escaped = traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(here)
    return Outcome(list(argv), code, out.getvalue(), err.getvalue(), escaped,
                   time.monotonic() - start)


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (SUBPROCESS_MEMORY, SUBPROCESS_MEMORY))


def run_subprocess(argv: list[str], cwd: Path, env: dict | None = None) -> Outcome:
    """``mcfl ARGV`` as its own process (for inputs that may block or read without end: FIFOs,
    devices), with a time and an address-space limit; a kill at the time limit counts as a hang."""
    start = time.monotonic()
    cmd = [sys.executable, "-c", "from mcfl.cli import run; run()", *argv]
    env = {**os.environ, **(env or {})}
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, errors="replace",
                           timeout=SUBPROCESS_LIMIT, preexec_fn=_limit_memory, env=env)
    except subprocess.TimeoutExpired as e:
        return Outcome(list(argv), None, _text(e.stdout), _text(e.stderr),
                       f"HANG: no answer within {SUBPROCESS_LIMIT} s", time.monotonic() - start)
    return Outcome(list(argv), p.returncode, p.stdout, p.stderr, "", time.monotonic() - start)


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


# ------------------------------------------------------------------------------------- the tree
def snapshot(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple]:
    """Every entry under ``root`` (not following symlinks) but those under ``skip``: its kind, and
    a regular file's size and sha256, a symlink's target. Special files are listed, never read."""
    skip_abs = tuple(os.path.abspath(s) for s in skip)
    seen: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            if any(path == s or path.startswith(s + os.sep) for s in skip_abs):
                continue
            seen[os.path.relpath(path, root)] = _entry(path)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return seen


def _entry(path: str) -> tuple:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir",)
    if not stat.S_ISREG(st.st_mode):
        return ("special", stat.S_IFMT(st.st_mode))
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return ("file", st.st_size, h.hexdigest())


def changes(before: dict, after: dict) -> list[str]:
    """What differs between two snapshots, one line an entry."""
    lines = [f"created {k}" for k in after.keys() - before.keys()]
    lines += [f"removed {k}" for k in before.keys() - after.keys()]
    lines += [f"changed {k}" for k in before.keys() & after.keys() if before[k] != after[k]]
    return sorted(lines)


@contextlib.contextmanager
def sandbox(world: Path):
    """A fresh copy of ``world`` (symlinks kept as links) in a new temporary folder ``box/w``; the
    folder ``box`` around it is what the checks watch, so that a path escaping ``w`` is seen."""
    box = Path(tempfile.mkdtemp(prefix="fuzz-", dir=world.parent))
    try:
        shutil.copytree(world, box / "w", symlinks=True)
        yield box / "w"
    finally:
        shutil.rmtree(box, ignore_errors=True)


# ---------------------------------------------------------------------------------- the promises
#: findings not fixed yet, each kept as an xfail test in test_found.py: an answer matching one is
#: let through here, so that the fuzz tests go on checking everything else (drop a line when its
#: test in test_found.py passes)
KNOWN_FINDINGS: dict[str, str] = {}   # pattern of an unfixed finding's message -> its test in test_found.py


def known_finding(outcome: Outcome) -> str | None:
    """The test in test_found.py of the unfixed finding ``outcome`` shows, if any."""
    text = outcome.err + outcome.escaped
    return next((test for pattern, test in KNOWN_FINDINGS.items() if re.search(pattern, text)), None)


def check(outcome: Outcome, cmd: str, names: list[str], known_ok: bool = True) -> None:
    """The command's answer keeps the promise: exit 0, or exit 1 with exactly one
    ``mcfl <cmd>: error:`` line that names one of ``names`` (the file, flag or key at fault), or
    argparse's usage error (exit 2) naming the flag; no traceback, no hang, nothing escaped
    :func:`mcfl.cli.main`. With ``known_ok``, an answer of an unfixed finding passes."""
    if known_ok and known_finding(outcome):
        return
    assert not outcome.escaped, str(outcome)
    assert "Traceback" not in outcome.err, str(outcome)
    if outcome.code == 2:                    # argparse's usage error: a flag's value of the wrong type
        last = outcome.err.strip().splitlines()[-1]
        assert last.startswith(f"mcfl {cmd}") and ": error: argument " in last, str(outcome)
        return
    assert outcome.code in (0, 1), str(outcome)
    if outcome.code == 1:
        lines = [x for x in outcome.err.splitlines() if ": error: " in x]
        assert len(lines) == 1 and lines[0].startswith(f"mcfl {cmd}: error: "), str(outcome)
        assert any(n and n in lines[0] for n in names), f"names none of {names}:\n{outcome}"
