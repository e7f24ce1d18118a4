"""Executors: how a round's local updates are computed. Both have :class:`~mcfl.engine.LocalTrainer`'s
interface (``run(tasks, rnd)`` yields ``(task, LocalResult)`` one at a time; ``train``, ``gradient``,
``predict``) and train from the same per-(seed, round, client) batch plan
(:func:`mcfl.engine.batch_plan`), so they give the same weights up to float rounding.

* ``sequential`` (:class:`~mcfl.engine.LocalTrainer`): one client after another. Best when one
  client's step already fills the device (big models on a CPU).
* ``batched`` (:class:`BatchedTrainer`): a chunk of clients at once. Their weights are stacked into
  a ``(C, |W|)`` matrix; one step of all C clients is one ``torch.func.vmap(functional_call)``
  forward over the stack and one ordinary backward of the sum of their losses (the clients'
  parameters are disjoint, so each gets its own gradient; ``torch.func.grad`` would give the same
  but imports ``torch._dynamo``, seconds per process). The per-operation cost (Python, kernel
  launch) is paid once per chunk instead of once per client. Clients have different data sizes and
  hence numbers of steps: tasks are sorted by their number of steps (longest first) and cut into
  chunks; at step s of a chunk only the clients that still have a step s train (a prefix of the
  chunk, so the work is the clients' total number of steps, not chunk x longest); the short last
  batch of an epoch is padded with masked rows and a client's loss is the mean over its *real*
  rows only. Results are yielded chunk by chunk, each its own copy (a caller may keep it): at most
  two chunks' worth of local models are alive at once (O(chunk·|W|) device memory), which is what
  makes it a GPU executor.

The ``batched`` executor's paths (:mod:`mcfl.executors.batched`): low-rank dense layers
(:mod:`mcfl.executors.lowrank`) where valid, else the stacked path or the sequential loop, whichever
is faster for the model on the device; what the paths share is in :mod:`mcfl.executors.stack`.
"""

from __future__ import annotations

from mcfl.engine import DeviceData, FlatModel, LocalSpec, LocalTrainer
from mcfl.executors.batched import STACKED_CPU_MACS, BatchedTrainer
from mcfl.executors.lowrank import LOWRANK, LowRankLinear
from mcfl.executors.stack import CPU_CHUNK_BYTES, CUDA_CHUNK_FRACTION, auto_chunk, client_ce, forward_macs

__all__ = ["CPU_CHUNK_BYTES", "CUDA_CHUNK_FRACTION", "EXECUTORS", "LOWRANK", "STACKED_CPU_MACS", "BatchedTrainer",
           "LowRankLinear", "auto_chunk", "client_ce", "forward_macs", "make_trainer", "same_executor"]

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
