"""Executors: how a round's local updates are computed. Both have :class:`~mcfl.engine.LocalTrainer`'s
interface (``run(tasks, rnd)`` yields ``(task, LocalResult)`` one at a time; ``train``, ``gradient``,
``predict``) and train from the same per-(seed, round, client) batch plan
(:func:`mcfl.engine.batch_plan`), so they give the same weights up to float rounding.

* ``sequential`` (:class:`~mcfl.engine.LocalTrainer`): one client after another. Best when one
  client's step already fills the device (big models on a CPU).
* ``batched`` (:class:`BatchedTrainer`): a chunk of clients at once, their weights stacked and one
  vmapped step for all of them (:mod:`mcfl.executors.batched` says how, and when it pays).

The ``batched`` executor's paths (:mod:`mcfl.executors.batched`): low-rank dense layers
(:mod:`mcfl.executors.lowrank`) and low-rank projections (FedCG's GCN, :mod:`mcfl.executors.projected`)
where valid, else the stacked path or the sequential loop, whichever is faster for the model on
the device; what the paths share is in :mod:`mcfl.executors.stack`.
"""

from __future__ import annotations

from mcfl.engine import DeviceData, FlatModel, LocalSpec, LocalTrainer
from mcfl.executors.batched import STACKED_CPU_MACS, BatchedTrainer
from mcfl.executors.lowrank import LOWRANK, LowRankLinear
from mcfl.executors.projected import PROJECTED, ProjectedPath
from mcfl.executors.stack import CPU_CHUNK_BYTES, CUDA_CHUNK_FRACTION, auto_chunk, client_ce, forward_macs

__all__ = ["CPU_CHUNK_BYTES", "CUDA_CHUNK_FRACTION", "EXECUTORS", "LOWRANK", "STACKED_CPU_MACS", "BatchedTrainer",
           "LowRankLinear", "PROJECTED", "ProjectedPath", "auto_chunk", "client_ce", "forward_macs", "make_trainer",
           "same_executor"]

EXECUTORS = ("sequential", "batched")


def make_trainer(executor: str, model: FlatModel, data: DeviceData, spec: LocalSpec, seed: int,
                 chunk: int | None = None) -> LocalTrainer:
    """The executor named in the run's ``train.executor`` (``sequential`` or ``batched``)."""
    if executor == "sequential":
        return LocalTrainer(model, data, spec, seed)
    if executor == "batched":
        return BatchedTrainer(model, data, spec, seed, chunk=chunk)
    raise ValueError(f"unknown executor {executor!r}; use one of {', '.join(EXECUTORS)}")


def same_executor(trainer: LocalTrainer, model: FlatModel, data: DeviceData) -> LocalTrainer:
    """A trainer of ``trainer``'s kind and settings for another model (an algorithm that trains its
    own network, such as FedCG's, keeps the run's executor)."""
    if isinstance(trainer, BatchedTrainer):
        return BatchedTrainer(model, data, trainer.spec, trainer.seed, chunk=None if trainer.auto else trainer.chunk,
                              lowrank=trainer.lowrank, fallback=trainer._fallback_arg)
    return LocalTrainer(model, data, trainer.spec, trainer.seed)
