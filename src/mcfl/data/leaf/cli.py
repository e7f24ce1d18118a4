"""The LEAF subcommands of ``mcfl`` (added to its parser by :mod:`mcfl.cli`)::

    mcfl download femnist --out data/raw/femnist [--source URL_OR_DIR] [--md5 NAME=HEX] [--file NAME]
    mcfl import-leaf DIR --out STORE [--images IMG_DIR_OR_ZIP] [--n-classes N]
    mcfl export-leaf STORE --out DIR
"""

from __future__ import annotations

import inspect
from pathlib import Path

from mcfl.data import SOURCES, load, prepare, source_fn
from mcfl.data.leaf.fetch import expected_md5, fetch
from mcfl.data.leaf.leafjson import export_leaf


def leaf_sources() -> dict:
    """Source name -> function, for the sources that have raw files to download."""
    return {n: source_fn(n) for n in SOURCES if hasattr(source_fn(n), "raw_files")}


DOWNLOAD_HELP = "download and verify a LEAF source's raw files"


def add_parsers(sub, download: bool = True) -> None:
    """Add the sub-commands; with ``download=False`` that one is added by the caller (its choices
    import every LEAF source)."""
    if download:
        p = sub.add_parser("download", help=DOWNLOAD_HELP)
        _download_options(p)
    p = sub.add_parser("import-leaf", help="read LEAF train/ and test/ JSON into a store (the "
                       "leaf_json source: same as mcfl prepare leaf_json --dir DIR)")
    p.add_argument("dir", help="LEAF data directory holding train/ and test/")
    p.add_argument("--out", required=True, help="store directory to write")
    p.add_argument("--images", help="img_align_celeba folder or zip, when x holds CelebA file names")
    p.add_argument("--n-classes", type=int, help="number of classes (default: largest label + 1)")
    p = sub.add_parser("export-leaf", help="write a store as LEAF JSON (all_data/, train/, test/)")
    p.add_argument("store", help="prepared store to read")
    p.add_argument("--out", required=True, help="directory to write")


def _download_options(p) -> None:
    p.add_argument("source", choices=sorted(leaf_sources()), help="the dataset whose raw files to fetch")
    p.add_argument("--out", required=True, help="raw directory (e.g. data/raw/femnist)")
    p.add_argument("--source", "--origin", dest="origin", default=None,
                   help="base URL or local directory holding the files (default: the source's)")
    p.add_argument("--md5", action="append", default=[], help="NAME=HEX: expected MD5 of NAME (repeatable)")
    p.add_argument("--file", action="append", default=None, help="only this file (repeatable)")


def _cmd_download(a) -> int:
    fn = leaf_sources()[a.source]
    if Path(a.out).exists() and not Path(a.out).is_dir():
        raise ValueError(f"--out {a.out}: exists and is not a directory (the raw files go in it)")
    params = inspect.signature(fn).parameters
    origin = a.origin if a.origin is not None else params["origin"].default
    sums = expected_md5(fn.raw_files, a.md5)
    unknown = sorted(set(a.file or ()) - set(sums))
    if unknown:
        raise ValueError(f"--file {unknown[0]}: not a raw file of {a.source}; known: {sorted(sums)}")
    files = {n: m for n, m in sums.items() if not a.file or n in a.file}
    hint = getattr(inspect.getmodule(fn), "HINT", "")
    for name, path in fetch(files, origin, a.out, copy=True, hint=hint).items():
        print(f"{path}: OK (MD5 {files[name]})")
    return 0


def _cmd_import_leaf(a) -> int:
    params = {k: v for k, v in (("images", a.images), ("n_classes", a.n_classes)) if v is not None}
    d = load(prepare("leaf_json", a.out, dir=a.dir, **params))
    print(f"{a.out}: {d.n_clients} clients, {d.meta['n_train']} train / {d.meta['n_test']} test "
          f"samples, {d.n_classes} classes, x {d.x_shape} {d.meta['x_dtype']}")
    return 0


def _cmd_export_leaf(a) -> int:
    print(f"{export_leaf(a.store, a.out)}: LEAF JSON written (all_data/, train/, test/)")
    return 0


COMMANDS = {"download": _cmd_download, "import-leaf": _cmd_import_leaf, "export-leaf": _cmd_export_leaf}
