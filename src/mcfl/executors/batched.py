"""The ``batched`` executor (:class:`BatchedTrainer`): a chunk of clients at once. Their weights are stacked into
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

Choice of path: a client that cannot take the low-rank path (its history is over the limit,
clipping, a model without a lazy layer, ``lowrank=0``) trains on the faster of the others on the
device (``fallback``): the stacked path on a GPU; on a CPU, the stacked path for small models (a
forward pass of at most ``STACKED_CPU_MACS`` multiply-adds per sample, counted over the Linear and
convolution layers: a step's cost there is per-operation overhead, which stacking pays once per
chunk; the 8x8 digits CNN, 92K, trains 3.6x faster stacked) and the sequential loop for the others
(the FEMNIST CNN, 11.5M with hidden 248: 1.3x faster sequential). A call with one such client
(FedGSP's chain of one group: one client at a time) takes the sequential loop on every device:
stacking one client adds ``vmap``'s cost and saves nothing (a digits CNN step 1.8x the plain
module's, ``studies/digits_cnn_forms.py``). Models whose training forward
writes to their buffers (BatchNorm running statistics: padded rows would enter the batch
statistics; found by one probe forward) or with random layers (dropout) always train
sequentially; other float buffers (FedCG's adjacency) are constants of the update, shared by a
chunk. The choice is logged once per run (logger ``mcfl``, INFO).

Custom losses (``Task.loss``): one marked ``batchable`` (FedCG's: classification, pseudo-label
and domain terms) takes ``mask=`` and is vmap-safe, so its tasks train on the fallback path above,
stacked on a GPU and for small models (on digits_domains' FedCG, 0.7M parameters of which 0.68M
are the GCN's projection: 1.5 s a round against 2.2-2.5 s sequential, one thread); a model with
large projection matrices (FedCG's GCN) keeps them as a low-rank history instead of stacking
them (:mod:`mcfl.executors.projected`, another 1.5-1.7x). A batchable loss with a ``layerwise``
form (FedMMD's: one loss shared by a round's clients, computed from the layers' outputs of the
stacked clients) trains like the plain cross-entropy, on the low-rank path where it applies.
Parameters the model marks ``requires_grad=False`` (FedFusion's frozen global extractor; its loss
is the plain one) get a zero gradient on every path and are never stepped on the low-rank path.
On the LEAF CNN (real writers, 16 a round, batch 5, one CPU thread) that made FedMMD's round 2.2x
and FedFusion's 1.7x faster than one client at a time (``studies/methods_round.py --batch 5``;
docs/performance.md). A custom loss may return diagnostics with its loss; both stacked and
sequential paths sum them over each client's steps (``LocalResult.aux``).

The stacked clients' convolutions (:class:`mcfl.models.conv.Conv2d` layers) take the form chosen
for this CPU at start-up (:mod:`mcfl.executors.forms`; ``conv_form``, recorded in ``metrics.json``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Iterable, Iterator

import torch
from torch import nn
from torch.func import functional_call, vmap

from mcfl.engine import (DeviceData, DivergenceError, FlatModel, LocalResult, LocalSpec,
                         LocalTrainer, Task, clip_coef, n_steps, sgd_step_)
from mcfl.executors.forms import choose_conv_form
from mcfl.executors.lowrank import LOWRANK, LowRankPath
from mcfl.executors.projected import ProjectedPath
from mcfl.executors.stack import LossCall, auto_chunk, client_ce, forward_macs, running_buffers, stack_parts
from mcfl.models.conv import conv_form, conv_layers

log = logging.getLogger("mcfl")

#: forward multiply-adds per sample up to which the stacked path is the CPU fallback (see above)
STACKED_CPU_MACS = 1_000_000
#: what the path-choice log lines add for a call with one such client (module docstring)
LONE = {"stacked": " (one client alone: the sequential loop)", "sequential": ""}


class BatchedTrainer(LowRankPath, ProjectedPath, LocalTrainer):
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
        running = not random and running_buffers(model, data)
        # dropout (per-client random masks) and buffers a training forward updates (BatchNorm
        # statistics: padded rows would enter them): neither batched path supports them, so such a
        # model trains sequentially. Other float buffers (FedCG's adjacency) are constants of the
        # local update: a chunk shares them (see _run_chunks)
        self._unsupported = ("dropout" if random else
                             "buffers that training updates (BatchNorm statistics)" if running else None)
        self._wrap = LossCall(model.module)
        self._custom = vmap(lambda p, x, y, r, m: functional_call(self._wrap, p, (x, y, r, m)))
        self.fallback = "sequential" if self._unsupported else fallback or self._faster_fallback(data)
        self._said: set[str] = set()
        # bf16: autocast does not reach into torch.func.vmap on every device (on a CPU a vmapped
        # Linear or convolution stays float32), so the stacked forwards get their parameters and
        # inputs cast to bfloat16 explicitly: the same products as autocast's, whatever the device
        self._half = torch.bfloat16 if spec.precision == "bf16" else None
        self.lowrank = float(lowrank)
        self._init_projected()
        params = list(model.module.named_parameters())
        self._names = [n for n, _ in params]
        self._trainable = [p.requires_grad for _, p in params]
        self._shapes = [p.shape for _, p in params]
        self._sizes = [p.numel() for _, p in params]
        self._forward = vmap(lambda p, x: functional_call(model.module, p, (x,)))
        # low-rank path: the children of an nn.Sequential, their own parameter names, a vmapped
        # forward for those with parameters, and which are candidate lazy Linear layers
        seq = isinstance(model.module, nn.Sequential)
        self._children = list(model.module) if seq else []
        self._local = [[n for n, _ in c.named_parameters()] for c in self._children]
        self._vmapped = [vmap(lambda p, x, c=c: functional_call(c, p, (x,))) for c in self._children]
        # the low-rank path writes parameters only: models with (constant) float buffers take the
        # stacked path, which carries them over from the start
        self._buffers = model.size > model.n_params
        self._lazy = (self._flat_linears(data) if lowrank > 0 and not self._unsupported and not self._buffers
                      else [])
        # the convolutions' form for the stacked clients (mcfl.executors.forms): chosen per CPU
        self.conv_form, self._form_why = (("grouped", "the model trains sequentially") if self._unsupported else
                                          choose_conv_form(model.module, tuple(data.x["train"].shape[1:]),
                                                           spec.batch_size, data.device))

    def _faster_fallback(self, data: DeviceData) -> str:
        """The faster of the stacked and the sequential path on this device (module docstring)."""
        if self.model.device.type != "cpu":
            return "stacked"
        sample = torch.zeros(1, *data.x["train"].shape[1:], device=data.device)
        return "stacked" if forward_macs(self.model.module, sample) <= STACKED_CPU_MACS else "sequential"


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
            with self.autocast():
                logits = self._forward(self._cast(params), self._cast(x))      # (n, B, classes)
                loss = client_ce(logits, y, mask)
        else:                                  # not under bf16: custom losses then train sequentially
            self._wrap.fn = loss_fn
            loss = self._custom({f"net.{n}": t for n, t in params.items()}, x, y, rows, mask)
            if isinstance(loss, tuple):
                loss, aux = loss[0], loss[1].detach()
        custom = loss_fn is not None      # may leave parameters out (FedCG's teacher): zero gradient
        grads = iter(torch.autograd.grad(loss.sum(), [v for v, t in zip(leaves, live) if t],
                                         allow_unused=custom, materialize_grads=custom))
        return [next(grads) if t else torch.zeros_like(v) for v, t in zip(leaves, live)], loss.detach(), aux

    def _cast(self, t):
        """``t`` (a tensor, or a dict of them) in bfloat16 under ``bf16``, else ``t`` itself (a
        floating-point input only: index tensors stay as they are)."""
        if self._half is None:
            return t
        if isinstance(t, dict):
            return {k: self._cast(v) for k, v in t.items()}
        return t.to(self._half) if t.is_floating_point() else t

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

    def run(self, tasks: Iterable[Task], rnd: int, purpose: int = 0,
            spec: LocalSpec | None = None) -> Iterator[tuple[Task, LocalResult]]:
        """As :meth:`LocalTrainer.run`. ``spec`` may differ from the trainer's in its number of
        epochs or steps only (evaluation's fine-tuning); the batches come from stream ``purpose``."""
        tasks = list(tasks)
        spec = self._plan_spec(spec)
        B = spec.batch_size
        steps = [n_steps(int(self.data.n_train[t.client]), spec) for t in tasks]
        batching = (purpose, spec)
        # a layerwise loss must be batchable too: a task the low-rank path cannot take goes stacked
        layerwise = all(t.loss is None or (getattr(t.loss, "batchable", False) and getattr(t.loss, "layerwise", None))
                        for t in tasks)
        if not layerwise:                   # a custom loss without a layerwise form: no low-rank path
            if all(getattr(t.loss, "batchable", False) for t in tasks) and not self._unsupported:
                if self._half is not None:    # its own tensors are not cast with the parameters
                    self._say("batched executor: a custom local loss trains on the sequential path under "
                              "precision bf16 (autocast does not reach into torch.func.vmap on every device)")
                    yield from super().run(tasks, rnd, *batching)
                    return
                projected = (" (its projection matrices as low-rank histories where mcfl.executors.PROJECTED "
                             "allows)" if self._projected and self.lowrank > 0 and self.fallback == "stacked" else "")
                self._say(f"batched executor: a custom local loss trains on the {self.fallback} path{projected}, "
                          f"the faster one for this model on {self.model.device.type}{LONE[self.fallback]}")
                if self.fallback == "stacked" and len(tasks) > 1:
                    yield from self._run_chunks(tasks, steps, rnd, False, batching)
                    return
            yield from super().run(tasks, rnd, *batching)
            return
        fast = [bool(self._lazy_layers([t], s * B)) for t, s in zip(tasks, steps)]
        slow = [t for t, f in zip(tasks, fast) if not f]
        if slow:
            said = (f"batched executor: clients whose local update cannot take the low-rank path "
                    f"({self._why_slow()}) train on the {self.fallback} path, the faster one for this "
                    f"model on {self.model.device.type}{LONE[self.fallback]}")
            self._say(f"{said} (first in round {rnd}: {len(slow)} of {len(tasks)} clients)", key=said)
            if self.fallback == "sequential" or len(slow) == 1:    # one client: stacking adds only cost
                yield from super().run(slow, rnd, *batching)
            else:
                yield from self._run_chunks(slow, [s for s, f in zip(steps, fast) if not f], rnd, False, batching)
        yield from self._run_chunks([t for t, f in zip(tasks, fast) if f],
                                    [s for s, f in zip(steps, fast) if f], rnd, True, batching)

    def _plan_spec(self, spec: LocalSpec | None) -> LocalSpec:
        """``spec`` (default: the trainer's), refused where it differs in more than what only the
        batch plan reads (epochs, steps): the chunk code trains with the trainer's own."""
        if spec is None:
            return self.spec
        if dataclasses.replace(spec, epochs=self.spec.epochs, steps=self.spec.steps) != self.spec:
            raise ValueError("the batched executor trains another spec's epochs or steps only; "
                             f"got {spec} for a trainer of {self.spec}")
        return spec

    def _run_chunks(self, tasks: list[Task], steps: list[int], rnd: int, lowrank: bool,
                    batching: tuple[int, LocalSpec | None] = (0, None)):
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
                if conv_layers(self.model.module):
                    self._say(f"batched executor: stacked convolutions in the {self.conv_form} form ({self._form_why})")
                with self.numerics(), conv_form(self.model.module, self.conv_form):
                    results = self._train_chunk(chunk, rnd, lowrank, batching)
                yield from zip(chunk, results)

    def _chunk_batches(self, tasks: list[Task], rnd: int, batching: tuple[int, LocalSpec | None] = (0, None)):
        """The chunk's batch plans (stream and spec ``batching``) as ``rows`` (steps, C, B) (padded
        rows: row 0, masked), ``mask``, each client's number of ``steps`` and ``active[s]`` = n_s,
        the clients training at step s."""
        plans = [self.plan(t.client, rnd, *batching) for t in tasks]
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

    def _train_chunk(self, tasks: list[Task], rnd: int, lowrank: bool = True,
                     batching: tuple[int, LocalSpec | None] = (0, None)) -> list[LocalResult]:
        """Train ``tasks`` (sorted by number of steps, longest first) together. At step s the
        clients still training are a prefix ``[:n_s]`` of the chunk, so each step works on views
        ``w[:n_s]`` (no work for finished clients); rows past the end of a short last batch are
        padding, masked out of the loss. Low-rank path when it applies (see :meth:`_lazy_layers`)."""
        if self._unsupported:
            raise ValueError(f"the batched executor cannot stack a model with {self._unsupported}")
        rows, mask, steps, active = self._chunk_batches(tasks, rnd, batching)
        lazy = self._lazy_layers(tasks, len(rows) * self.spec.batch_size) if lowrank else []
        if lazy:
            return self._train_chunk_lowrank(tasks, rnd, rows, mask, steps, active, lazy)
        if not lowrank and self._projected_applies(tasks, len(rows)):
            return self._train_chunk_projected(tasks, rnd, rows, mask, steps, active)
        spec, dev, P, B = self.spec, self.data.device, self.model.n_params, self.spec.batch_size
        self.model.module.train()
        if self._buffers:                  # constant buffers, shared by the chunk (_run_chunks)
            self.model.flat[P:].copy_(tasks[0].start[P:])
        w = stack_parts([t.start for t in tasks], slice(0, P), dev)                 # (C, P)
        loss_fn = tasks[0].loss
        mu, anchor, linear = self._terms(tasks)
        mu = torch.tensor(mu, device=dev)
        mus = [mu.view(-1, *[1] * len(s)) for s in self._shapes]
        anchor, linear = [stack_parts(v, slice(0, P), dev) if v else None for v in (anchor, linear)]
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
