"""A run's memory, and the bounds that know the data: a run's settings checked against its prepared
store, and its largest allocations against the machine's free memory, before anything large is
allocated (the cost of a run in time: :mod:`mcfl.cost`).

The config validator knows the numbers of a config (every integer at most 10^9, ``rounds`` at most
10^6) but not the data: ``batch_size: 1000000000`` is a valid integer, and only the store says that
the largest client has 600 samples (the batch plan would pad every client's epoch to 10^9 row
indices, 8 GB). :func:`check_run` is called by ``mcfl train``, ``init-centres`` and ``select-k``
once the store is verified and before the federation is built:

* ``train.batch_size`` at most the largest client's training samples, or :data:`FULL_BATCH_SLACK`
  where that is more (a larger batch is the same full batch; up to the slack it is allowed, as a
  batch of 10 on small test stores, since its padded batch plan costs nothing);
* ``train.clients_per_round`` and ``K`` at most the store's clients;
* the model builds for the store's sample shape and classes (built on PyTorch's ``meta`` device:
  no memory), which gives its size P;
* a lower bound of the memory the run allocates: the store's arrays on the training device, the
  batch plan of the largest client, the stacked weights of one chunk of the batched executor
  (``executor_chunk`` clients; results are otherwise streamed client by client) and the K
  centres, each P float32 values, against the free memory of the
  device (``psutil`` where installed, else ``/proc/meminfo``; ``torch.cuda.mem_get_info`` on a
  GPU). The error names the setting to change.

Every error is a :class:`BoundsError` (a ``ValueError``: the CLI prints it as one line).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from mcfl.cost.workload import local_steps
from mcfl.trainspec import TrainSpec

#: bytes of one float32 weight and of one int64 row index of a batch plan
F32, I64 = 4, 8
#: copies of a client's weights the stacked (batched) update holds at once: weights, gradient,
#: starting point (a lower bound: optimisers and activations come on top)
STACK_COPIES = 3


class BoundsError(ValueError):
    """A run's setting does not fit its store or the machine; the message names the setting."""


def available_memory(device: Any = "cpu") -> int | None:
    """Free memory in bytes of ``device`` (None when it cannot be told)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    if device.type != "cpu":
        return None
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def model_size(model_cfg: dict, data) -> int:
    """The number of weights of ``model_cfg`` built for ``data``'s samples and classes, counted on
    PyTorch's meta device (nothing is allocated); a model that does not fit the data is an error."""
    import torch

    from mcfl.federation import build_model      # deferred: PyTorch and the model zoo, for this count only

    try:
        with torch.device("meta"):
            module = build_model(model_cfg, data)
    except (ValueError, TypeError, RuntimeError, IndexError) as e:
        raise BoundsError(f"model.name: {model_cfg.get('name')!r} cannot be built for {data.path}'s "
                          f"samples of shape {list(data.x_shape)} and {data.n_classes} classes "
                          f"({' '.join(str(e).split())})") from None
    return int(sum(p.numel() for p in module.parameters()))


def _gb(n: float) -> str:
    if n >= 2**30 / 10:
        return f"{n / 2**30:.1f} GB"
    return f"{n / 2**20:.0f} MB" if n >= 2**20 else f"{n / 2**10:.0f} kB"


def estimate(train: dict, data, n_params: int, K: int | None = None) -> dict[str, int]:
    """A lower bound of the bytes a run allocates, by what allocates them (see the module docstring)."""
    t = TrainSpec.of(train)
    n_max = int(data.n_train().max(initial=0))
    steps = local_steps(t, n_max) if n_max else 0
    B = int(t.batch_size)
    per_epoch = max(1, math.ceil(n_max / B))
    plan_rows = math.ceil(steps / per_epoch) * per_epoch if steps else 0   # whole epochs, padded
    c = data.n_clients if t.clients_per_round is None else min(int(t.clients_per_round), data.n_clients)
    # the executors stream results client by client; the batched one stacks a chunk of clients
    # (an automatic chunk is sized by the executor to the device's memory: counted as one client)
    c = min(c, int(t.executor_chunk)) if t.executor == "batched" and t.executor_chunk else 1
    x_bytes = sum(int(np.prod(getattr(data, f"x_{s}").shape, dtype=np.int64)) * getattr(data, f"x_{s}").dtype.itemsize
                  for s in ("train", "test"))
    return {"data": x_bytes + (len(data.y_train) + len(data.y_test)) * I64,
            "batch plan": plan_rows * B * I64,
            "stacked weights": c * n_params * F32 * (STACK_COPIES if t.executor == "batched" else 1),
            "centres": (K or 0) * n_params * F32 * 2}


#: what to change for each part of the estimate
REMEDY = {"data": "a smaller store (fewer clients or samples)",
          "batch plan": "train.batch_size or train.local_steps",
          "stacked weights": "train.executor_chunk",
          "centres": "K",
          "model": "the model's width (model block)"}


#: a batch_size above the largest client's samples is the full batch; up to this many rows it is
#: allowed (its batch plan is a few kB), beyond it refused
FULL_BATCH_SLACK = 1024


def check_run(train: dict, model_cfg: dict, data, *, K: Any = None, device: Any = "cpu",
              where: str = "train") -> dict[str, int]:
    """Check a run's ``train`` block, model and ``K`` against the store ``data`` and the free memory
    of ``device``; return the estimate. ``where`` prefixes the keys named (``train`` for a run's
    JSON). Raises :class:`BoundsError`."""
    t = TrainSpec.of(train)
    n_max = int(data.n_train().max(initial=0))
    B = int(t.batch_size)
    if B > max(n_max, FULL_BATCH_SLACK):
        raise BoundsError(f"{where}.batch_size: {B} is larger than the largest client's training set "
                          f"({n_max} samples in {data.path}); at most {n_max} (that is already the "
                          f"full batch)")
    c = t.clients_per_round
    if c is not None and int(c) > data.n_clients:
        raise BoundsError(f"{where}.clients_per_round: {c} is larger than the number of clients of "
                          f"{data.path} ({data.n_clients}); use null for all clients")
    if K not in (None, "auto") and int(K) > data.n_clients:
        raise BoundsError(f"K: K={K} is larger than the number of clients of {data.path} "
                          f"({data.n_clients})")
    n_params = model_size(model_cfg, data)
    parts = estimate(t, data, n_params, None if K in (None, "auto") else int(K))
    parts["model"] = n_params * F32 * 4          # the global model, its copy, gradient, an average
    free = available_memory(device)
    total = sum(parts.values())
    if free is not None and total > free:
        big = max(parts, key=parts.get)
        detail = ", ".join(f"{k} {_gb(v)}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
        raise BoundsError(f"{where if big not in ('centres', 'model', 'data') else 'run'}: needs at least "
                          f"{_gb(total)} ({detail}) but {device} has {_gb(free)} free; lower "
                          f"{REMEDY[big]}")
    return parts
