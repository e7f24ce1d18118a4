"""Algorithm registry: config name -> class. One short file per method; each cites its paper.

A method's module is imported when its class is first asked for (like :data:`mcfl.data.SOURCES`):
a training job imports its own method, not all 22 (``benchmarks/job_overhead.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from mcfl.algorithms.base import Algorithm

#: config name -> "module:Class" under mcfl.algorithms, in the papers' order
REGISTRY = {
    # FeSEM's Table 2 (Long et al., World Wide Web 2022)
    "NoFed": "nofed:NoFed", "FedSGD": "fedsgd:FedSGD", "FedAvg": "fedavg:FedAvg",
    "FedDist": "feddist:FedDist", "FedDWS": "feddist:FedDWS", "Robust": "robust:Robust",
    "FedCluster": "fedcluster:FedCluster", "HypoCluster": "hypocluster:HypoCluster",
    "FedDANE": "feddane:FedDANE", "FedProx": "fedprox:FedProx", "FeSEM": "fesem:FeSEM",
    "FeSEM-MA": "fesem_ma:FeSEMMA",
    # FedGSP's Table 1 (Zeng et al., DASFAA 2022)
    "FedGSP": "fedgsp:FedGSP", "NaiveGSP": "fedgsp:NaiveGSP", "NaiveGSP+ICG": "fedgsp:NaiveGSPICG",
    "FedAdagrad": "fedopt:FedAdagrad", "FedAdam": "fedopt:FedAdam", "FedYogi": "fedopt:FedYogi",
    "IDA": "ida:IDA", "FedMMD": "fedmmd:FedMMD", "FedFusion": "fedfusion:FedFusion",
    # FedCG (Caldarola et al., CVPR-W 2021)
    "FedCG": "fedcg:FedCG",
    "FL+HC": "flhc:FLHC",
    "PACFL": "pacfl:PACFL",
    "FedSoft": "fedsoft:FedSoft",
}


class _Algorithms(Mapping):
    """:data:`REGISTRY` as a mapping name -> class, importing a class's module on first access."""

    def __getitem__(self, name: str) -> type[Algorithm]:
        module, cls = REGISTRY[name].split(":")
        return getattr(importlib.import_module(f"mcfl.algorithms.{module}"), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)

    def __contains__(self, name) -> bool:
        return name in REGISTRY


ALGORITHMS: Mapping[str, type[Algorithm]] = _Algorithms()


def get(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown method {name!r}; known: {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]
