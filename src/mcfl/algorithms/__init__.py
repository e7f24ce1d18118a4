"""Algorithm registry: config name -> class. One short file per method; each cites its paper."""

from __future__ import annotations

from mcfl.algorithms.base import Algorithm
from mcfl.algorithms.fedavg import FedAvg
from mcfl.algorithms.fedcg import FedCG
from mcfl.algorithms.fedcluster import FedCluster
from mcfl.algorithms.feddane import FedDANE
from mcfl.algorithms.feddist import FedDist, FedDWS
from mcfl.algorithms.fedfusion import FedFusion
from mcfl.algorithms.fedmmd import FedMMD
from mcfl.algorithms.fedgsp import FedGSP, NaiveGSP, NaiveGSPICG
from mcfl.algorithms.fedopt import FedAdagrad, FedAdam, FedYogi
from mcfl.algorithms.fedprox import FedProx
from mcfl.algorithms.fedsgd import FedSGD
from mcfl.algorithms.fesem import FeSEM
from mcfl.algorithms.fesem_ma import FeSEMMA
from mcfl.algorithms.hypocluster import HypoCluster
from mcfl.algorithms.ida import IDA
from mcfl.algorithms.nofed import NoFed
from mcfl.algorithms.robust import Robust

ALGORITHMS: dict[str, type[Algorithm]] = {a.name: a for a in (
    # FeSEM's Table 2 (paper 000)
    NoFed, FedSGD, FedAvg, FedDist, FedDWS, Robust, FedCluster, HypoCluster, FedDANE, FedProx,
    FeSEM, FeSEMMA,
    # FedGSP's Table 1 (paper 003)
    FedGSP, NaiveGSP, NaiveGSPICG, FedAdagrad, FedAdam, FedYogi, IDA, FedMMD, FedFusion,
    # FedCG (paper 002)
    FedCG,
)}


def get(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown method {name!r}; known: {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]
