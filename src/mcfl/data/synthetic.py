"""``synthetic``: LEAF's synthetic federated generator, with K clusters and the truth stored.

LEAF (Caldas et al. 2018, ``data/synthetic/``): every user k draws its own multinomial-logistic
model ``w_k = Q u_k``, with ``u_k ~ N(mu_c, 0.1^2)`` around the mean ``mu_c`` of its cluster c, and
features ``x ~ N(m_k, Sigma)``, ``Sigma = diag((i+1)^-1.2)``; labels are
``argmax(x w_k + eps)``, ``eps ~ N(0, 0.1^2)`` (the softmax over classes, after LEAF's fix 54669fd).
Sample counts are ``min(int(LogNormal(3, 2)) + 5, 1000)``. The random draws follow LEAF's order on a
legacy ``RandomState(seed)``, so ``clusters=1`` with LEAF's seed reproduces LEAF's sample counts
(1,000 users -> 107,553 samples). LEAF itself hard-codes one cluster; ``clusters`` draws each user's
cluster uniformly and stores it as the ground truth.

``variant="fedprox"`` is FedProx's Synthetic(alpha, beta) (Li et al. 2020,
``data/synthetic_1_1/generate_synthetic.py``): ``W_k, b_k ~ N(N(0, alpha), 1)``,
``x ~ N(N(N(0, beta), 1), Sigma)``, ``n_k = int(LogNormal(4, 2)) + 50``, 10 classes; no clusters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from annotated_types import Ge, Gt, Le, Lt

from mcfl.data.partition import split_train_test
from mcfl.data.store import ClientData
from mcfl.data.write import write_store


def leaf_synthetic_tasks(n_tasks: int, n_classes: int, dim: int, clusters: int, seed: int):
    """Yield (x, y, cluster) per user, drawing exactly as LEAF's ``main.py``/``data_generator.py``."""
    rs = np.random.RandomState(seed)
    counts = [min(s + 5, 1000) for s in rs.lognormal(3, 2, n_tasks).astype(int)]
    rs = np.random.RandomState(seed)                  # SyntheticDataset.__init__ re-seeds
    prob = np.full(clusters, 1.0 / clusters)
    q = rs.normal(0.0, 1.0, size=(dim + 1, n_classes, clusters))
    sigma = np.diag((np.arange(dim) + 1.0) ** -1.2)
    means = []
    for _ in range(clusters):
        loc = rs.normal(0, 1.0)
        means.append(rs.normal(loc, 1.0, size=clusters))
    for n in counts:
        c = rs.choice(range(clusters), size=None, replace=True, p=prob)
        b = rs.normal(0.0, 1.0)
        loc = rs.normal(b, 1.0, size=dim)
        x = np.ones((n, dim + 1))
        x[:, 1:] = rs.multivariate_normal(mean=loc, cov=sigma, size=n)
        u = rs.normal(means[c], 0.1, size=means[c].shape)
        w = q @ u
        logits = x @ w + rs.normal(0.0, 0.1, size=(n, n_classes))
        yield x[:, 1:], np.argmax(logits, axis=1), int(c)


def fedprox_synthetic_tasks(n_tasks: int, alpha: float, beta: float, dim: int, n_classes: int, seed: int):
    rs = np.random.RandomState(seed)
    counts = rs.lognormal(4, 2, n_tasks).astype(int) + 50
    sigma = np.diag((np.arange(dim) + 1.0) ** -1.2)
    for n in counts:
        mean_w = rs.normal(0, alpha)
        v = rs.normal(rs.normal(0, beta), 1, dim)
        w = rs.normal(mean_w, 1, (dim, n_classes))
        b = rs.normal(mean_w, 1, n_classes)
        x = rs.multivariate_normal(v, sigma, n)
        yield x, np.argmax(x @ w + b, axis=1), -1


def make_synthetic(out: str | Path, *, clients: Annotated[int, Ge(1)] = 100,
                   clusters: Annotated[int, Ge(1)] = 4, classes: Annotated[int, Ge(2)] = 5,
                   dim: Annotated[int, Ge(1)] = 60, variant: Literal["leaf", "fedprox"] = "leaf",
                   alpha: Annotated[float, Ge(0)] = 1.0, beta: Annotated[float, Ge(0)] = 1.0,
                   test_fraction: Annotated[float, Gt(0), Lt(1)] = 0.2,
                   seed: Annotated[int, Ge(0), Le(2**32 - 1)] = 931231) -> Path:
    if variant == "leaf":
        tasks = leaf_synthetic_tasks(clients, classes, dim, clusters, seed)
    elif variant == "fedprox":
        tasks = fedprox_synthetic_tasks(clients, alpha, beta, dim, classes, seed)
    else:
        raise ValueError(f"variant must be 'leaf' or 'fedprox', got {variant!r}")
    rng = np.random.default_rng(seed)
    data = []
    for i, (x, y, c) in enumerate(tasks):
        tr, te = split_train_test(len(y), test_fraction, rng)
        x = x.astype(np.float32)
        data.append(ClientData(f"u{i:05d}", x[tr], y[tr], x[te], y[te], cluster=c))
    params = dict(clients=clients, clusters=clusters if variant == "leaf" else 0, classes=classes,
                  dim=dim, variant=variant, test_fraction=test_fraction, seed=seed,
                  **({"alpha": alpha, "beta": beta} if variant == "fedprox" else {}))
    return write_store(out, data, n_classes=classes, source="synthetic", params=params)
