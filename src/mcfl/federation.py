"""The simulated federation an algorithm runs in: data on the device, the model, the local-update
engine, the seeded initial weights and the client stream.

Seeds. A run's ``seed`` is split by purpose with :func:`mcfl.engine.derive_seed`:

* the client stream: round r's participants are drawn from ``(seed, STREAM, r)`` only, so every
  algorithm run with one (dataset, seed) sees exactly the same clients in every round, and
  lengthening a run keeps the earlier rounds' draws (with ``clients_per_cluster``, the draw also
  depends on the clusters the round starts from: the same stream, split by cluster);
* the initial model: ``(seed, MODEL)``, the same starting weights for every algorithm;
* local SGD: ``(seed, round, client, purpose)`` (see :mod:`mcfl.engine`);
* server-side randomness of an algorithm: :meth:`Federation.rng` ``(seed, SERVER, round, purpose)``.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from mcfl import models
from mcfl.data.store import FederatedData
from mcfl.engine import DeviceData, FlatModel, LocalSpec, LocalTrainer
from mcfl.streams import MODEL, SERVER, STREAM, derive_seed
from mcfl.executors import make_trainer, same_executor
from mcfl.trainspec import TrainSpec

log = logging.getLogger(__name__)



def round_clients(n_clients: int, per_round: int | None, seed: int, rnd: int) -> np.ndarray:
    """Round ``rnd``'s sorted client indices; they depend only on (seed, rnd, n_clients, k), so a
    round's clients are drawn when it starts (memory does not grow with the number of rounds)."""
    k = n_clients if per_round is None else min(int(per_round), n_clients)
    rng = np.random.default_rng(derive_seed(seed, STREAM, rnd))
    return np.sort(rng.choice(n_clients, size=k, replace=False)).astype(np.int64)


def cluster_clients(assign, per_cluster: int, seed: int, rnd: int) -> np.ndarray:
    """Round ``rnd``'s sorted client indices under per-cluster sampling (``clients_per_cluster``):
    from each non-empty cluster of ``assign`` (cluster id per client), in increasing cluster id,
    ``min(per_cluster, members)`` of its members drawn without replacement. A cluster with fewer
    members than ``per_cluster`` trains all of them; an empty cluster trains none. The draws come from
    the same (seed, STREAM, rnd) stream as :func:`round_clients`, so with one cluster holding every
    client they are exactly :func:`round_clients`' clients."""
    assign = np.asarray(assign)
    rng = np.random.default_rng(derive_seed(seed, STREAM, rnd))
    picked = [rng.choice(np.flatnonzero(assign == k), size=min(int(per_cluster), int((assign == k).sum())),
                         replace=False) for k in np.unique(assign)]
    return np.sort(np.concatenate(picked)).astype(np.int64)


def client_stream(n_clients: int, per_round: int | None, seed: int, rounds: int) -> np.ndarray:
    """(rounds, k): :func:`round_clients` of rounds 1..rounds."""
    k = n_clients if per_round is None else min(int(per_round), n_clients)
    rows = [round_clients(n_clients, per_round, seed, r) for r in range(1, rounds + 1)]
    return np.stack(rows) if rows else np.zeros((0, k), dtype=np.int64)


@dataclass
class Federation:
    data: FederatedData
    dev: DeviceData
    model: FlatModel
    trainer: LocalTrainer
    seed: int
    w0: torch.Tensor
    per_round: int | None
    inputs: dict[str, Path] = field(default_factory=dict)
    per_cluster: int | None = None           # clients_per_cluster: per-cluster sampling (clustered methods)

    @property
    def n_clients(self) -> int:
        return self.data.n_clients

    @property
    def n_train(self) -> np.ndarray:
        return self.dev.n_train

    @property
    def device(self) -> torch.device:
        return self.dev.device

    def with_network(self, module: torch.nn.Module) -> Federation:
        """This federation training ``module`` instead of its model (a method's network wrapping the
        run's one): same data, device, seed and executor; ``w0`` is ``module``'s current weights."""
        flat = FlatModel(module, self.device)
        return replace(self, model=flat, trainer=same_executor(self.trainer, flat, self.dev), w0=flat.get())

    def clients(self, rnd: int, assign: np.ndarray | None = None) -> np.ndarray:
        """Round ``rnd``'s clients: ``per_round`` of all clients (:func:`round_clients`) or, with
        ``per_cluster`` set, that many from each cluster of ``assign``, the clustering the round
        starts from (:func:`cluster_clients`)."""
        if self.per_cluster is None:
            return round_clients(self.n_clients, self.per_round, self.seed, rnd)
        if assign is None:
            raise ValueError("train.clients_per_cluster samples from each cluster: it needs a clustered "
                             "method's assignments")
        return cluster_clients(assign, self.per_cluster, self.seed, rnd)

    def rng(self, rnd: int, purpose: int = 0) -> np.random.Generator:
        return np.random.default_rng(derive_seed(self.seed, SERVER, rnd, purpose))


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device!r}: CUDA is not available")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"--device {device!r}: not a device ({e})") from None


def build_model(model_cfg: dict, data: FederatedData) -> torch.nn.Module:
    kwargs = {k: v for k, v in model_cfg.items() if k != "name"}
    return models.build(model_cfg["name"], data.x_shape, data.n_classes, **kwargs)


def build_federation(data: FederatedData, model_cfg: dict, train_cfg: dict | TrainSpec, seed: int,
                     device: str | torch.device = "cpu", inputs: dict | None = None) -> Federation:
    """Everything an algorithm needs, from a store and the run's model/train settings."""
    device = torch.device(device)
    module = build_model(model_cfg, data)
    models.init_weights(module, derive_seed(seed, MODEL))
    flat = FlatModel(module, device)
    dev = DeviceData(data, device)
    t = TrainSpec.of(train_cfg)
    trainer = make_trainer(t.executor, flat, dev, LocalSpec.of(t), seed, chunk=t.executor_chunk)
    return Federation(data, dev, flat, trainer, int(seed), flat.get(), t.clients_per_round,
                      {k: Path(v) for k, v in (inputs or {}).items()}, t.clients_per_cluster)


# ------------------------------------------------------------ the process a run trains in
CUBLAS_WORKSPACE = ":4096:8"
#: glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory() -> bool:
    """Let freed blocks of up to 32 MB stay in the process for reuse (Linux with glibc; elsewhere
    nothing happens and False is returned). By default glibc gives large freed blocks back to the
    operating system, so each training step's activations and gradients were fresh pages that
    faulted in when first written: about 2,400 page faults and 6 ms of system time in a 30 ms
    stacked step of 100 digits-CNN clients. Where memory lives does not change what is computed
    (tests/test_runner.py trains a run both ways). Freed memory is not handed back, so a job's
    resident memory can stay a little higher: the default DAG's largest training job peaked at
    994 MB, against 951 MB before (docs/results/default-stages.md of the two runs)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # a fixed mmap threshold also stops glibc from moving it; the top of the heap is trimmed only
    # past 1 GiB free, and grows 64 MiB at a time
    return all(mallopt(p, v) == 1 for p, v in ((_M_MMAP_THRESHOLD, 32 << 20),
                                                (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20)))


def configure_torch(device: torch.device, threads: int) -> None:
    """Seeded runs are bitwise repeatable on the CPU for one machine, torch build and thread count
    (the thread count changes the order of float sums; it is recorded in ``metrics.json``).
    On CUDA: deterministic kernels are requested (PyTorch warns in the job log about any operation
    that has none), cuDNN autotuning is off, and cuBLAS gets a fixed workspace through
    ``CUBLAS_WORKSPACE_CONFIG``, which cuBLAS reads when it first initialises: the ``mcfl`` command
    sets it at start-up; an API caller that used CUDA before without it gets a warning. Freed host
    memory is kept for reuse (:func:`keep_freed_memory`)."""
    torch.set_num_threads(max(1, int(threads)))
    keep_freed_memory()
    if device.type == "cuda":
        if "CUBLAS_WORKSPACE_CONFIG" not in os.environ and torch.cuda.is_initialized():
            log.warning("CUDA is already initialised without CUBLAS_WORKSPACE_CONFIG: cuBLAS results "
                        "may not repeat bitwise; set CUBLAS_WORKSPACE_CONFIG=%s before using CUDA",
                        CUBLAS_WORKSPACE)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
