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

Low-rank dense layers (the ``batched`` executor's default where valid; ``lowrank=0`` turns it off):
with plain local SGD, a Linear layer's weight after s steps is ``W_s = W0 - lr * sum_{j<s} G_j^T A_j``
(A_j: the layer's B inputs at step j, G_j: the loss gradients w.r.t. its outputs; padded rows have
G = 0). So the weight need not be materialised during the chunk: the forward is
``x W0^T - lr (x A^T) G + b`` and the backward ``dL/dx = g W0 - lr (g G^T) A``, with the client's
history A, G growing by B rows per step (:class:`LowRankLinear`); no weight gradient and no weight
update pass; at the end ``W = W0 - lr G^T A``, one GEMM per client. When the chunk's clients start
from the same W0 (FedAvg and the like: they are grouped by start), ``x W0^T`` and ``g W0`` are one GEMM
over all the chunk's rows, reading the weight once per step for the chunk instead of once per
client. Proximal and linear terms (FeSEM's lambda and FedProx's mu towards an anchor a, per client;
FedDANE's gradient correction c) keep it low-rank: with ``rho = 1 - lr mu``,
``W_s = rho^s W0 + (1 - rho^s) a - lr e_s c - lr sum_{j<s} rho^(s-1-j) G_j^T A_j``
(``e_s = 1 + rho + ... + rho^(s-1)``): the history rows are weighted by ``rho^(s-1-j)`` in the
``(x A^T)`` intermediate, and each constant matrix (W0; a, only where it differs from the start:
FedProx's and FeSEM's anchor is the start, so their W_s has no anchor term; c) is one more GEMM per
group of clients sharing it (a per-client c, FedDANE's, costs one GEMM per client and step). Other
parametrised children (and the biases) run ``vmap(functional_call)`` on their own parameters and
take the same terms in the ordinary SGD step. It applies to ``nn.Sequential`` models without
float buffers, to Linear layers with a bias whose history (steps x batch) is at most ``LOWRANK`` x min(in, out) (the
correction terms grow with it; on the FEMNIST CNN's 3136x2048 layer, one CPU thread, it still paid
at 0.5 and broke even near 1.0), and not to gradient clipping (``max_grad_norm``: it needs each
step's full gradient norm). Its automatic chunk size counts, per client, two copies of the weights
(the result, W0 when not shared) and the history, instead of the stacked path's six.

Choice of path: a client that cannot take the low-rank path (its history is over the limit,
clipping, a model without a lazy layer, ``lowrank=0``) trains on the faster of the others on the
device (``fallback``): the stacked path on a GPU; on a CPU, the stacked path for small models (a
forward pass of at most ``STACKED_CPU_MACS`` multiply-adds per sample, counted over the Linear and
convolution layers: a step's cost there is per-operation overhead, which stacking pays once per
chunk; the 8x8 digits CNN, 92K, trains 3.6x faster stacked) and the sequential loop for the others
(the FEMNIST CNN, 11.5M with hidden 248: 1.3x faster sequential). Models whose training forward
writes to their buffers (BatchNorm running statistics: padded rows would enter the batch
statistics; found by one probe forward) or with random layers (dropout) always train
sequentially; other float buffers (FedCG's adjacency) are constants of the update, shared by a
chunk. The choice is logged once per run (logger ``mcfl``, INFO).

Custom losses (``Task.loss``): one marked ``batchable`` (FedCG's: classification, pseudo-label
and domain terms) takes ``mask=`` and is vmap-safe, so its tasks train on the fallback path above,
stacked on a GPU and for small models (on digits_domains' FedCG, 0.7M parameters of which 0.68M
are the GCN's projection: 1.5 s a round against 2.2-2.5 s sequential, one thread; what is left is
memory traffic over the per-client projection gradients). A batchable loss with a ``layerwise``
form (FedMMD's: one loss shared by a round's clients, computed from the layers' outputs of the
stacked clients) trains like the plain cross-entropy, on the low-rank path where it applies.
Parameters the model marks ``requires_grad=False`` (FedFusion's frozen global extractor; its loss
is the plain one) get a zero gradient on every path and are never stepped on the low-rank path.
On the LEAF CNN (real writers, 16 a round, batch 5, one CPU thread) that made FedMMD's round 2.2x
and FedFusion's 1.7x faster than one client at a time (``benchmarks/methods_round.py --batch 5``;
docs/performance.md). A custom loss may return diagnostics with its loss; both stacked and
sequential paths sum them over each client's steps (``LocalResult.aux``).
"""

from __future__ import annotations

import bisect
import logging
import math
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from mcfl.engine import (DeviceData, DivergenceError, FlatModel, LocalResult, LocalSpec,
                         LocalTrainer, Task, clip_coef, n_steps, sgd_step_)

log = logging.getLogger("mcfl")

EXECUTORS = ("sequential", "batched")
#: Device memory the automatic chunk size aims at for the stacked per-client state (CPU: fixed;
#: CUDA: a fraction of the device's total memory).
CPU_CHUNK_BYTES = 1 << 30
CUDA_CHUNK_FRACTION = 0.4
#: Low-rank dense layers: a Linear layer is trained lazily in a chunk when the longest client's
#: history (steps x batch rows) is at most this fraction of min(in_features, out_features).
LOWRANK = 0.5
#: forward multiply-adds per sample up to which the stacked path is the CPU fallback (see above)
STACKED_CPU_MACS = 1_000_000


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


def auto_chunk(model: FlatModel, per_client: int | None = None) -> int:
    """Clients per chunk: ``per_client`` bytes each within the budget; by default about 6 stacked
    copies of the weights (weights, gradient, anchor, linear term, temporaries); at least 1, at
    most 4096."""
    if model.device.type == "cuda":
        budget = CUDA_CHUNK_FRACTION * torch.cuda.get_device_properties(model.device).total_memory
    else:
        budget = CPU_CHUNK_BYTES
    return int(max(1, min(4096, budget // (per_client or 6 * 4 * model.size))))


def forward_macs(module: nn.Module, sample: torch.Tensor) -> int:
    """Multiply-adds of ``module``'s Linear and convolution layers in one forward pass of
    ``sample`` (a batch of one): in x out per Linear, output size x (in_channels / groups) x kernel
    size per convolution."""
    total = 0

    def count(m: nn.Module, _, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(m, nn.Linear):
            total += out.numel() * m.in_features
        else:
            total += out.numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size)

    hooks = [m.register_forward_hook(count) for m in module.modules()
             if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))]
    try:
        with torch.no_grad():
            module(sample)
    finally:
        for h in hooks:
            h.remove()
    return total


class BatchedTrainer(LocalTrainer):
    """Trains chunks of ``chunk`` clients at once (see the module docstring). ``fallback``: how
    tasks that cannot take the low-rank path train, ``"sequential"`` or ``"stacked"`` (default: the
    faster one on the device: stacked on a GPU, and on a CPU for models of at most
    ``STACKED_CPU_MACS`` multiply-adds per sample; sequential otherwise)."""

    #: ``run`` lists all its tasks before training (a server may build them eagerly at no extra cost)
    keeps_tasks = True

    def __init__(self, model: FlatModel, data: DeviceData, spec: LocalSpec, seed: int,
                 chunk: int | None = None, lowrank: float = LOWRANK, fallback: str | None = None):
        super().__init__(model, data, spec, seed)
        if chunk is not None and int(chunk) < 1:
            raise ValueError(f"executor chunk must be >= 1, got {chunk}")
        if fallback not in (None, "sequential", "stacked"):
            raise ValueError(f"fallback must be 'sequential' or 'stacked', got {fallback!r}")
        self.auto = not chunk
        self.chunk = int(chunk) if chunk else auto_chunk(model)
        self._fallback_arg = fallback
        random = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.module.modules())
        running = not random and _running_buffers(model, data)
        # dropout (per-client random masks) and buffers a training forward updates (BatchNorm
        # statistics: padded rows would enter them): neither batched path supports them, so such a
        # model trains sequentially. Other float buffers (FedCG's adjacency) are constants of the
        # local update: a chunk shares them (see _run_chunks)
        self._unsupported = ("dropout" if random else
                             "buffers that training updates (BatchNorm statistics)" if running else None)
        self._wrap = _LossCall(model.module)
        self._custom = vmap(lambda p, x, y, r, m: functional_call(self._wrap, p, (x, y, r, m)))
        self.fallback = "sequential" if self._unsupported else fallback or self._faster_fallback(data)
        self._said: set[str] = set()
        params = list(model.module.named_parameters())
        self._names = [n for n, _ in params]
        self._trainable = [p.requires_grad for _, p in params]
        self._shapes = [p.shape for _, p in params]
        self._sizes = [p.numel() for _, p in params]
        self._forward = vmap(lambda p, x: functional_call(model.module, p, (x,)))
        # low-rank path: the children of an nn.Sequential, their own parameter names, a vmapped
        # forward for those with parameters, and which are candidate lazy Linear layers
        self.lowrank = float(lowrank)
        seq = isinstance(model.module, nn.Sequential)
        self._children = list(model.module) if seq else []
        self._local = [[n for n, _ in c.named_parameters()] for c in self._children]
        self._vmapped = [vmap(lambda p, x, c=c: functional_call(c, p, (x,))) for c in self._children]
        # the low-rank path writes parameters only: models with (constant) float buffers take the
        # stacked path, which carries them over from the start
        self._buffers = model.size > model.n_params
        self._lazy = (self._flat_linears(data) if lowrank > 0 and not self._unsupported and not self._buffers
                      else [])

    def _faster_fallback(self, data: DeviceData) -> str:
        """The faster of the stacked and the sequential path on this device (module docstring)."""
        if self.model.device.type != "cpu":
            return "stacked"
        sample = torch.zeros(1, *data.x["train"].shape[1:], device=data.device)
        return "stacked" if forward_macs(self.model.module, sample) <= STACKED_CPU_MACS else "sequential"

    def _flat_linears(self, data: DeviceData) -> list[int]:
        """The children that are trainable ``nn.Linear`` layers with a bias and get one feature
        vector per sample (found by passing one zero sample through the model)."""
        out, h = [], torch.zeros(1, *data.x["train"].shape[1:], device=data.device)
        with torch.no_grad():
            for i, child in enumerate(self._children):
                if (type(child) is nn.Linear and child.bias is not None and h.dim() == 2
                        and child.weight.requires_grad and child.bias.requires_grad):
                    out.append(i)
                h = child(h)
        return out

    def _views(self, w: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views ``(n, *shape)`` of stacked flat parameters ``w`` (n, P)."""
        return [t.view(len(w), *s) for t, s in zip(w.split(self._sizes, 1), self._shapes)]

    def _grad(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
              rows: torch.Tensor | None = None, loss_fn=None):
        """Every client's gradient of its mean loss over the real rows of its padded batch (one
        tensor per parameter, ``(n, *shape)``; no concatenation into (n, P): for FedCG's 0.7M
        parameters that copy was a quarter of a step), that loss and (custom losses) its
        diagnostics. ``w`` (n, P) holds the clients' flat parameters; the clients' parameters are
        disjoint, so the gradient of the sum of their losses is each client's own gradient.
        ``loss_fn``: a batchable ``Task.loss``, called per client under vmap with its rows and mask."""
        # frozen parameters (requires_grad=False in the model: FedFusion's global extractor) get a
        # zero gradient, as on the sequential path
        live = self._trainable
        leaves = [v.detach().requires_grad_(t) for v, t in zip(self._views(w), live)]
        params = dict(zip(self._names, leaves))
        aux = None
        if loss_fn is None:
            logits = self._forward(params, x)                                # (n, B, classes)
            loss = client_ce(logits, y, mask)
        else:
            self._wrap.fn = loss_fn
            loss = self._custom({f"net.{n}": t for n, t in params.items()}, x, y, rows, mask)
            if isinstance(loss, tuple):
                loss, aux = loss[0], loss[1].detach()
        custom = loss_fn is not None      # may leave parameters out (FedCG's teacher): zero gradient
        grads = iter(torch.autograd.grad(loss.sum(), [v for v, t in zip(leaves, live) if t],
                                         allow_unused=custom, materialize_grads=custom))
        return [next(grads) if t else torch.zeros_like(v) for v, t in zip(leaves, live)], loss.detach(), aux

    def _why_slow(self) -> str:
        """Why a task cannot take the low-rank path, given that its history is not the reason."""
        if self._unsupported:
            return f"the model has {self._unsupported}"
        if self.spec.max_grad_norm is not None:
            return "gradient clipping (max_grad_norm) needs each step's full gradient"
        if self._buffers:
            return "the model has float buffers (the low-rank path carries parameters only)"
        if not self._lazy:
            return ("lowrank=0" if self.lowrank <= 0 else
                    "the model has no nn.Linear layer with a bias on flat features in an nn.Sequential")
        return f"history (steps x batch) above {self.lowrank:g} x min(in, out) of every dense layer"

    def _say(self, message: str, key: str | None = None) -> None:
        """Log ``message`` once per trainer (that is, once per run) for each ``key`` (default: the
        message itself; a key leaves out what changes every round, such as the round number)."""
        key = message if key is None else key
        if key not in self._said:
            self._said.add(key)
            log.info(message)

    def run(self, tasks: Iterable[Task], rnd: int) -> Iterator[tuple[Task, LocalResult]]:
        tasks = list(tasks)
        B = self.spec.batch_size
        steps = [n_steps(int(self.data.n_train[t.client]), self.spec) for t in tasks]
        # a layerwise loss must be batchable too: a task the low-rank path cannot take goes stacked
        layerwise = all(t.loss is None or (getattr(t.loss, "batchable", False) and getattr(t.loss, "layerwise", None))
                        for t in tasks)
        if not layerwise:                   # a custom loss without a layerwise form: no low-rank path
            if all(getattr(t.loss, "batchable", False) for t in tasks) and not self._unsupported:
                self._say(f"batched executor: a custom local loss trains on the {self.fallback} path, "
                          f"the faster one for this model on {self.model.device.type}")
                if self.fallback == "stacked":
                    yield from self._run_chunks(tasks, steps, rnd, False)
                    return
            yield from super().run(tasks, rnd)
            return
        fast = [bool(self._lazy_layers([t], s * B)) for t, s in zip(tasks, steps)]
        slow = [t for t, f in zip(tasks, fast) if not f]
        if slow:
            said = (f"batched executor: clients whose local update cannot take the low-rank path "
                    f"({self._why_slow()}) train on the {self.fallback} path, the faster one for this "
                    f"model on {self.model.device.type}")
            self._say(f"{said} (first in round {rnd}: {len(slow)} of {len(tasks)} clients)", key=said)
            if self.fallback == "sequential":
                yield from super().run(slow, rnd)
            else:
                yield from self._run_chunks(slow, [s for s, f in zip(steps, fast) if not f], rnd, False)
        yield from self._run_chunks([t for t, f in zip(tasks, fast) if f],
                                    [s for s, f in zip(steps, fast) if f], rnd, True)

    def _run_chunks(self, tasks: list[Task], steps: list[int], rnd: int, lowrank: bool):
        """Sort ``tasks`` by number of steps (longest first; on the low-rank path clients with the
        same start and anchor next to each other, so that chunks share them), cut them into
        chunks and train each."""
        key, size = [-s for s in steps], self.chunk
        if lowrank and tasks:
            group: dict[tuple, int] = {}
            key = [(group.setdefault((t.start.data_ptr(), t.anchor.data_ptr() if t.mu else 0), len(group)), k)
                   for t, k in zip(tasks, key)]
            if self.auto:     # per client: its result, its W0 if not shared, the lazy layers' history
                history = max(steps) * self.spec.batch_size
                hist = history * sum(self._children[i].in_features + self._children[i].out_features
                                     for i in self._lazy_layers(tasks, history) or self._lazy)
                size = auto_chunk(self.model, 4 * (2 * self.model.size + hist))
        # a chunk shares one custom loss and the model's constant buffers (FedCG's adjacency),
        # which come with each task's start: split the tasks by both first
        part: dict[tuple, list[int]] = {}
        for i, t in enumerate(tasks):
            part.setdefault((id(t.loss), t.start.data_ptr() if self._buffers else 0), []).append(i)
        for idx in part.values():
            order = sorted(idx, key=lambda i: key[i])                   # stable: ties keep task order
            for a in range(0, len(order), size):
                chunk = [tasks[i] for i in sorted(order[a:a + size], key=lambda i: -steps[i])]
                yield from zip(chunk, self._train_chunk(chunk, rnd, lowrank))

    def _chunk_batches(self, tasks: list[Task], rnd: int):
        """The chunk's batch plans as ``rows`` (steps, C, B) (padded rows: row 0, masked), ``mask``,
        each client's number of ``steps`` and ``active[s]`` = n_s, the clients training at step s."""
        plans = [self.plan(t.client, rnd) for t in tasks]
        steps = torch.tensor([len(p) for p in plans])
        if bool((steps[1:] > steps[:-1]).any()):
            raise ValueError("_train_chunk needs its tasks sorted by number of steps, longest first")
        rows = torch.full((int(steps[0]) if len(steps) else 0, len(tasks), self.spec.batch_size), -1,
                          dtype=torch.long)
        for i, p in enumerate(plans):
            rows[:len(p), i] = p
        rows = rows.to(self.data.device)
        mask = (rows >= 0).float()
        active = [int((steps > s).sum()) for s in range(len(rows))]
        return rows.clamp(min=0), mask, steps, active

    def _results(self, tasks: list[Task], rnd: int, weights: list[torch.Tensor], loss_sum: torch.Tensor,
                 steps: torch.Tensor, aux: torch.Tensor | None = None) -> list[LocalResult]:
        """``weights[i]``: task i's final flat weights, its own tensor (a caller may keep it);
        ``aux[i]``: its custom loss's diagnostics summed over its steps."""
        mean_loss = (loss_sum.cpu() / steps.clamp(min=1)).tolist()
        finite = torch.isfinite(torch.stack([w.sum() for w in weights])).cpu()   # see LocalTrainer.train
        out = []
        for i, t in enumerate(tasks):
            if not math.isfinite(mean_loss[i]) or not bool(finite[i]):
                raise DivergenceError.local(rnd, t.client, mean_loss[i])
            out.append(LocalResult(weights[i], mean_loss[i], int(self.data.n_train[t.client]), int(steps[i]),
                                   None if aux is None else aux[i].clone()))
        return out

    @staticmethod
    def _terms(tasks: list[Task]) -> tuple[list[float], list | None, list | None]:
        """Each client's mu and, when some client has that term, each client's anchor (its start
        where mu = 0) and linear term (None: 0)."""
        anchor = [t.anchor if t.mu else t.start for t in tasks] if any(t.mu for t in tasks) else None
        linear = [t.linear for t in tasks] if any(t.linear is not None for t in tasks) else None
        return [float(t.mu) for t in tasks], anchor, linear

    def _train_chunk(self, tasks: list[Task], rnd: int, lowrank: bool = True) -> list[LocalResult]:
        """Train ``tasks`` (sorted by number of steps, longest first) together. At step s the
        clients still training are a prefix ``[:n_s]`` of the chunk, so each step works on views
        ``w[:n_s]`` (no work for finished clients); rows past the end of a short last batch are
        padding, masked out of the loss. Low-rank path when it applies (see :meth:`_lazy_layers`)."""
        if self._unsupported:
            raise ValueError(f"the batched executor cannot stack a model with {self._unsupported}")
        rows, mask, steps, active = self._chunk_batches(tasks, rnd)
        lazy = self._lazy_layers(tasks, len(rows) * self.spec.batch_size) if lowrank else []
        if lazy:
            return self._train_chunk_lowrank(tasks, rnd, rows, mask, steps, active, lazy)
        spec, dev, P, B = self.spec, self.data.device, self.model.n_params, self.spec.batch_size
        self.model.module.train()
        if self._buffers:                  # constant buffers, shared by the chunk (_run_chunks)
            self.model.flat[P:].copy_(tasks[0].start[P:])
        w = _stack([t.start for t in tasks], slice(0, P), dev)                 # (C, P)
        loss_fn = tasks[0].loss
        mu, anchor, linear = self._terms(tasks)
        mu = torch.tensor(mu, device=dev)
        mus = [mu.view(-1, *[1] * len(s)) for s in self._shapes]
        anchor, linear = [_stack(v, slice(0, P), dev) if v else None for v in (anchor, linear)]
        clip = None
        if spec.max_grad_norm is not None:                             # clip each client's g

            def clip(g: list[torch.Tensor]) -> None:
                norm = torch.stack([t.reshape(len(t), -1).norm(dim=1) for t in g]).norm(dim=0)
                coef = clip_coef(norm, spec.max_grad_norm)
                for t in g:
                    t.mul_(coef.view(-1, *[1] * (t.dim() - 1)))
        loss_sum, aux_sum = torch.zeros(len(tasks), device=dev), None
        shape = self.data.x["train"].shape[1:]
        for s, n in enumerate(active):
            ws, r = w[:n], rows[s, :n]
            x = self.data.inputs(r.reshape(-1)).view(n, B, *shape)
            g, loss, aux = self._grad(ws, x, self.data.y["train"][r], mask[s, :n], r, loss_fn)
            sgd_step_(self._views(ws), g, spec.lr, [m[:n] for m in mus],
                      None if anchor is None else self._views(anchor[:n]),
                      None if linear is None else self._views(linear[:n]), clip)
            loss_sum[:n] += loss
            if aux is not None:
                aux_sum = aux.new_zeros(len(tasks), aux.shape[1]) if aux_sum is None else aux_sum
                aux_sum[:n] += aux
        weights = [torch.cat([wi, t.start[P:].to(dev)]) if self._buffers else wi.clone()
                   for wi, t in zip(w, tasks)]
        return self._results(tasks, rnd, weights, loss_sum, steps, aux_sum)

    # -- low-rank dense layers ------------------------------------------------------------------
    def _lazy_layers(self, tasks: list[Task], history: int) -> list[int]:
        """Indices of the ``nn.Sequential`` children trained lazily in this chunk: ``nn.Linear``
        layers with a bias whose history (``history`` = longest client's steps x batch rows) is at
        most ``lowrank`` x min(in, out) (so the correction terms cost less than the weight
        passes they replace), and only when gradients are not clipped (that needs every step's
        full norm)."""
        if not self._lazy or self.spec.max_grad_norm is not None:
            return []
        return [i for i in self._lazy
                if history <= self.lowrank * min(self._children[i].in_features,
                                                  self._children[i].out_features)]

    def _train_chunk_lowrank(self, tasks, rnd, rows, mask, steps, active, lazy) -> list[LocalResult]:
        """The chunk with its lazy dense layers never materialised (:class:`LowRankLinear`); the
        other parametrised children run ``vmap(functional_call)`` on their own stacked parameters,
        the parameter-free ones on the (n·B, ...) rows of all clients at once. Only the regular
        parameters are stacked per client (not |W|); each client's weights are written once, at
        the end. With proximal terms (client c: ``rho_c = 1 - lr mu_c``) and linear terms, a lazy
        layer's weight after s steps is ``rho^s W0 + (1 - rho^s) a - lr e_s c - lr sum_j
        rho^(s-1-j) G_j^T A_j`` with ``e_s = 1 + rho + ... + rho^(s-1)``."""
        dev, P, B, lr = self.data.device, self.model.n_params, self.spec.batch_size, self.spec.lr
        C, shape, sl = len(tasks), self.data.x["train"].shape[1:], self.model.slices
        self.model.module.train()
        starts = [t.start.to(dev) for t in tasks]
        lazy_w = {f"{i}.weight": i for i in lazy}
        mu, anchor, linear = self._terms(tasks)
        mu = torch.tensor(mu, device=dev)
        stack = lambda vs: {n: _stack(vs, sl[n], dev).view(C, *s)  # noqa: E731
                            for n, s in zip(self._names, self._shapes) if n not in lazy_w} if vs else {}
        stacked = stack(starts)                                                  # (C, *shape)
        anchors, linears = stack(anchor), stack(linear)
        mus = {n: mu.view(C, *[1] * len(s)) for n, s in zip(self._names, self._shapes)}
        # per-client factors of the constant terms at each step s = 0..S: rho^s and e_s
        S, rho = len(rows), 1 - lr * mu
        pw, e = torch.ones(S + 1, C, device=dev), torch.zeros(S + 1, C, device=dev)
        for s in range(S):
            pw[s + 1], e[s + 1] = pw[s] * rho, e[s] * rho + 1
        far = [bool(t.mu) and t.anchor.data_ptr() != t.start.data_ptr() and not torch.equal(t.anchor[:P], t.start[:P])
               for t in tasks]
        w0_coef = torch.where(torch.tensor(far, device=dev), pw, 1.0) if any(far) else None   # (S+1, C)
        hist = {}
        for name, i in lazy_w.items():
            lin = self._children[i]
            view = lambda v, name=name, lin=lin: v[sl[name]].view(lin.out_features, lin.in_features)  # noqa: E731
            hist[i] = h = _History(C, S * B, lin.in_features, lin.out_features, lr, dev)
            h.add_term([view(w) for w in starts], [t.start.data_ptr() for t in tasks],
                       lambda s: None if w0_coef is None else w0_coef[s])
            if any(far):                                               # anchor != start
                h.add_term([view(t.anchor) if f else None for t, f in zip(tasks, far)],
                           [t.anchor.data_ptr() if f else 0 for t, f in zip(tasks, far)], lambda s: 1 - pw[s])
            if linear:
                h.add_term([view(t.linear) if t.linear is not None else None for t in tasks],
                           [id(t.linear) for t in tasks], lambda s: -lr * e[s])
        decay = bool(mu.any())
        loss_fn = getattr(tasks[0].loss, "layerwise", None)          # a custom loss (one per chunk)
        live = [n for n, t in zip(self._names, self._trainable) if t and n in stacked]   # not frozen
        loss_sum = torch.zeros(C, device=dev)
        for s, n in enumerate(active):
            r = rows[s, :n]
            for h in hist.values():
                h.step(s, B, rho if decay else None)
            leaves = {k: v[:n].detach().requires_grad_(k in live) for k, v in stacked.items()}
            x = x_in = self.data.inputs(r.reshape(-1)).view(n, B, *shape)
            outs = []
            for i, child in enumerate(self._children):
                if i in hist:
                    x = LowRankLinear.apply(x, leaves[f"{i}.bias"], hist[i], s)
                elif self._local[i]:
                    x = self._vmapped[i]({k: leaves[f"{i}.{k}"] for k in self._local[i]}, x)
                else:
                    x = child(x.flatten(0, 1)).unflatten(0, (n, B))
                outs.append(x)
            y = self.data.y["train"][r]
            loss = client_ce(x, y, mask[s, :n]) if loss_fn is None else loss_fn(x_in, outs, y, mask[s, :n])
            grads = torch.autograd.grad(loss.sum(), [leaves[k] for k in live])
            sgd_step_([stacked[k][:n] for k in live], list(grads), lr, [mus[k][:n] for k in live],
                      [anchors[k][:n] for k in live] if anchors else None,
                      [linears[k][:n] for k in live] if linears else None)
            loss_sum[:n] += loss.detach()
        weights = []
        with torch.no_grad():
            for c in range(C):
                w = torch.empty(P, device=dev)
                for name, v in stacked.items():
                    w[sl[name]].copy_(v[c].reshape(-1))
                for name, i in lazy_w.items():     # constant terms, then - lr G_c^T (decay A_c): one GEMM
                    hist[i].final(c, int(steps[c]), B, rho[c] if decay else None,
                                  w[sl[name]].view(hist[i].g.shape[2], hist[i].a.shape[2]))
                weights.append(w)
        return self._results(tasks, rnd, weights, loss_sum, steps)


def _running_buffers(model: FlatModel, data: DeviceData) -> bool:
    """Whether a training-mode forward pass writes to the model's buffers (BatchNorm's running
    statistics and batch counter), found by one forward of two random samples; the buffers, the
    mode and the RNG are left as they were. A model the probe cannot run counts as writing them
    (it then trains sequentially, as every float-buffer model did before the probe)."""
    module = model.module
    if not any(b.is_floating_point() for b in module.buffers()):
        return False
    before = {n: b.clone() for n, b in module.named_buffers()}
    mode = module.training
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *data.x["train"].shape[1:], generator=g).to(data.device)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            module.train()
            try:
                module(x)
            except Exception:      # e.g. inputs a random float sample does not fit: play safe
                return True
        return any(not torch.equal(b, before[n]) for n, b in module.named_buffers())
    finally:
        module.train(mode)
        with torch.no_grad():
            for n, b in module.named_buffers():
                b.copy_(before[n])


def client_ce(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each of n clients' mean cross-entropy over the real rows of its padded batch: ``logits``
    (n, B, classes), ``y`` and ``mask`` (n, B)."""
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
    return (losses * mask).sum(1) / mask.sum(1).clamp(min=1)


class _LossCall(nn.Module):
    """``fn(net, x, y, rows, mask=mask)`` as a module's forward, so that ``functional_call`` can
    swap in one client's parameters (names ``net.*``) for a custom ``Task.loss``."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.fn = None

    def forward(self, x, y, rows, mask):
        return self.fn(self.net, x, y, rows, mask=mask)


def _stack(vs: list, sl: slice, dev) -> torch.Tensor:
    """The ``sl`` parts of the vectors ``vs`` (None: zeros) stacked into a (len(vs), n) tensor."""
    return torch.stack([v[sl].to(dev) if v is not None else torch.zeros(sl.stop - sl.start, device=dev)
                        for v in vs])


class _History:
    """One lazy layer's state in a chunk: the clients' inputs ``a`` (C, L, in) and output gradients
    ``g`` (C, L, out), rows ``s*B:(s+1)*B`` for step s (zero until written; padded rows have
    g = 0); the constant ``terms`` of its weight, each a list of ``(matrix (out, in), clients)``
    groups (the clients sharing that matrix, ascending) and a function of the step giving the
    clients' factors (None: 1); at the current step, ``coef`` (one (C,) tensor or None per term)
    and ``decay`` (C, s*B), the factor ``rho^(s-1-j)`` of each history row (None: 1)."""

    def __init__(self, C: int, L: int, n_in: int, n_out: int, lr: float, device):
        self.a = torch.zeros(C, L, n_in, device=device)
        self.g = torch.zeros(C, L, n_out, device=device)
        self.lr, self.device = lr, device
        self.terms, self.coef, self.decay = [], [], None

    def add_term(self, mats: list, keys: list, coef) -> None:
        """A constant term: client c's matrix ``mats[c]`` (None: none), clients with the same
        ``keys[c]`` sharing it; ``coef(s)``: the clients' factors at step s (None: 1)."""
        groups: dict = {}
        for c, (m, k) in enumerate(zip(mats, keys)):
            if m is not None:
                groups.setdefault(k, (m, []))[1].append(c)
        self.terms.append(([(m, cs, torch.tensor(cs, device=self.device)) for m, cs in groups.values()],
                           coef))

    def step(self, s: int, B: int, rho: torch.Tensor | None) -> None:
        self.coef = [coef(s) for _, coef in self.terms]
        if rho is not None and s:
            self.decay = (rho[:, None] ** torch.arange(s - 1, -1, -1, device=rho.device,
                                                       dtype=rho.dtype)).repeat_interleave(B, 1)

    def const(self, x: torch.Tensor, back: bool) -> torch.Tensor:
        """``x`` (n, B, k) times the first n clients' constant part of the weight: ``x W^T``
        (forward) or ``x W`` (backward): one GEMM over all the rows of the clients sharing a matrix."""
        n, B, _ = x.shape
        y = None
        for (groups, _), coef in zip(self.terms, self.coef):
            for m, cs, idx in groups:
                k = bisect.bisect_left(cs, n)                  # the group's clients among the first n
                if not k:
                    continue
                m = m if back else m.T
                if k == n:
                    part = (x.reshape(n * B, -1) @ m).view(n, B, -1)
                    part = part if coef is None else part.mul_(coef[:n, None, None])
                    y = part if y is None else y.add_(part)
                    continue
                part = x[idx[:k]] @ m
                if coef is not None:
                    part.mul_(coef[idx[:k], None, None])
                y = (x.new_zeros(n, B, m.shape[1]) if y is None else y).index_add_(0, idx[:k], part)
        return y

    def lowrank(self, x: torch.Tensor, s: int, back: bool) -> torch.Tensor | None:
        """``(x A^T decay) G`` (forward) or ``(x G^T decay) A`` (backward) over the first s steps'
        rows of the first n clients; None at step 0."""
        if not s:
            return None
        n, B, _ = x.shape
        a, g = self.a[:n, :s * B], self.g[:n, :s * B]
        t = torch.bmm(x, (a if not back else g).transpose(1, 2))
        if self.decay is not None:
            t.mul_(self.decay[:n, None])
        return t, (g if not back else a)

    def final(self, c: int, steps: int, B: int, rho, out: torch.Tensor) -> None:
        """Client c's weight after ``steps`` steps, written into ``out`` (out, in)."""
        first = True
        for (groups, coef) in self.terms:
            f = coef(steps)
            f = 1.0 if f is None else f[c]
            for m, cs, _ in groups:
                if c in cs:
                    if first:                                  # one pass over ``out`` per term
                        torch.mul(m, f, out=out)
                    else:
                        out.addcmul_(m, f if torch.is_tensor(f) else torch.tensor(f))
                    first = False
        L = steps * B
        g = self.g[c, :L]
        if rho is not None and steps:
            g = g * (rho ** torch.arange(steps - 1, -1, -1, device=g.device, dtype=g.dtype)
                     ).repeat_interleave(B)[:, None]
        out.addmm_(g.T, self.a[c, :L], alpha=-self.lr)


class LowRankLinear(torch.autograd.Function):
    """A linear layer at step s of local SGD, with its weight kept as ``W_s = (constant terms) -
    lr * G^T diag(decay) A`` (:class:`_History`: A, G are the client's earlier inputs and output
    gradients, ``hist.a[:, :s*B]``, ``hist.g[:, :s*B]``) and never materialised:

    * forward: ``y = x W_const^T - lr * (x A^T decay) G + b``; x is appended to A;
    * backward: ``dL/dx = g W_const - lr * (g G^T decay) A``, ``dL/db = sum of g``; g is appended
      to G (no weight gradient).

    ``x``: (n, B, in) for the n clients training at step s; ``b``: (n, out), the clients' current
    biases (trained as usual: it always requires grad, so the backward runs even for a first
    layer)."""

    @staticmethod
    def forward(ctx, x, b, hist, s):
        n, B, _ = x.shape
        y = hist.const(x, back=False)
        low = hist.lowrank(x, s, back=False)
        if low is not None:
            y.baddbmm_(*low, alpha=-hist.lr)
        hist.a[:n, s * B:(s + 1) * B] = x
        ctx.hist, ctx.s = hist, s
        return y.add_(b[:, None])

    @staticmethod
    def backward(ctx, gy):
        hist, s = ctx.hist, ctx.s
        n, B, _ = gy.shape
        hist.g[:n, s * B:(s + 1) * B] = gy
        gb = gy.sum(1) if ctx.needs_input_grad[1] else None
        if not ctx.needs_input_grad[0]:
            return None, gb, None, None
        gx = hist.const(gy, back=True)
        low = hist.lowrank(gy, s, back=True)
        if low is not None:
            gx.baddbmm_(*low, alpha=-hist.lr)
        return gx, gb, None, None
