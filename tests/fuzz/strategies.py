"""Hypothesis strategies for hostile inputs: names, numbers, damaged files, and edits of the
inputs of the fuzz world (run JSONs, run folders, stores, configs, LEAF JSON folders)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from hypothesis import strategies as st

#: the token :func:`place` turns into an absolute path inside the watched folder
ABS = "<ABS>"

#: names a user, a config or another tool might give, that must never become a path outside --out
HOSTILE_NAMES = ["../x", "../../escape", "../../../../../../tmp/escape", f"{ABS}/abs", "a/b", "a\\b",
                 ".", "..", "", " ", "x\x00y", "\x00", "x\ny", "tab\there", "名前", "é" * 300,
                 "a" * 5000, "$(touch pwned)", "{dataset}", "%s%n", "-rf", "~/x", "CON", "nul.",
                 ".hidden", "x/../../y", "\udcff", "\u202eevil"]

names = st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(max_size=40))

#: numbers at and beyond every limit: non-finite, beyond float32 and float64, beyond int64
HOSTILE_NUMBERS = [math.nan, math.inf, -math.inf, 1e300, -1e300, 1.7976931348623157e308, 3.5e38,
                   1e-300, 5e-324, -0.0, 0, -1, 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30,
                   10**400, 0.5, True, False, None, "1", "nan", [], {}]

numbers = st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.floats(), st.integers(-2**70, 2**70))


def place(value, box: Path):
    """``value`` with :data:`ABS` replaced by an absolute path inside ``box`` (where a write
    would be seen), recursively through lists and dicts."""
    if isinstance(value, str):
        return value.replace(ABS, str(box))
    if isinstance(value, list):
        return [place(v, box) for v in value]
    if isinstance(value, dict):
        return {k: place(v, box) for k, v in value.items()}
    return value


def dumps(value) -> str:
    """JSON as Python writes it (NaN and Infinity included, as a careless tool would)."""
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------- file damage
#: what can happen to a file in place (the in-process ones: nothing here can block or read forever)
DAMAGE = ["truncate", "garbage", "append", "empty", "delete", "directory", "dangling-link",
          "loop-link", "not-utf8", "flip-byte"]
#: what only a subprocess may meet (a read could block or never end)
SPECIAL = ["fifo", "dev-zero", "dev-urandom"]


@st.composite
def damage(draw, kinds=DAMAGE):
    """One way of damaging a file: (kind, a fraction for the cut or the byte, junk bytes)."""
    return (draw(st.sampled_from(kinds)), draw(st.floats(0, 1)), draw(st.binary(min_size=1, max_size=64)))


def apply_damage(path: Path, how) -> None:
    """Damage ``path`` (a regular file) as ``how`` (from :func:`damage`) says."""
    kind, where, junk = how
    data = path.read_bytes() if path.is_file() else b""
    cut = int(len(data) * where)
    if kind in ("delete", "directory", "dangling-link", "loop-link", "fifo", "dev-zero", "dev-urandom"):
        path.unlink()
    if kind == "truncate":
        path.write_bytes(data[:cut])
    elif kind == "garbage":
        path.write_bytes(junk * (1 + len(data) // len(junk)))
    elif kind == "append":
        path.write_bytes(data + junk)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling-link":
        path.symlink_to(path.parent / "no-such-file")
    elif kind == "loop-link":
        path.symlink_to(path.name)
    elif kind == "not-utf8":
        path.write_bytes(data[:cut] + b"\xff\xfe\x80" + data[cut:])
    elif kind == "flip-byte" and data:
        i = min(cut, len(data) - 1)
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "dev-urandom":
        path.symlink_to("/dev/urandom")


# ------------------------------------------------------------------------------- JSON and tables
def json_paths(value, prefix=()):
    """Every (path, leaf) in a JSON value, a path being the keys and indices down to it."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from json_paths(v, (*prefix, k))
    elif isinstance(value, list) and value and len(value) <= 50:
        for i, v in enumerate(value):
            yield from json_paths(v, (*prefix, i))
    else:
        yield prefix, value


def set_path(value, path, new):
    """``value`` with the leaf at ``path`` replaced by ``new`` (a copy where it changes)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = set_path(value[head], rest, new)
    return copy


@st.composite
def json_edit(draw, value, keys_named=None):
    """``value`` with one leaf replaced by a hostile name or number (a leaf whose key is in
    ``keys_named`` by a name), or one key dropped; returns (new value, its key, the leaf's path,
    None where the key was dropped)."""
    leaves = [(p, v) for p, v in json_paths(value) if p]
    path, old = draw(st.sampled_from(leaves))
    key = str(next((k for k in reversed(path) if isinstance(k, str)), path[-1]))
    how = draw(st.sampled_from(["name", "number", "drop", "type"]))
    if how == "drop" and isinstance(path[-1], str):
        parent = _get(value, path[:-1])
        new = {k: v for k, v in parent.items() if k != path[-1]}
        return set_path(value, path[:-1], new), key, None
    if how == "name" or (keys_named and key in keys_named):
        new = draw(names)
    elif how == "type":
        new = draw(st.sampled_from([[old], {"x": old}, str(old), None]))
    else:
        new = draw(numbers)
    return set_path(value, path, new), key, path


def _get(value, path):
    for k in path:
        value = value[k]
    return value
