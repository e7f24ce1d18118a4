"""Partition helpers shared by the embedded sources and the partition stage."""

from __future__ import annotations

import math
import numbers

import numpy as np


def check_alpha(alpha: float, name: str = "alpha") -> None:
    """A Dirichlet concentration is a positive finite number (NaN is neither); the error names
    ``name`` (the key or flag that gave it)."""
    if isinstance(alpha, bool) or not (isinstance(alpha, numbers.Real) and math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"{name}: {alpha!r:.40} is not allowed: a Dirichlet concentration must be "
                         f"a positive finite number (e.g. 0.5)")


def dirichlet_partition(labels: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator,
                        min_size: int = 1, max_tries: int = 1000) -> list[np.ndarray]:
    """Label-skewed split of sample indices over ``n_clients`` (Hsu et al. 2019; Wang et al. 2020).

    For every class k, proportions p_k ~ Dir_J(alpha) over the J clients decide how class k's samples
    are dealt out (FeSEM §6.1: "a non-IID partition by p_k ~ Dir_J(0.5)"). As in FedMA's reference
    code, a client that already holds more than N/J samples gets no more. The draw is repeated until
    every client has at least ``min_size`` samples, and also when a class's proportions fall wholly
    on clients that are full (a tiny ``alpha`` puts all of p_k on one client; the reference code's
    0/0 would then give NaN cut points). Proportions that are not finite or do not sum to 1 in
    float64 (``alpha`` near the largest float) are refused. Returns sorted index arrays, one per
    client.
    """
    check_alpha(alpha)
    labels = np.asarray(labels)
    n = len(labels)
    if n_clients * min_size > n:
        raise ValueError(f"cannot give {n_clients} clients {min_size} samples each from {n} samples")
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts = _deal_by_class(labels, classes, n_clients, alpha, rng)
        if parts is not None and min(len(b) for b in parts) >= min_size:
            return [np.sort(np.asarray(b, dtype=np.int64)) for b in parts]
    raise ValueError(f"Dirichlet({alpha}) partition gave a client fewer than {min_size} samples in "
                     f"{max_tries} tries; raise alpha, lower min_size or use fewer clients")


def _deal_by_class(labels, classes, n_clients: int, alpha: float, rng: np.random.Generator):
    """One try of :func:`dirichlet_partition`: each client's indices, or None when a class's
    proportions fall wholly on full clients."""
    n = len(labels)
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for k in classes:
        idx = np.flatnonzero(labels == k)
        rng.shuffle(idx)
        p = rng.dirichlet(np.full(n_clients, alpha))
        if not (np.all(np.isfinite(p)) and abs(p.sum() - 1.0) < 1e-6):
            raise ValueError(f"alpha: {alpha} is not allowed: its Dirichlet proportions are not "
                             f"defined in float64 (they sum to {p.sum():g}); use a smaller alpha")
        p = p * np.array([len(b) < n / n_clients for b in parts])
        if p.sum() == 0:
            return None
        p = p / p.sum()
        cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
        for j, chunk in enumerate(np.split(idx, cuts)):
            parts[j].extend(chunk.tolist())
    return parts


def split_train_test(n: int, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """LEAF's by-sample split (``split_data.py``): ``n_train = max(1, int((1 - test_fraction) * n))``,
    one sample each way when ``n == 2``; train indices drawn at random, both parts kept in order."""
    if n < 2:
        raise ValueError(f"a client needs at least 2 samples to split, has {n}")
    n_train = 1 if n == 2 else max(1, int((1.0 - test_fraction) * n))
    n_train = min(n_train, n - 1) if test_fraction > 0 else n
    train = np.sort(rng.choice(n, size=n_train, replace=False))
    test = np.setdiff1d(np.arange(n), train)
    return train, test


def classes_partition(labels: np.ndarray, n_clients: int, k: int, rng: np.random.Generator,
                      max_tries: int = 1000, min_size: int = 1) -> list[np.ndarray]:
    """Pathological label skew: every client holds exactly ``k`` distinct classes (McMahan et al.
    2017's 2-shards-per-client setting, without shards straddling classes). Each client draws k
    classes (redrawn until every class has a holder); each class's samples are shuffled and split
    as evenly as possible among its holders. Raises if a client ends up with fewer than
    ``min_size`` samples. Returns sorted index arrays, one per client."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if not 1 <= k <= len(classes):
        raise ValueError(f"k={k} classes per client, but the data have {len(classes)} classes")
    if n_clients * k < len(classes):
        raise ValueError(f"{n_clients} clients x {k} classes cannot cover {len(classes)} classes")
    for _ in range(max_tries):
        held = [rng.choice(classes, size=k, replace=False) for _ in range(n_clients)]
        if len(np.unique(np.concatenate(held))) == len(classes):
            break
    else:
        raise ValueError(f"could not give every class a holder in {max_tries} tries")
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for c in classes:
        holders = [i for i, h in enumerate(held) if c in h]
        idx = rng.permutation(np.flatnonzero(labels == c))
        for i, chunk in zip(holders, np.array_split(idx, len(holders))):
            parts[i].extend(chunk.tolist())
    small = [i for i, p in enumerate(parts) if len(p) < min_size]
    if small:
        raise ValueError(f"{len(small)} of {n_clients} clients got fewer than {min_size} samples "
                         f"(first: client {small[0]} with {len(parts[small[0]])}); use fewer clients "
                         f"or more classes per client")
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
