"""Read the members of a zip archive (or of an extracted directory) in place.

FEMNIST's two NIST zips hold about 1.6 million small PNGs; reading them straight from the zips is
several times faster than extracting them and needs no scratch space. Nothing is ever extracted,
but every member name is still checked as if it were: an absolute path, a drive letter or a ``..``
component would escape the target directory of an extraction, and the whole archive is refused.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

from mcfl.data.leaf import DataSourceError

_DRIVE = re.compile(r"^[A-Za-z]:")


def unsafe_member(name: str) -> bool:
    """True if extracting ``name`` would write outside the target directory."""
    n = name.replace("\\", "/")
    return n.startswith("/") or bool(_DRIVE.match(n)) or ".." in n.split("/")


class Archive:
    """Files of a zip archive or a directory: ``names`` (posix paths, as stored) and ``read(name)``."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._zip: zipfile.ZipFile | None = None
        if self.path.is_dir():
            root = self.path
            self.names = [Path(d, f).relative_to(root).as_posix()
                          for d, _, files in os.walk(root) for f in files]
            return
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError) as e:
            raise DataSourceError(f"{self.path}: not a readable zip archive ({e})") from None
        infos = self._zip.infolist()
        for info in infos:
            if unsafe_member(info.filename):
                self.close()
                raise DataSourceError(f"{self.path}: member {info.filename!r} would escape the "
                                      f"target directory (absolute path or '..'); refusing the archive")
        self.names = [i.filename for i in infos if not i.is_dir()]

    def read(self, name: str) -> bytes:
        if self._zip is not None:
            return self._zip.read(name)
        return (self.path / name).read_bytes()

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
