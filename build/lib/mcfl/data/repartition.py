"""The partition stage: deal any prepared store's samples out to clients anew, into a new store.

FeSEM §6.1 runs every benchmark under "(a) an ideal IID data distribution using randomly shuffled
data, (b) a non-IID partition by p_k ~ Dir_J(0.5)". :func:`partition_store` reads a store (embedded,
synthetic or LEAF: one format) and writes another with one of four schemes:

* ``natural``: keep the dataset's own clients (LEAF writers, celebrities, the embedded clusters).
  With ``split="keep"`` this is a copy, which the workflow skips altogether.
* ``iid``: pool every sample, shuffle, and deal ``clients`` clients; ``sizes="equal"`` gives LEAF
  ``sample.py --iid``'s sizes (differ by at most one), ``sizes="natural"`` keeps the unequal sizes of
  the dataset's own clients (drawn from them when ``clients`` differs), so only the labels become IID.
* ``dirichlet``: label skew: class k's samples are dealt by p_k ~ Dir(``alpha``) over the clients,
  every client gets at least ``min_samples`` (:func:`mcfl.data.partition.dirichlet_partition`).
* ``classes``: every client holds exactly ``classes_per_client`` classes
  (:func:`mcfl.data.partition.classes_partition`).

Train/test: ``split="redo"`` pools a client's samples and splits them with LEAF's by-sample rule at
``test_fraction`` (the paper: 80 % / 20 % per device); ``split="keep"`` keeps every sample's own role
(a client then gets the training samples and the test samples that were dealt to it). The default
``split=None`` keeps for ``natural`` and redoes for the other schemes.

True clusters: kept by ``natural`` (the clients are the same), set unknown (-1) by the schemes that
pool samples across clients, since a new client mixes samples of several old ones.

Everything is drawn from one ``numpy`` generator seeded by ``seed``, so the same source store and
parameters give the same store, bit for bit. The new ``meta.json`` keeps the source's ``source`` and
``params`` and adds ``partition`` (the scheme's parameters and the source store's content hash).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np

from mcfl.data.partition import classes_partition, dirichlet_partition, split_train_test
from mcfl.data.store import FORMAT, load
from mcfl.data.write import write_arrays

SCHEMES = ("natural", "iid", "dirichlet", "classes")
#: which parameters matter for which scheme (the rest are ignored and left out of labels and meta)
RELEVANT = {
    "natural": ("split", "test_fraction", "seed"),
    "iid": ("clients", "sizes", "min_samples", "split", "test_fraction", "seed"),
    "dirichlet": ("clients", "alpha", "min_samples", "split", "test_fraction", "seed"),
    "classes": ("clients", "classes_per_client", "min_samples", "split", "test_fraction", "seed"),
}


def resolve(block: dict[str, Any] | None) -> dict[str, Any]:
    """The parameters that matter for ``block``'s scheme, defaults filled and ``split`` resolved."""
    b = {**DEFAULTS, **(block or {})}
    unknown = sorted(set(b) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown partition parameter(s) {unknown}; allowed: {sorted(DEFAULTS)}")
    if b["scheme"] not in SCHEMES:
        raise ValueError(f"partition scheme must be one of {list(SCHEMES)}, got {b['scheme']!r}")
    if b["split"] is None:
        b["split"] = "keep" if b["scheme"] == "natural" else "redo"
    if b["split"] not in ("keep", "redo"):
        raise ValueError(f"partition split must be 'keep' or 'redo', got {b['split']!r}")
    if b["sizes"] not in ("equal", "natural"):
        raise ValueError(f"partition sizes must be 'equal' or 'natural', got {b['sizes']!r}")
    out = {"scheme": b["scheme"], **{k: b[k] for k in RELEVANT[b["scheme"]]}}
    if out["split"] == "keep":
        out.pop("test_fraction")
    return out


def is_identity(block: dict[str, Any] | None) -> bool:
    """True when ``block`` leaves the store as it is (natural clients, own split): no stage needed."""
    r = resolve(block)
    return r["scheme"] == "natural" and r["split"] == "keep"


def label(block: dict[str, Any] | None) -> str:
    """Short name of a partition for tables: natural, iid, iid-sizes, dir(0.5), classes(2);
    ``+resplit`` when a natural partition's train/test split is redone."""
    r = resolve(block)
    if r["scheme"] == "natural":
        return "natural" + ("+resplit" if r["split"] == "redo" else "")
    if r["scheme"] == "iid":
        return "iid" if r["sizes"] == "equal" else "iid-sizes"
    if r["scheme"] == "dirichlet":
        return f"dir({r['alpha']:g})"
    return f"classes({r['classes_per_client']})"


# ------------------------------------------------------------------------------------------ dealing
def _sizes_natural(own: np.ndarray, m: int, n: int, rng: np.random.Generator, min_samples: int):
    """m client sizes summing to n, shaped like the dataset's own client sizes ``own``."""
    shape = rng.permutation(own) if m == len(own) else rng.choice(own, size=m, replace=True)
    exact = shape / shape.sum() * n
    sizes = np.floor(exact).astype(np.int64)
    sizes[np.argsort(sizes - exact)[: n - sizes.sum()]] += 1          # largest remainders
    if sizes.min() < min_samples:
        raise ValueError(f"iid with natural sizes gives a client {sizes.min()} samples, fewer than "
                         f"min_samples={min_samples}; use sizes: equal or fewer clients")
    return sizes


def _deal(r: dict, labels: np.ndarray, own_sizes: np.ndarray, rng: np.random.Generator):
    """Indices into the pooled samples, one sorted array per new client."""
    n, m = len(labels), int(r["clients"] or len(own_sizes))
    if r["scheme"] == "iid":
        if m * r["min_samples"] > n:
            raise ValueError(f"cannot give {m} clients {r['min_samples']} samples each from {n}")
        perm = rng.permutation(n)
        if r["sizes"] == "equal":
            parts = np.array_split(perm, m)
        else:
            parts = np.split(perm, np.cumsum(_sizes_natural(own_sizes, m, n, rng, r["min_samples"]))[:-1])
        return [np.sort(p) for p in parts]
    if r["scheme"] == "dirichlet":
        return dirichlet_partition(labels, m, float(r["alpha"]), rng, min_size=int(r["min_samples"]))
    parts = classes_partition(labels, m, int(r["classes_per_client"]), rng)
    small = [i for i, p in enumerate(parts) if len(p) < r["min_samples"]]
    if small:
        raise ValueError(f"classes partition gives client {small[0]} only {len(parts[small[0]])} samples "
                         f"(< min_samples={r['min_samples']}); use fewer clients or more classes per client")
    return parts


# ------------------------------------------------------------------------------------------- public
def partition_store(src: str | Path, out: str | Path, *, scheme: str = "natural",
                    clients: int | None = None, alpha: float = 0.5, classes_per_client: int = 2,
                    min_samples: int = 5, sizes: str = "equal", split: str | None = None,
                    test_fraction: float = 0.2, seed: int = 0) -> Path:
    """Read the store ``src``, re-partition it (see the module docstring), write the store ``out``."""
    r = resolve(dict(scheme=scheme, clients=clients, alpha=alpha, classes_per_client=classes_per_client,
                     min_samples=min_samples, sizes=sizes, split=split, test_fraction=test_fraction,
                     seed=seed))
    if r["scheme"] == "natural" and clients is not None:
        raise ValueError("partition scheme 'natural' keeps the dataset's clients; do not set clients")
    if r.get("clients") is not None and int(r["clients"]) < 1:
        raise ValueError(f"clients must be at least 1, got {r['clients']}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    d = load(src)
    rng = np.random.default_rng(seed)
    n_tr = int(d.meta["n_train"])
    y = np.concatenate([np.asarray(d.y_train), np.asarray(d.y_test)])     # pooled: train rows first
    own = [np.concatenate([np.arange(d.offsets_train[i], d.offsets_train[i + 1]),
                           n_tr + np.arange(d.offsets_test[i], d.offsets_test[i + 1])])
           for i in range(d.n_clients)]
    if r["scheme"] == "natural":
        parts, ids, cluster = own, list(d.client_ids), np.asarray(d.cluster, dtype=np.int64)
    else:
        parts = _deal(r, y, np.array([len(p) for p in own]), rng)
        ids = [f"p{i:05d}" for i in range(len(parts))]
        cluster = np.full(len(parts), -1, dtype=np.int64)
    train, test = [], []
    for i, idx in enumerate(parts):
        if r["split"] == "redo":
            if len(idx) < 2:
                raise ValueError(f"{out}: client {ids[i]} has {len(idx)} sample; a redone split needs 2")
            tr, te = split_train_test(len(idx), r["test_fraction"], rng)
            tr, te = idx[tr], idx[te]
        else:
            tr, te = idx[idx < n_tr], idx[idx >= n_tr]
        train.append(tr)
        test.append(te)
        if not len(train[-1]):
            raise ValueError(f"{out}: client {ids[i]} got no training sample with split 'keep'; "
                             f"use split: redo or raise min_samples")
    x = np.concatenate([np.asarray(d.x_train), np.asarray(d.x_test)])
    tr_idx, te_idx = np.concatenate(train), np.concatenate(test)
    arrays = {
        "x_train": x[tr_idx], "y_train": y[tr_idx],
        "offsets_train": np.concatenate([[0], np.cumsum([len(t) for t in train])]).astype(np.int64),
        "x_test": x[te_idx], "y_test": y[te_idx],
        "offsets_test": np.concatenate([[0], np.cumsum([len(t) for t in test])]).astype(np.int64),
        "cluster": cluster,
    }
    meta = {k: d.meta[k] for k in ("source", "params", "n_classes", "x_shape", "x_dtype", "x_scale")}
    meta.update(format=FORMAT, n_clients=len(parts), n_train=len(tr_idx), n_test=len(te_idx),
                client_ids=ids, partition={**r, "label": label(r), "parent": d.content_hash})
    return write_arrays(out, arrays, meta)


#: the parameters' defaults: those of :func:`partition_store` (the one place they are written)
DEFAULTS = {k: p.default for k, p in inspect.signature(partition_store).parameters.items()
            if p.kind == p.KEYWORD_ONLY}
