"""Reading an input file with a byte limit that holds whatever the file is.

A size checked with ``stat`` says nothing of ``/dev/zero``, ``/dev/urandom`` or a pipe (``<(yes)``):
their size is 0 and a plain ``read()`` never ends. :func:`read_limited` reads at most ``limit + 1``
bytes, so a stream longer than the limit is refused after ``limit`` bytes, and accepts only a
regular file (or, where the caller allows it, a pipe, such as a shell's process substitution);
a device, a socket, a directory or a dangling symbolic link is refused by name before it is read.
Every refusal is an :class:`InputError` (a ``ValueError``) whose message starts with the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: bytes read per ``read()`` call
_CHUNK = 1 << 20


class InputError(ValueError):
    """An input file that is not read: the message names the file and why."""


def kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (for messages)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a pipe (FIFO)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: str | os.PathLike, what: str = "file") -> None:
    """Refuse ``path`` unless it is (or a symbolic link leads to) a regular file; nothing is opened,
    so a FIFO without a writer cannot block."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        dangling = path.is_symlink()
        raise InputError(f"{path}: {'a symbolic link to a missing file' if dangling else 'no such file'}"
                         f" (expected a {what})") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: is {kind(mode)}, not a {what}")


def present(path: str | os.PathLike, what: str = "file") -> bool:
    """Whether the optional input ``path`` is there to be read: True for a regular file, False
    where nothing is; anything else (a FIFO, a device, a dangling link) is refused by
    :func:`check_regular`, not taken for absent."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return False
    check_regular(path, what)
    return True


def read_limited(path: str | os.PathLike, limit: int, *, what: str = "file",
                 pipes: bool = False) -> bytes:
    """The bytes of ``path``, at most ``limit`` of them: a longer file or stream is refused after
    reading ``limit + 1`` bytes. Only a regular file is read (with ``pipes``, a pipe too: a shell's
    ``<(...)``); anything else is refused before a byte is read. ``what`` names the kind of input
    in messages ("config file"). Raises :class:`InputError`; a missing file is a
    ``FileNotFoundError`` and other failures of ``open``/``read`` are ``OSError`` as usual."""
    path = Path(path)
    if not pipes:                       # a FIFO must not be opened: with no writer, open() blocks
        try:
            check_regular(path, what)
        except InputError:
            if not path.exists() and not path.is_symlink():
                raise FileNotFoundError(2, "No such file or directory", str(path)) from None
            raise
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not (stat.S_ISREG(st.st_mode) or (pipes and stat.S_ISFIFO(st.st_mode))):
            raise InputError(f"{path}: is {kind(st.st_mode)}, not a {what}")
        if stat.S_ISREG(st.st_mode) and st.st_size > limit:
            raise InputError(f"{path}: {st.st_size} bytes; a {what} may hold at most {limit} bytes")
        chunks, n = [], 0
        while n <= limit:
            block = f.read(min(_CHUNK, limit + 1 - n))
            if not block:
                break
            chunks.append(block)
            n += len(block)
    if n > limit:
        raise InputError(f"{path}: more than {limit} bytes; a {what} may hold at most {limit} bytes")
    return b"".join(chunks)


#: the most bytes a JSON file the package reads back may hold (a run's metrics.json, a store's
#: meta.json, a select-k result: each a few kB to a few MB)
MAX_JSON_BYTES = 1 << 28


def read_json(path: str | os.PathLike, limit: int = MAX_JSON_BYTES, *, what: str = "JSON file"):
    """A JSON file read with :func:`read_limited` (regular files only) and parsed; what is not
    JSON is an :class:`InputError` naming the file. A missing file is a ``FileNotFoundError``."""
    import json

    raw = read_limited(path, limit, what=what)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:     # JSONDecodeError, UnicodeDecodeError, ...
        raise InputError(f"{path}: not valid JSON ({' '.join(str(e).split())[:160]})") from None


def json_flag(text: str, flag: str, kind: type, items: type | None = None):
    """The JSON text of a command-line flag, a ``kind`` (list or dict; a list's entries each an
    ``items`` if given); else a one-line :class:`InputError` naming the flag."""
    import json

    names = {list: "list", dict: "object"}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InputError(f"{flag}: not JSON ({' '.join(str(e).split())[:160]})") from None
    if not isinstance(value, kind):
        raise InputError(f"{flag}: must be a JSON {names[kind]}, found {type(value).__name__} {text!r:.60}")
    bad = next((v for v in value if not isinstance(v, items)), None) if items and kind is list else None
    if bad is not None:
        raise InputError(f"{flag}: {bad!r:.40} is not allowed: each entry must be a JSON {names[items]}")
    return value
