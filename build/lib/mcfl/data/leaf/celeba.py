"""``celeba``: LEAF's FedCelebA (one client per celebrity, 2 classes: Smiling or not) from CelebA.

Inputs (LEAF downloads nothing; neither can we from Google Drive): ``img_align_celeba.zip`` (or the
extracted ``img_align_celeba/`` folder), ``list_attr_celeba.txt`` and ``identity_CelebA.txt`` from
http://mmlab.ie.cuhk.edu.hk/projects/CelebA.html, found in ``raw_dir`` or ``origin`` (a local
directory or a mirror's base URL) and checked against the MD5s torchvision records. Steps, as
LEAF's ``data/celeba/preprocess/metadata_to_json.py``, ``data/utils`` and CelebA model take them:

1. celebrities grouped from ``identity_CelebA.txt`` in order of first appearance, each with its
   images in file order; those with at least 5 images are kept;
2. label = the ``attribute`` column (``Smiling`` by default; any of the 40) of
   ``list_attr_celeba.txt``: -1 -> 0, 1 -> 1 (looked up by image name; LEAF assumes both files
   list images in the same order, which the official files do); each image's FedCG oracle domain
   (:mod:`mcfl.data.celeba_domains`, 32 domains from 5 attributes) is stored per sample;
3. LEAF's sampling / user removal (``k``, 5 in LEAF's commands) / split, one shard;
4. images ``resize((84, 84), BICUBIC)`` then ``convert('RGB')`` (the 178x218 crop is squashed);
   BICUBIC is pinned (LEAF uses Pillow's default, BICUBIC since Pillow 7). Stored uint8
   (3, 84, 84); LEAF feeds raw 0-255 values to its model (``x_scale = 1``), ``normalize: true``
   scales them to [0, 1] instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import PIL

from mcfl.data.celeba_domains import ATTRIBUTES, attribute_domains
from mcfl.data.leaf import DataSourceError
from mcfl.data.leaf.archive import Archive
from mcfl.data.leaf.fetch import expected_md5, fetch
from mcfl.data.leaf.images import celeba_pixels, write_split_store
from mcfl.data.leaf.sampling import check_options, leaf_split

log = logging.getLogger("mcfl")

RAW_FILES = {"img_align_celeba.zip": "00d2c5bc6d35e252742224ab0c1e8fcb",
             "list_attr_celeba.txt": "75e246fa4810816ffd6ee81facbd244c",
             "identity_CelebA.txt": "32bd1bd63d3c78cd57e08160ec5ed1e2"}
DRIVE_IDS = {"img_align_celeba.zip": "0B7EVK8r0v71pZjFTYXZWM3FlRnM",
             "list_attr_celeba.txt": "0B7EVK8r0v71pblRyaVFSWGxPY0U",
             "identity_CelebA.txt": "1_ee_0u7vcNLOfNLegJRHmolfH5ICW-XS"}
ALTERNATIVES = {"img_align_celeba.zip": "img_align_celeba"}    # the zip, or its extracted folder
MIN_IMAGES = 5     # metadata_to_json.py keeps celebrities with at least 5 images
#: FedCG's oracle domains (meta["domains"]): id d has attribute b of ATTRIBUTES when bit b is set
DOMAINS = {"attributes": list(ATTRIBUTES), "unseen": [],
           "names": ["+".join(a for b, a in enumerate(ATTRIBUTES) if d >> b & 1) or "none"
                     for d in range(2 ** len(ATTRIBUTES))]}
HINT = ("Get it from the CelebA page http://mmlab.ie.cuhk.edu.hk/projects/CelebA.html (Google Drive "
        "ids: " + ", ".join(f"{k} {v}" for k, v in DRIVE_IDS.items()) + ") and put it in the raw "
        "directory, or pass --source with a directory or base URL holding it.")


def read_identities(path: Path) -> dict[str, list[str]]:
    """celebrity -> images, celebrities in order of first appearance (those with >= 5 images)."""
    celebs: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2:
            celebs.setdefault(parts[1], []).append(parts[0])
    good = {c: imgs for c, imgs in celebs.items() if len(imgs) >= MIN_IMAGES}
    if not good:
        raise DataSourceError(f"{path}: no celebrity with at least {MIN_IMAGES} images")
    return good


def read_attributes(path: Path, attributes: list[str]) -> dict[str, list[int]]:
    """image -> its 0/1 value of each of ``attributes`` (line 1: count, line 2: the 40 names, then
    one row per image of -1/1 values)."""
    lines = path.read_text().splitlines()
    if len(lines) < 2:
        raise DataSourceError(f"{path}: expected a count line and a header line")
    names = lines[1].split()
    for a in attributes:
        if a not in names:
            raise DataSourceError(f"{path}: no attribute {a!r}; available: {' '.join(names)}")
    cols = [names.index(a) + 1 for a in attributes]
    out = {}
    for i, line in enumerate(lines[2:], 3):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != len(names) + 1 or any(parts[c] not in ("-1", "1") for c in cols):
            raise DataSourceError(f"{path}: line {i}: expected an image name and {len(names)} "
                                  f"values of -1 or 1")
        out[parts[0]] = [(int(parts[c]) + 1) // 2 for c in cols]
    return out


def make_celeba(out: str | Path, *, origin: str = "", md5: tuple = (),
                raw_dir: str = "data/raw/celeba", attribute: str = "Smiling",
                sampling: str = "niid", sf: float = 1.0, iu: float = 0.01, k: int = 5,
                split: str = "sample", tf: float = 0.9, seed: int = 0, split_seed: int = 0,
                normalize: bool = False, workers: int = 0) -> Path:
    check_options(sampling=sampling, sf=sf, iu=iu, k=k, split=split, tf=tf)
    sums = expected_md5(RAW_FILES, md5)
    paths = fetch(sums, origin, raw_dir, alternatives=ALTERNATIVES, hint=HINT)
    celebs = read_identities(paths["identity_CelebA.txt"])
    attrs = read_attributes(paths["list_attr_celeba.txt"], [attribute, *ATTRIBUTES])
    images = [img for imgs in celebs.values() for img in imgs]
    missing = [img for img in images if img not in attrs]
    if missing:
        raise DataSourceError(f"{paths['list_attr_celeba.txt']}: no row for {missing[0]} "
                              f"(and {len(missing) - 1} more images of identity_CelebA.txt)")
    refs = iter(range(len(images)))
    shards = {"all_data.json": [(c, [next(refs) for _ in imgs]) for c, imgs in celebs.items()]}
    clients = leaf_split(shards, sampling=sampling, sf=sf, iu=iu, k=k, tf=tf, seed=seed,
                         split_seed=split_seed)
    with Archive(paths["img_align_celeba.zip"]) as archive:
        member = {n.rsplit("/", 1)[-1]: n for n in archive.names}
        absent = [img for img in images if img not in member]
        if absent:
            raise DataSourceError(f"{archive.path}: image {absent[0]} is missing (and "
                                  f"{len(absent) - 1} more); the image set is incomplete")
        params = {"attribute": attribute, "sampling": sampling, "sf": sf,
                  **({"iu": iu} if sampling == "iid" else {}), "k": k, "split": split, "tf": tf,
                  "seed": seed, "split_seed": split_seed, "normalize": normalize,
                  "resample": "bicubic", "md5": sums, "pillow": PIL.__version__}
        log.info("celeba: %d celebrities with >= %d images, %d clients after sampling",
                 len(celebs), MIN_IMAGES, len(clients))
        table = np.array([attrs[i] for i in images], dtype=np.int64)
        return write_split_store(out, clients, archive, [member[i] for i in images], celeba_pixels,
                                 labels=table[:, 0], n_classes=2, source="celeba",
                                 params=params, x_scale=1 / 255 if normalize else 1.0,
                                 workers=workers, domains=attribute_domains(table[:, 1:]),
                                 domain_meta=DOMAINS)


make_celeba.raw_files = RAW_FILES
make_celeba.check = check_options      # config validation, before any work
make_celeba.raw_alternatives = ALTERNATIVES
make_celeba.cli_aliases = {"origin": ["--source"], "sampling": ["-s"], "k": ["-k"],
                           "split": ["-t"], "seed": ["--smplseed"], "split_seed": ["--spltseed"]}
