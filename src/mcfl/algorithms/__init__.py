"""Algorithm registry: config name -> class. One short file per method; each cites its paper."""

from __future__ import annotations

from mcfl.algorithms.base import Algorithm
from mcfl.algorithms.fedavg import FedAvg
from mcfl.algorithms.fedcg import FedCG
from mcfl.algorithms.fesem import FeSEM
from mcfl.algorithms.nofed import NoFed

ALGORITHMS: dict[str, type[Algorithm]] = {a.name: a for a in (FedAvg, NoFed, FeSEM, FedCG)}


def get(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown method {name!r}; known: {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]
