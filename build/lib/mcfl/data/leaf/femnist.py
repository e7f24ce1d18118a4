"""``femnist``: LEAF's FEMNIST (62 classes, one client per writer) from NIST Special Database 19.

Steps, as LEAF's ``data/femnist/preprocess`` and ``data/utils`` scripts take them:

1. ``by_class.zip`` and ``by_write.zip`` (NIST SD19, 2nd edition) are found or downloaded and
   MD5-checked (:mod:`~mcfl.data.leaf.fetch`), then read in place (no extraction).
2. ``by_class/<hex>/<dir>/<image>.png`` with ``hsf`` and not ``mit`` in ``<dir>`` (so the duplicate
   ``train_<hex>`` folders and the ``*.mit`` files are ignored): the MD5 of every image's bytes maps
   to its class; on a duplicate hash the first image in path order wins (LEAF: the first in
   ``os.listdir`` order). Hex classes 30-39, 41-5a, 61-7a become labels 0-9, 10-35, 36-61.
3. ``by_write/<hsf_n>/<writer>/<type>/<image>.png`` in path order, consecutive images of one writer
   grouped: one client per writer (id = the writer folder, e.g. ``f0000_14``), labelled through the
   by_class image with the same MD5 (an image without one is an error, as in LEAF).
4. ``leaf_compat``: LEAF's ``group_by_writer.py`` puts the first image of every writer but the
   first twice (LEAF issue TalwalkarLab/leaf#49). Off by default. LEAF's full FEMNIST (``-s niid --sf 1.0 -k 0
   -t sample``) has 3,597 writers and 817,851 images with the bug (``leaf_compat: true``; users get
   this from LEAF, TalwalkarLab/leaf#49) and 814,255 without it (3,596 fewer: the EMNIST ByClass
   total). LEAF's site quotes an older 3,550 writers / 805,263 images.
5. Writers go into LEAF's 100-writer shards ``all_data_<i>.json`` and through LEAF's sampling,
   user removal and train/test split (:mod:`~mcfl.data.leaf.sampling`, ``seed`` = ``--smplseed``,
   ``split_seed`` = ``--spltseed``), in a fixed order instead of LEAF's filesystem order.
6. The selected images are decoded in ``workers`` processes (0: one per core, at most 8): grayscale,
   ``thumbnail((28, 28), LANCZOS)`` of the 128x128 scan, stored uint8 with ``x_scale = 1/255``, so
   inputs are LEAF's values in [0, 1], with no inversion (ink ~0 on a background ~1).

``raw_dir`` holds downloads (and is looked at first); ``origin`` is a base URL or a local directory
holding the two zips (read in place).
"""

from __future__ import annotations

import hashlib
import logging
import sys
from pathlib import Path

import numpy as np
import PIL

from mcfl.data.leaf import DataSourceError
from mcfl.data.leaf.archive import Archive
from mcfl.data.leaf.fetch import expected_md5, fetch
from mcfl.data.leaf.images import femnist_pixels, write_split_store
from mcfl.data.leaf.sampling import Shard, check_options, leaf_split

log = logging.getLogger("mcfl")

NIST_URL = "https://s3.amazonaws.com/nist-srd/SD19"
RAW_FILES = {"by_class.zip": "79572b1694a8506f2b722c7be54130c4",
             "by_write.zip": "a29f21babf83db0bb28a2f77b2b456cb"}
WRITERS_PER_SHARD = 100      # LEAF's MAX_WRITERS per all_data_<i>.json
HINT = (f"Get it from NIST Special Database 19 ({NIST_URL}/), or pass --source with a mirror's "
        f"base URL or a directory holding by_class.zip and by_write.zip.")


def class_label(hexcode: str) -> int:
    """NIST's hex class folder -> LEAF's label: '30'-'39' -> 0-9, '41'-'5a' -> 10-35, '61'-'7a' -> 36-61."""
    try:
        v = int(hexcode, 16)
    except ValueError:
        v = -1
    for lo, hi, base in ((0x30, 0x39, 0), (0x41, 0x5A, 10), (0x61, 0x7A, 36)):
        if lo <= v <= hi:
            return v - lo + base
    raise DataSourceError(f"by_class folder {hexcode!r} is not the hex code of a digit or letter")


def _members(names: list[str], top: str, depth: int, field) -> list[tuple[str, object]]:
    """``(name, field(parts below top))`` of the PNGs exactly ``depth`` levels below ``top`` for
    which ``field`` is not None, in the order of nested sorted directory listings."""
    keyed = []
    for name in names:
        parts = name.split("/")
        if top not in parts or not name.lower().endswith(".png"):
            continue
        rest = parts[parts.index(top) + 1:]
        if len(rest) == depth and (value := field(rest)) is not None:
            keyed.append((name.replace("/", "\x00"), name, value))   # '/' sorts before any character
    keyed.sort(key=lambda t: t[0])
    return [(name, value) for _, name, value in keyed]


def class_by_hash(archive: Archive) -> dict[bytes, int]:
    """MD5 digest of each by_class image -> label; the first image in path order wins."""
    label_of: dict[str, int] = {}

    def label(rest):                   # by_class/<hex>/<hsf_n, not train_xx or *.mit>/<image>
        hexcode, sub, _ = rest
        if "hsf" not in sub or "mit" in sub:
            return None
        if hexcode not in label_of:
            label_of[hexcode] = class_label(hexcode)
        return label_of[hexcode]

    members = _members(archive.names, "by_class", 3, label)
    if not members:
        raise DataSourceError(f"{archive.path}: no by_class/<hex>/hsf_*/<image>.png members")
    classes: dict[bytes, int] = {}
    for name, lab in members:
        classes.setdefault(hashlib.md5(archive.read(name)).digest(), lab)
    log.info("%s: hashed %d images of %d classes", archive.path, len(members), len(label_of))
    return classes


def writer_images(archive: Archive) -> tuple[list[str], list[tuple[str, list[int]]]]:
    """by_write image names in path order and the writers as ``(writer, [indices into names])``,
    grouping consecutive images of one writer as LEAF's ``group_by_writer.py`` does."""
    members = _members(archive.names, "by_write", 4, lambda rest: sys.intern(rest[1]))
    if not members:
        raise DataSourceError(f"{archive.path}: no by_write/<hsf>/<writer>/<type>/<image>.png members")
    writers: list[tuple[str, list[int]]] = []
    for i, (_, writer) in enumerate(members):
        if not writers or writers[-1][0] != writer:
            writers.append((writer, []))
        writers[-1][1].append(i)
    return [name for name, _ in members], writers


def writer_shards(writers: list[tuple[str, list[int]]], leaf_compat: bool) -> dict[str, Shard]:
    """LEAF's ``all_data_<i>.json`` shards of 100 writers (with LEAF's duplicated first image of
    every writer but the first when ``leaf_compat``)."""
    seen: set[str] = set()
    for w, _ in writers:
        if w in seen:
            raise DataSourceError(f"by_write.zip: writer {w!r} appears in two places")
        seen.add(w)
    users = [(w, ([refs[0]] + refs) if leaf_compat and i else list(refs))
             for i, (w, refs) in enumerate(writers)]
    return {f"all_data_{j // WRITERS_PER_SHARD}.json": users[j:j + WRITERS_PER_SHARD]
            for j in range(0, len(users), WRITERS_PER_SHARD)}


def make_femnist(out: str | Path, *, origin: str = NIST_URL, md5: tuple = (),
                 raw_dir: str = "data/raw/femnist", sampling: str = "niid", sf: float = 1.0,
                 iu: float = 0.01, k: int = 0, split: str = "sample", tf: float = 0.9,
                 seed: int = 0, split_seed: int = 0, leaf_compat: bool = False,
                 workers: int = 0) -> Path:
    check_options(sampling=sampling, sf=sf, iu=iu, k=k, split=split, tf=tf)
    sums = expected_md5(RAW_FILES, md5)
    paths = fetch(sums, origin, raw_dir, hint=HINT)
    with Archive(paths["by_class.zip"]) as by_class:
        classes = class_by_hash(by_class)
    with Archive(paths["by_write.zip"]) as by_write:
        names, writers = writer_images(by_write)
        log.info("%s: %d images by %d writers", by_write.path, len(names), len(writers))
        clients = leaf_split(writer_shards(writers, leaf_compat), sampling=sampling, sf=sf, iu=iu,
                             k=k, tf=tf, seed=seed, split_seed=split_seed)
        label = np.full(len(names), -1, dtype=np.int16)       # filled as members are read

        def remember(ref: int, blob: bytes) -> None:
            label[ref] = classes.get(hashlib.md5(blob).digest(), -1)

        def labels(refs):
            missing = [names[r] for r in refs if label[r] < 0]
            if missing:
                raise DataSourceError(f"{by_write.path}: {missing[0]} (and {len(missing) - 1} more) "
                                      f"has no image with the same content in by_class.zip, so it "
                                      f"has no label (LEAF's match_hashes.py fails on it too)")
            return label[refs]

        params = {"sampling": sampling, "sf": sf, **({"iu": iu} if sampling == "iid" else {}),
                  "k": k, "split": split, "tf": tf, "seed": seed, "split_seed": split_seed,
                  "leaf_compat": leaf_compat, "md5": sums, "pillow": PIL.__version__}
        return write_split_store(out, clients, by_write, names, femnist_pixels, labels=labels,
                                 n_classes=62, source="femnist", params=params, x_scale=1 / 255,
                                 workers=workers, on_blob=remember)


make_femnist.raw_files = RAW_FILES
make_femnist.check = check_options      # config validation, before any work
make_femnist.cli_aliases = {"origin": ["--source"], "sampling": ["-s"], "k": ["-k"],
                            "split": ["-t"], "seed": ["--smplseed"], "split_seed": ["--spltseed"]}
