"""Find, download and verify the raw files of a LEAF source.

:func:`fetch` resolves each raw file, in this order:

1. ``raw_dir/NAME`` (a previous download, or the Snakemake download rule's output): MD5-checked;
   a mismatch is an error (the file is left alone: it may be the user's);
2. ``raw_dir/ALT`` for a zip that may also come extracted (CelebA's ``img_align_celeba/``): used as is;
3. ``origin`` a local directory: ``origin/NAME`` is MD5-checked and read in place (``copy=True``, as
   ``mcfl download`` does, copies it into ``raw_dir`` through a temporary file instead);
4. ``origin`` an http(s) base URL: ``origin/NAME`` is downloaded into ``raw_dir/NAME.part`` with a
   progress bar, resumed with an HTTP ``Range`` request after an interrupted or truncated transfer
   (also across runs), MD5-checked, then renamed to ``raw_dir/NAME``. A wrong checksum deletes the
   download and says so; HTTP errors name the URL and status.

``--md5 NAME=HEX`` overrides replace an expected checksum (a mirror, a test archive).
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable

from mcfl.data.leaf import DataSourceError
from mcfl.io import atomic_path

log = logging.getLogger("mcfl")
CHUNK = 1 << 20


def md5_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


def expected_md5(files: dict[str, str], overrides: Iterable[str] = ()) -> dict[str, str]:
    """``files`` (name -> MD5) with ``NAME=HEX`` overrides applied; unknown names are errors."""
    out = dict(files)
    for item in overrides or ():
        name, sep, hexd = str(item).partition("=")
        hexd = hexd.strip().lower()
        if not sep or name not in files:
            raise DataSourceError(f"--md5 {item!r}: expected NAME=HEX with NAME one of {sorted(files)}")
        if len(hexd) != 32 or any(c not in "0123456789abcdef" for c in hexd):
            raise DataSourceError(f"--md5 {item!r}: {hexd!r} is not a 32-digit hexadecimal MD5")
        out[name] = hexd
    return out


def is_url(origin: str) -> bool:
    return str(origin).split("://", 1)[0].lower() in ("http", "https")


def fetch(files: dict[str, str], origin: str, raw_dir: str | os.PathLike, *, copy: bool = False,
          alternatives: dict[str, str] | None = None, hint: str = "") -> dict[str, Path]:
    """Resolve every raw file (name -> expected MD5) to a local, verified path (see module doc)."""
    return {name: locate(name, md5, origin, raw_dir, copy=copy,
                         alt=(alternatives or {}).get(name), hint=hint)
            for name, md5 in files.items()}


def locate(name: str, md5: str, origin: str, raw_dir: str | os.PathLike, *, copy: bool = False,
           alt: str | None = None, hint: str = "") -> Path:
    raw_dir = Path(raw_dir)
    if (raw_dir / name).is_file():
        return verify(raw_dir / name, md5)
    if alt and (raw_dir / alt).is_dir():
        log.warning("%s: using the extracted directory; it has no checksum to verify", raw_dir / alt)
        return raw_dir / alt
    if origin and is_url(origin):
        return download(f"{str(origin).rstrip('/')}/{name}", raw_dir / name, md5)
    if origin and Path(origin).is_dir():
        src = Path(origin) / name
        if src.is_file():
            return copy_verified(src, raw_dir / name, md5) if copy else verify(src, md5)
        if alt and (Path(origin) / alt).is_dir():
            if copy:
                raise DataSourceError(f"{src}: missing; found the extracted {Path(origin) / alt}/ "
                                      f"instead: put that folder at {raw_dir / alt}/ to use it")
            log.warning("%s: using the extracted directory; it has no checksum to verify", Path(origin) / alt)
            return Path(origin) / alt
    elif origin:
        raise DataSourceError(f"source {origin!r} is neither an existing directory nor an http(s) URL")
    where = f"{raw_dir}" + (f" or {origin}" if origin else "")
    raise DataSourceError(f"{name}: not found in {where}. {hint}".strip())


def verify(path: Path, md5: str) -> Path:
    got = md5_file(path)
    if got != md5:
        raise DataSourceError(f"{path}: MD5 {got} does not match the expected {md5} (corrupt or a "
                              f"different file; replace it, or pass --md5 {path.name}={got} if it "
                              f"is a known mirror's file)")
    return path


def copy_verified(src: Path, dest: Path, md5: str) -> Path:
    with atomic_path(dest) as tmp:
        shutil.copyfile(src, tmp)
        got = md5_file(tmp)
        if got != md5:
            raise DataSourceError(f"{src}: MD5 {got} does not match the expected {md5}; nothing "
                                  f"was copied to {dest}")
    return dest


class _Interrupted(Exception):
    pass


def download(url: str, dest: Path, md5: str, *, retries: int = 5, timeout: float = 60) -> Path:
    """Download ``url`` to ``dest`` (resuming ``dest.part``), verify its MD5, rename into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    for attempt in range(retries + 1):
        try:
            _transfer(url, part, timeout)
            break
        except (_Interrupted, ConnectionError, TimeoutError, http.client.IncompleteRead) as e:
            size = part.stat().st_size if part.exists() else 0
            if attempt == retries:
                raise DataSourceError(f"{url}: transfer interrupted {retries + 1} times ({e}); "
                                      f"{size} bytes kept in {part}, run again to resume") from None
            log.warning("%s: transfer interrupted at %d bytes (%s); resuming", url, size, e)
    got = md5_file(part)
    if got != md5:
        part.unlink()
        raise DataSourceError(f"{url}: MD5 {got} does not match the expected {md5}; deleted the "
                              f"download. If this mirror serves another version on purpose, pass "
                              f"--md5 {dest.name}={got}")
    os.replace(part, dest)
    log.info("%s: downloaded and verified (MD5 %s)", dest, md5)
    return dest


def _transfer(url: str, part: Path, timeout: float) -> None:
    """One HTTP GET appending to ``part`` from its current size; raises _Interrupted if short."""
    from tqdm import tqdm

    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "mcfl", **({"Range": f"bytes={have}-"} if have else {})}
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:       # nothing left to send: the part is complete (MD5 decides)
            return
        raise DataSourceError(f"{url}: HTTP {e.code} {e.reason} (check the source URL)") from None
    except urllib.error.URLError as e:
        raise DataSourceError(f"{url}: cannot connect ({e.reason})") from None
    with resp:
        if have and resp.status != 206:   # the server ignored Range: start again
            log.warning("%s: server does not resume (HTTP %s); downloading from the start", url, resp.status)
            have = 0
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        log.info("downloading %s -> %s%s", url, part, f" (resuming at {have} bytes)" if have else "")
        with open(part, "ab" if have else "wb") as f, \
                tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                     desc=part.name[:-5], disable=None) as bar:
            while chunk := resp.read(CHUNK):
                f.write(chunk)
                bar.update(len(chunk))
    size = part.stat().st_size
    if total is not None and size < total:
        raise _Interrupted(f"received {size} of {total} bytes")
