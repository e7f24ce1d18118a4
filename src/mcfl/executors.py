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

Not supported by ``batched``: models with floating-point buffers (BatchNorm running statistics:
padded rows would also enter the batch statistics), and random layers (dropout): both raise a clear
error; use ``executor: sequential`` for them. Tasks with their own loss (``Task.loss``: FedCG's
distillation and domain terms) are trained one at a time by the sequential code path.
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from mcfl.engine import (DeviceData, DivergenceError, FlatModel, LocalResult, LocalSpec,
                         LocalTrainer, Task, n_steps)

EXECUTORS = ("sequential", "batched")
#: Device memory the automatic chunk size aims at for the stacked per-client state (CPU: fixed;
#: CUDA: a fraction of the device's total memory).
CPU_CHUNK_BYTES = 1 << 30
CUDA_CHUNK_FRACTION = 0.4


def make_trainer(executor: str, model: FlatModel, data: DeviceData, spec: LocalSpec, seed: int,
                 chunk: int | None = None) -> LocalTrainer:
    """The executor named in the run's ``train.executor`` (``sequential`` or ``batched``)."""
    if executor == "sequential":
        return LocalTrainer(model, data, spec, seed)
    if executor == "batched":
        return BatchedTrainer(model, data, spec, seed, chunk=chunk)
    raise ValueError(f"unknown executor {executor!r}; use one of {', '.join(EXECUTORS)}")


def auto_chunk(model: FlatModel) -> int:
    """Clients per chunk: about 6 stacked copies of the weights per client (weights, gradient,
    anchor, linear term, temporaries) within the budget; at least 1, at most 4096."""
    if model.device.type == "cuda":
        budget = CUDA_CHUNK_FRACTION * torch.cuda.get_device_properties(model.device).total_memory
    else:
        budget = CPU_CHUNK_BYTES
    return int(max(1, min(4096, budget // (6 * 4 * model.size))))


class BatchedTrainer(LocalTrainer):
    """Trains chunks of ``chunk`` clients at once (see the module docstring)."""

    def __init__(self, model: FlatModel, data: DeviceData, spec: LocalSpec, seed: int,
                 chunk: int | None = None):
        super().__init__(model, data, spec, seed)
        buffers = [n for n, b in model.module.named_buffers() if b.is_floating_point()]
        if buffers:
            raise ValueError(f"executor 'batched' does not support models with floating-point buffers "
                             f"(here {', '.join(buffers[:3])}{', ...' if len(buffers) > 3 else ''}: "
                             f"BatchNorm statistics); use executor: sequential")
        if chunk is not None and int(chunk) < 1:
            raise ValueError(f"executor chunk must be >= 1, got {chunk}")
        self.chunk = int(chunk) if chunk else auto_chunk(model)
        params = list(model.module.named_parameters())
        self._names = [n for n, _ in params]
        self._shapes = [p.shape for _, p in params]
        self._sizes = [p.numel() for _, p in params]
        self._forward = vmap(lambda p, x: functional_call(model.module, p, (x,)))

    def _grad(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor):
        """Every client's gradient of its mean loss over the real rows of its padded batch, and that
        loss. ``w`` (C, P) holds the clients' flat parameters; the clients' parameters are disjoint,
        so the gradient of the sum of their losses w.r.t. ``w`` is each client's own gradient."""
        w = w.detach().requires_grad_()
        C = len(w)
        params = {n: t.view(C, *s) for n, t, s in zip(self._names, w.split(self._sizes, 1), self._shapes)}
        logits = self._forward(params, x)                                    # (C, B, classes)
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
        loss = (losses * mask).sum(1) / mask.sum(1).clamp(min=1)
        (g,) = torch.autograd.grad(loss.sum(), w)
        return g, loss.detach()

    def run(self, tasks: Iterable[Task], rnd: int) -> Iterator[tuple[Task, LocalResult]]:
        tasks = list(tasks)
        if any(t.loss is not None for t in tasks):      # a custom loss: the sequential code path
            yield from super().run(tasks, rnd)
            return
        steps = [n_steps(int(self.data.n_train[t.client]), self.spec) for t in tasks]
        order = sorted(range(len(tasks)), key=lambda i: -steps[i])      # stable: ties keep task order
        for a in range(0, len(order), self.chunk):
            chunk = [tasks[i] for i in order[a:a + self.chunk]]
            yield from zip(chunk, self._train_chunk(chunk, rnd))

    def _train_chunk(self, tasks: list[Task], rnd: int) -> list[LocalResult]:
        """Train ``tasks`` (sorted by number of steps, longest first) together. At step s the
        clients still training are a prefix ``[:n_s]`` of the chunk, so each step works on views
        ``w[:n_s]`` (no work for finished clients); rows past the end of a short last batch are
        padding, masked out of the loss."""
        spec, dev, P, B = self.spec, self.data.device, self.model.n_params, self.spec.batch_size
        self.model.module.train()
        plans = [self.plan(t.client, rnd) for t in tasks]
        steps = torch.tensor([len(p) for p in plans])
        if bool((steps[1:] > steps[:-1]).any()):
            raise ValueError("_train_chunk needs its tasks sorted by number of steps, longest first")
        rows = torch.full((int(steps[0]) if len(steps) else 0, len(tasks), B), -1, dtype=torch.long)
        for i, p in enumerate(plans):
            rows[:len(p), i] = p
        rows = rows.to(dev)
        mask = (rows >= 0).float()
        rows = rows.clamp(min=0)                                   # padded rows: any valid row, masked
        active = [int((steps > s).sum()) for s in range(len(rows))]   # n_s
        w = torch.stack([t.start[:P] for t in tasks]).to(dev)     # (C, P)
        prox = any(t.mu for t in tasks)
        mu = torch.tensor([float(t.mu) for t in tasks], device=dev)[:, None]
        anchor = torch.stack([(t.anchor if t.mu else t.start)[:P] for t in tasks]) if prox else None
        linear = None
        if any(t.linear is not None for t in tasks):
            linear = torch.stack([t.linear if t.linear is not None else torch.zeros(P, device=dev)
                                  for t in tasks])
        loss_sum = torch.zeros(len(tasks), device=dev)
        shape = self.data.x["train"].shape[1:]
        for s, n in enumerate(active):
            ws, r = w[:n], rows[s, :n]
            x = self.data.inputs(r.reshape(-1)).view(n, B, *shape)
            g, loss = self._grad(ws, x, self.data.y["train"][r], mask[s, :n])
            with torch.no_grad():
                if prox:                                               # g += mu (w - anchor)
                    g.addcmul_(ws - anchor[:n], mu[:n])
                if linear is not None:                                 # g += linear
                    g.add_(linear[:n])
                ws.add_(g, alpha=-spec.lr)                             # w -= lr g
            loss_sum[:n] += loss
        mean_loss = (loss_sum.cpu() / steps.clamp(min=1)).tolist()
        finite = torch.isfinite(w.sum(1)).cpu()                   # one pass (see LocalTrainer.train)
        out = []
        for i, t in enumerate(tasks):
            if not math.isfinite(mean_loss[i]) or not bool(finite[i]):
                raise DivergenceError(f"round {rnd}, client {t.client}: local training diverged "
                                      f"(mean loss {mean_loss[i]}); lower the learning rate")
            out.append(LocalResult(w[i].clone(), mean_loss[i], int(self.data.n_train[t.client]), int(steps[i])))
        return out
