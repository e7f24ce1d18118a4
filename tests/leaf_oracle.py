"""Test oracle: LEAF's FEMNIST and CelebA pipelines, re-stated from LEAF's documented semantics.

This is NOT LEAF's code (LEAF cannot be fetched here and is not committed); it is an independent
re-statement, step by step, of what LEAF's scripts do (LEAF's README and its scripts read
at commit 09ec454), on a different code path from ``mcfl.data.leaf``:

* it extracts the archives to disk and walks the folders with ``os.listdir`` (made deterministic
  by sorting, i.e. LEAF on a filesystem that lists names in sorted order), where mcfl reads the zips;
* every stage reads and writes JSON files in LEAF's folders (``all_data``, ``sampled_data``,
  ``rem_user_data``, ``train``/``test``) with LEAF's file names, where mcfl passes lists in memory;
* FEMNIST: ``get_file_dirs`` -> ``get_hashes`` (hex MD5 of every file) -> ``match_hashes`` (reverse
  walk, so the first by_class file wins) -> ``group_by_writer`` (with its duplicated first image) ->
  ``data_to_json`` (L, thumbnail 28x28 LANCZOS, /255 floats, 100 writers per file);
* CelebA: ``metadata_to_json`` (users in first-appearance order, >= 5 images, y = (v+1)/2 floats in
  attribute-file order, x = file names), pixels as LEAF's CelebA model loads them (``Image.open(..)
  .resize((84, 84)).convert('RGB')`` with Pillow's default filter);
* ``sample.py`` niid and iid, ``remove_users.py`` (>=), ``split_data.py`` by sample, each with its own
  ``random.Random(seed)`` shared across the files of its stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image


def ls(path) -> list[str]:
    return sorted(os.listdir(path))


def _dump(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _tag(x: float) -> str:
    return str(x)[2:]


def leaf_label(c: str) -> int:
    v = int(c, 16)
    if c.isdigit() and int(c) < 40:
        return int(c) - 30
    return v - 55 if v <= 90 else v - 61


def femnist_all_data(by_class_zip: Path, by_write_zip: Path, work: Path, per_file: int = 100) -> Path:
    raw = work / "raw_data"
    for z in (by_class_zip, by_write_zip):
        with zipfile.ZipFile(z) as f:
            f.extractall(raw)
    class_files, write_files = [], []
    for cl in ls(raw / "by_class"):
        for sub in ls(raw / "by_class" / cl):
            if "hsf" in sub and "mit" not in sub:
                class_files += [(cl, raw / "by_class" / cl / sub / img) for img in ls(raw / "by_class" / cl / sub)]
    for part in ls(raw / "by_write"):
        for writer in ls(raw / "by_write" / part):
            for kind in ls(raw / "by_write" / part / writer):
                folder = raw / "by_write" / part / writer / kind
                write_files += [(writer, folder / img) for img in ls(folder)]
    digest = lambda p: hashlib.md5(p.read_bytes()).hexdigest()  # noqa: E731
    by_hash = {}
    for c, f in reversed(class_files):
        by_hash[digest(f)] = c
    groups: list[tuple[str, list]] = []
    for w, f in write_files:
        item = (f, by_hash[digest(f)])
        if groups and groups[-1][0] == w:
            groups[-1][1].append(item)
        else:                                    # LEAF's bug: a new writer starts with 2 copies
            groups.append((w, [item] * (1 if not groups else 2)))
    out = work / "data" / "all_data"
    for i in range(0, len(groups), per_file):
        users, counts, data = [], [], {}
        for w, items in groups[i:i + per_file]:
            xs, ys = [], []
            for f, c in items:
                img = Image.open(f).convert("L")
                img.thumbnail((28, 28), Image.LANCZOS)
                xs.append((np.asarray(img).flatten() / 255).tolist())
                ys.append(leaf_label(c))
            users.append(w)
            counts.append(len(ys))
            data[w] = {"x": xs, "y": ys}
        _dump({"users": users, "num_samples": counts, "user_data": data},
              out / f"all_data_{i // per_file}.json")
    return work / "data"


def celeba_all_data(raw: Path, work: Path, attribute: str = "Smiling") -> Path:
    celebs: dict[str, list[str]] = {}
    for line in (raw / "identity_CelebA.txt").read_text().split("\n"):
        info = line.split()
        if len(info) >= 2:
            celebs.setdefault(info[1], []).append(info[0])
    celebs = {c: v for c, v in celebs.items() if len(v) >= 5}
    owner = {img: c for c, v in celebs.items() for img in v}
    lines = (raw / "list_attr_celeba.txt").read_text().split("\n")
    col = lines[1].split().index(attribute)
    ys: dict[str, list[float]] = {}
    for line in lines[2:]:
        info = line.split()
        if info and info[0] in owner:
            ys.setdefault(owner[info[0]], []).append((int(info[1:][col]) + 1) / 2)
    users = list(celebs)
    _dump({"users": users, "num_samples": [len(celebs[c]) for c in users],
           "user_data": {c: {"x": celebs[c], "y": ys[c]} for c in users}},
          work / "data" / "all_data" / "all_data.json")
    return work / "data"


def celeba_pixels(img_dir: Path, name: str) -> np.ndarray:
    return np.array(Image.open(img_dir / name).resize((84, 84)).convert("RGB"))


def sample_niid(data_dir: Path, fraction: float, seed: int) -> None:
    rng = random.Random(seed)
    for f in [f for f in ls(data_dir / "all_data") if f.endswith(".json")]:
        data = json.loads((data_dir / "all_data" / f).read_text())
        goal = int(fraction * sum(data["num_samples"]))
        users = data["users"]
        rng.shuffle(users)
        taken, counts, kept, i = 0, [], {}, 0
        while taken < goal:
            u = users[i]
            cur = data["user_data"][u]
            n = len(cur["y"])
            if taken + n > goal:
                n = goal - taken
                pick = rng.sample([j for j in range(n)], n)
                cur = {"x": [cur["x"][j] for j in pick], "y": [cur["y"][j] for j in pick]}
            kept[u] = cur
            counts.append(n)
            taken += n
            i += 1
        _dump({"users": users[:i], "num_samples": counts, "user_data": kept},
              data_dir / "sampled_data" / f"{f[:-5]}_niid_{_tag(fraction)}.json")


def sample_iid(data_dir: Path, fraction: float, users_fraction: float, seed: int) -> None:
    rng = random.Random(seed)
    made = 0
    for f in [f for f in ls(data_dir / "all_data") if f.endswith(".json")]:
        data = json.loads((data_dir / "all_data" / f).read_text())
        xs = [x for d in data["user_data"].values() for x in d["x"]]
        ys = [y for d in data["user_data"].values() for y in d["y"]]
        n_users = int(round(users_fraction * len(data["users"]))) or 1
        pick = rng.sample([i for i in range(len(ys))], int(fraction * len(ys)))
        size, big = len(pick) // n_users, len(pick) % n_users
        bounds = [0]
        for g in range(n_users):                 # LEAF's iid_divide: the short groups first
            bounds.append(bounds[-1] + size + (g >= n_users - big))
        users = [str(made + g) for g in range(n_users)]
        ud = {u: {"x": [xs[i] for i in pick[bounds[g]:bounds[g + 1]]],
                  "y": [ys[i] for i in pick[bounds[g]:bounds[g + 1]]]} for g, u in enumerate(users)}
        made += n_users
        _dump({"users": users, "num_samples": [len(ud[u]["y"]) for u in users], "user_data": ud},
              data_dir / "sampled_data" / f"{f[:-5]}_iid_{_tag(users_fraction)}_{_tag(fraction)}.json")


def remove_users(data_dir: Path, k: int) -> None:
    src = "sampled_data" if (data_dir / "sampled_data").is_dir() else "all_data"
    for f in ls(data_dir / src):
        data = json.loads((data_dir / src / f).read_text())
        keep = [i for i, n in enumerate(data["num_samples"]) if n >= k]
        users = [data["users"][i] for i in keep]
        _dump({"users": users, "num_samples": [data["num_samples"][i] for i in keep],
               "user_data": {u: data["user_data"][u] for u in users}},
              data_dir / "rem_user_data" / f"{f[:-5]}_keep_{k}.json")


def split_by_sample(data_dir: Path, frac: float, seed: int) -> None:
    rng = random.Random(seed)
    for f in ls(data_dir / "rem_user_data"):
        data = json.loads((data_dir / "rem_user_data" / f).read_text())
        out = {"train": ([], [], {}), "test": ([], [], {})}
        for u in data["users"]:
            x, y = data["user_data"][u]["x"], data["user_data"][u]["y"]
            n = len(y)
            if n < 2:                      # dropped from 'users'; LEAF leaves empty user_data entries
                out["train"][2][u] = out["test"][2][u] = {"x": [], "y": []}
                continue
            n_tr = 1 if n == 2 else max(1, int(frac * n))
            chosen = set(rng.sample([j for j in range(n)], n_tr))
            for split, pick in (("train", sorted(chosen)), ("test", [j for j in range(n) if j not in chosen])):
                users, counts, ud = out[split]
                users.append(u)
                counts.append(len(pick))
                ud[u] = {"x": [x[j] for j in pick], "y": [y[j] for j in pick]}
        for split, (users, counts, ud) in out.items():
            _dump({"users": users, "num_samples": counts, "user_data": ud},
                  data_dir / split / f"{f[:-5]}_{split}_{_tag(frac)}.json")


def leaf_preprocess(data_dir: Path, *, sf: float, k: int, tf: float, smplseed: int, spltseed: int,
                    iid: bool = False, iu: float = 0.01) -> Path:
    """``preprocess.sh -s niid|iid --sf SF [--iu IU] -k K -t sample --tf TF --smplseed S --spltseed T``."""
    if iid:
        sample_iid(data_dir, sf, iu, smplseed)
    else:
        sample_niid(data_dir, sf, smplseed)
    remove_users(data_dir, k)
    split_by_sample(data_dir, tf, spltseed)
    return data_dir


def read_split(folder: Path) -> dict[str, dict]:
    """Every *.json of a train/ or test/ folder merged: the listed users, sorted."""
    data = {}
    for f in ls(folder):
        doc = json.loads((folder / f).read_text())
        data.update({u: doc["user_data"][u] for u in doc["users"]})
    return {u: data[u] for u in sorted(data)}
