"""``digits``: scikit-learn's bundled handwritten digits as a federated benchmark with known clusters.

1,797 images of 8x8 pixels (values 0-16), no download. Samples are dealt to ``clients`` clients with
label skew by Dirichlet(``alpha``) (FeSEM §6.1's non-IID setting), or with ``partition="classes"``
``classes_per_client`` label shards each (at most that many classes per client, McMahan et al.). Each client belongs to one of
``clusters`` ground-truth clusters (at most 4), and all of its images are rotated by 90 degrees times
its cluster id: 0/90/180/270, as in IFCA's rotated-MNIST benchmark (Ghosh et al. 2020). Rotations by
multiples of 90 degrees are exact on the pixel grid. Clusters are dealt out evenly and shuffled. Each
client's samples are split train/test with LEAF's by-sample rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from annotated_types import Ge, Gt, Interval, Lt

from mcfl.data.partition import classes_partition, dirichlet_partition, split_train_test
from mcfl.data.store import ClientData
from mcfl.data.write import write_store


def make_digits(out: str | Path, *, clients: Annotated[int, Ge(1)] = 100,
                clusters: Annotated[int, Interval(ge=1, le=4)] = 4, alpha: Annotated[float, Gt(0)] = 0.5,
                test_fraction: Annotated[float, Gt(0), Lt(1)] = 0.2, min_samples: Annotated[int, Ge(2)] = 5,
                partition: Literal["dirichlet", "classes"] = "dirichlet",
                classes_per_client: Annotated[int, Interval(ge=1, le=10)] = 2,
                seed: Annotated[int, Ge(0)] = 0) -> Path:
    from sklearn.datasets import load_digits

    if not 1 <= clusters <= 4:
        raise ValueError(f"clusters must be 1-4 (rotations by 0/90/180/270 degrees), got {clusters}")
    bunch = load_digits()
    x = bunch.images.astype(np.uint8)[:, None, :, :]          # (1797, 1, 8, 8), values 0..16
    y = bunch.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    if partition == "dirichlet":
        parts = dirichlet_partition(y, clients, alpha, rng, min_size=min_samples)
    elif partition == "classes":
        parts = classes_partition(y, clients, classes_per_client, rng, min_size=2)
    else:
        raise ValueError(f"partition must be 'dirichlet' or 'classes', got {partition!r}")
    true = rng.permutation(np.arange(clients) % clusters)
    data = []
    for i, idx in enumerate(parts):
        xi = np.rot90(x[idx], k=int(true[i]), axes=(2, 3)).copy()
        tr, te = split_train_test(len(idx), test_fraction, rng)
        data.append(ClientData(f"c{i:04d}", xi[tr], y[idx][tr], xi[te], y[idx][te], cluster=int(true[i])))
    params = dict(clients=clients, clusters=clusters, test_fraction=test_fraction, partition=partition,
                  seed=seed, **({"alpha": alpha, "min_samples": min_samples} if partition == "dirichlet"
                                else {"classes_per_client": classes_per_client}))
    return write_store(out, data, n_classes=10, source="digits", params=params, x_scale=1 / 16)
