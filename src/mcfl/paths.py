"""Paths built from names, and outputs kept apart from inputs.

Every path the package builds from a name (a dataset, a method label, a run id, a method), whether
the name came from a config, a run's JSON on the command line or a run folder's ``metrics.json``,
goes through :func:`plain_name` or :func:`child`: a name is one path component, never a way out of
the output directory. :func:`refuse_overlap` is the other rule: no command writes over (or into) one
of its own inputs, as ``git`` and DVC refuse to overwrite a source with its own output.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

#: the longest name, in UTF-8 bytes, that still leaves room for a prefix and suffix in a file
#: name (most file systems allow 255 bytes a component)
MAX_NAME_BYTES = 200


def plain_name(value: object, what: str) -> str:
    """``value`` if it is a plain name, one path component, else a one-line ValueError naming
    ``what`` (the key or flag it came from): not a string, empty, longer than
    :data:`MAX_NAME_BYTES`, holding ``/`` or ``\\``, ``..``, a NUL or another control character,
    or starting with ``.`` (a hidden file, or the directory itself)."""
    why = _not_plain(value)
    if why:
        raise ValueError(f"{what}: {value!r:.80} is not a plain name ({why})")
    return value


def _not_plain(value: object) -> str | None:
    if not isinstance(value, str):
        return f"a {type(value).__name__}, not a string"
    if not value:
        return "empty"
    if len(value.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"over {MAX_NAME_BYTES} bytes"
    if "/" in value or "\\" in value:
        return "it holds a path separator"
    if ".." in value:
        return "it holds '..'"
    if value.startswith("."):
        return "it starts with '.'"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "it holds a control character"
    return None


def child(parent: str | os.PathLike, name: object, what: str, *, prefix: str = "",
          suffix: str = "") -> Path:
    """``parent / (prefix + name + suffix)`` for a :func:`plain_name` ``name``: a path that is
    always directly inside ``parent``."""
    return Path(parent) / f"{prefix}{plain_name(name, what)}{suffix}"


def _resolved(p: str | os.PathLike) -> Path:
    return Path(os.path.abspath(Path(p).expanduser())).resolve()


def refuse_overlap(outputs: Iterable[str | os.PathLike], inputs: Iterable[str | os.PathLike],
                   flag: str = "--out") -> None:
    """A one-line ValueError if an output (a file or a directory the command replaces) is one of
    the inputs or contains one (symbolic links followed): writing it would destroy the input
    before it was read, or with it."""
    ins = [(p, _resolved(p)) for p in inputs if p is not None]
    for out in outputs:
        o = _resolved(out)
        for given, i in ins:
            if i == o or o in i.parents:
                what = "is" if i == o else "contains"
                raise ValueError(f"{flag} {out}: {what} the input {given}; write the output elsewhere")


#: free bytes below which a folder's disk counts as full (a job log's first lines need less)
FULL_BELOW = 1 << 20


def disk_full_note(folder: str | os.PathLike) -> str | None:
    """One line if the disk holding ``folder`` (or its nearest existing parent) is full, else
    None: the workflow prints it when it fails, since a job that could not write its log (exit
    status 74) leaves an empty log and nothing else would say why."""
    where = Path(os.path.abspath(folder))
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return None
    if free >= FULL_BELOW:
        return None
    return (f"{folder}: the disk is full ({free} bytes free): jobs could not write their logs "
            f"(exit status 74); free space there and run again")
