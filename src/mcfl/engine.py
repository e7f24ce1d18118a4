"""The one local-update engine every algorithm calls.

A model's whole state (parameters, then floating-point buffers such as BatchNorm statistics) lives in
one flat float32 vector. :class:`FlatModel` re-points an ``nn.Module``'s parameters and buffers at
views of that vector and its gradient at views of one flat gradient vector, so loading a client's
starting weights is one ``copy_`` and an SGD step is one fused vector update, whatever the
architecture. Servers therefore work on plain vectors: averages, distances and clustering need no
knowledge of layers.

:class:`LocalTrainer` runs minibatch SGD on one client's pre-built tensors (no DataLoader), for
``local_epochs`` passes or ``local_steps`` steps (LEAF's batching: shuffle, consecutive batches, the
last one short), optionally with

* a proximal/distance term ``(mu/2)·||w - anchor||^2`` over the parameters: FeSEM's Eq. 7 with
  ``mu = lambda`` and the anchor the client's cluster centre; FedProx's term with the global model;
* a linear term ``<linear, w>``: FedDANE's gradient correction;
* a custom loss ``Task.loss(module, x, y, rows)`` replacing the cross-entropy of ``module(x)``
  (FedCG's joint objective: classification plus the student's pseudo-label loss). It may return
  ``(loss, aux)``: ``aux``, a 1-D tensor of per-step sums (diagnostics), is added up over the
  client's steps into ``LocalResult.aux``. A loss that sets ``batchable = True`` also takes
  ``mask=`` (a (B,) float, 1 on the real rows of a padded batch; its loss is then the mean over
  those rows and its ``aux`` counts them only) and is safe under ``torch.func.vmap``: the batched
  executor then trains it stacked like the plain cross-entropy. A batchable loss of an
  ``nn.Sequential`` model may also set ``layerwise(x, outs, y, mask)``: the same loss for n
  stacked clients, from their inputs ``x`` (n, B, ...) and the outputs ``outs[i]`` (n, B, ...) of
  the model's children (``outs[-1]``: the logits), returning the n clients' losses (no ``aux``);
  the batched executor then trains it on its low-rank path too (FedMMD's penalty).

Parameters a model marks ``requires_grad=False`` (FedFusion's frozen global extractor) get a zero
loss gradient on every executor (with no proximal or linear term, as FedFusion: no step).

Precision (``train.precision``, :mod:`mcfl.precision`): ``fp32`` runs the code above as it is;
``tf32`` wraps each local update in TF32 settings (NVIDIA GPUs only; fp32 elsewhere, with a warning);
``bf16`` runs each step's forward pass and loss under ``torch.autocast`` in bfloat16
(:meth:`LocalTrainer.autocast`; the backward follows the forward's dtypes), while the flat
parameters, gradients and SGD updates stay float32. Evaluation (:meth:`LocalTrainer.predict`)
computes in float32 whatever the setting.

Randomness: every (round, client) pair draws its batch order from its own generator, seeded from
``SeedSequence([seed, round, client])``, so a client's update does not depend on which other clients
ran, or in which order.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mcfl.errors import DivergenceError  # noqa: F401 (re-exported)
from mcfl.precision import PRECISIONS, autocast, bf16_supported, numerics
from mcfl.streams import derive_seed  # noqa: F401 (re-exported)
from mcfl.trainspec import DEFAULTS, TrainSpec

if TYPE_CHECKING:                      # annotations only: no import of the layer above
    from mcfl.data.store import FederatedData


log = logging.getLogger("mcfl")


def generator(*key: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(derive_seed(*key))
    return g


# --------------------------------------------------------------------------------- flat parameters
class FlatModel:
    """An ``nn.Module`` whose parameters and float buffers are views into one flat vector.

    Layout: ``flat[:n_params]`` holds the parameters (in ``named_parameters`` order), the rest the
    floating-point buffers. ``grad`` has ``n_params`` entries. ``slices[name]`` locates a tensor.
    """

    def __init__(self, module: nn.Module, device: torch.device | str = "cpu"):
        self.module = module.to(device)
        self.device = torch.device(device)
        params = list(self.module.named_parameters())
        buffers = [(n, b) for n, b in self.module.named_buffers() if b.is_floating_point()]
        self.n_params = sum(p.numel() for _, p in params)
        self.size = self.n_params + sum(b.numel() for _, b in buffers)
        self.flat = torch.zeros(self.size, device=self.device)
        self.grad = torch.zeros(self.n_params, device=self.device)
        self.slices: dict[str, slice] = {}
        offset = 0
        with torch.no_grad():
            for name, p in params:
                sl = slice(offset, offset + p.numel())
                self.flat[sl].copy_(p.reshape(-1))
                p.data = self.flat[sl].view_as(p)
                p.grad = self.grad[sl].view_as(p)
                self.slices[name] = sl
                offset = sl.stop
            for name, b in buffers:
                sl = slice(offset, offset + b.numel())
                self.flat[sl].copy_(b.reshape(-1))
                owner, attr = self._owner(name)
                owner._buffers[attr] = self.flat[sl].view_as(b)
                self.slices[name] = sl
                offset = sl.stop

    def _owner(self, name: str) -> tuple[nn.Module, str]:
        *path, attr = name.split(".")
        mod = self.module
        for part in path:
            mod = getattr(mod, part)
        return mod, attr

    def param_views(self, vec: torch.Tensor) -> list[torch.Tensor]:
        """Views of a flat vector's parameter part shaped like the parameters, in their order."""
        return [vec[self.slices[n]].view_as(p) for n, p in self.module.named_parameters()]

    def load(self, w: torch.Tensor) -> None:
        self.flat.copy_(w)

    def get(self) -> torch.Tensor:
        return self.flat.clone()

    def select(self, which: str) -> slice:
        """Which coordinates a distance uses: ``all`` parameters, or the ``last_layer``'s weight
        matrix only (the FeSEM authors' code: the output layer's kernel); ``head`` is that kernel
        and every parameter after it (its bias): the output layer, for methods that share the rest."""
        if which == "all":
            return slice(0, self.n_params)
        if which in ("last_layer", "head"):
            weights = [n for n, p in self.module.named_parameters() if p.dim() >= 2]
            kernel = self.slices[weights[-1]]
            return kernel if which == "last_layer" else slice(kernel.start, self.n_params)
        raise ValueError(f"unknown parameter selection {which!r}; use 'all', 'last_layer' or 'head'")


# ------------------------------------------------------------------------------------- device data
class DeviceData:
    """A store's arrays as tensors on the training device, in their stored dtype (uint8 stays uint8
    and is scaled per batch), with per-client offsets."""

    def __init__(self, data: FederatedData, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.scale = float(data.x_scale)
        self.n_classes = data.n_classes
        self.n_clients = data.n_clients
        self.x = {s: torch.from_numpy(np.array(getattr(data, f"x_{s}"))).to(device)
                  for s in ("train", "test")}
        self.y = {s: torch.from_numpy(np.array(getattr(data, f"y_{s}"))).to(device)
                  for s in ("train", "test")}
        self.offsets = {s: np.asarray(getattr(data, f"offsets_{s}")) for s in ("train", "test")}
        self.n_train = np.diff(self.offsets["train"])
        self.n_test = np.diff(self.offsets["test"])

    def inputs(self, rows: torch.Tensor, split: str = "train") -> torch.Tensor:
        x = self.x[split][rows]
        return x.float().mul_(self.scale) if x.dtype != torch.float32 or self.scale != 1 else x

    def client_rows(self, client: int, split: str = "train") -> torch.Tensor:
        a, b = self.offsets[split][client], self.offsets[split][client + 1]
        return torch.arange(int(a), int(b), device=self.device)


# ---------------------------------------------------------------------------------- local training
def clip_coef(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Gradient clipping's factor, ``torch.nn.utils.clip_grad_norm_``'s rule:
    min(1, max_norm / (||g|| + 1e-6)); exactly 1 when ||g|| is within the bound."""
    return (max_norm / (norm + 1e-6)).clamp(max=1.0)


def clip_(g: list[torch.Tensor], max_norm: float) -> None:
    """Rescale the gradient ``g`` (one tensor per parameter) in place to L2 norm at most ``max_norm``."""
    torch._foreach_mul_(g, clip_coef(torch.nn.utils.get_total_norm(g), max_norm))


def sgd_step_(w: list[torch.Tensor], g: list[torch.Tensor], lr: float, mu=0.0,
              anchor: list[torch.Tensor] | None = None, linear: list[torch.Tensor] | None = None,
              clip: Callable[[list[torch.Tensor]], None] | None = None) -> None:
    """One local SGD step in place, on lists of tensors (one client's parameters, or the stacked
    parameters of several clients): ``g += mu (w - anchor)``; ``g += linear``; ``clip(g)`` (rescales
    in place); ``w -= lr g``. ``mu``: a float, or one tensor per ``w`` broadcasting against it (the
    stacked clients' own mu)."""
    with torch.no_grad():
        if anchor is not None:
            if isinstance(mu, (list, tuple)):
                torch._foreach_add_(g, torch._foreach_mul(torch._foreach_sub(w, anchor), mu))
            else:
                torch._foreach_add_(g, torch._foreach_sub(w, anchor), alpha=mu)
        if linear is not None:
            torch._foreach_add_(g, linear)
        if clip is not None:
            clip(g)
        torch._foreach_add_(w, g, alpha=-lr)


@dataclass(frozen=True)
class LocalSpec:
    """Hyperparameters of local SGD. Exactly one of ``epochs``/``steps`` is used (steps wins).
    ``max_grad_norm``: each step's gradient (proximal and linear terms included) is rescaled to at
    most this L2 norm, as ``torch.nn.utils.clip_grad_norm_`` does (None = no clipping)."""

    lr: float
    batch_size: int = DEFAULTS["batch_size"]
    epochs: int = DEFAULTS["local_epochs"]
    steps: int | None = None
    max_grad_norm: float | None = None
    precision: str = "fp32"

    @classmethod
    def of(cls, train: TrainSpec) -> LocalSpec:
        """The local update of a run's train settings."""
        return cls(lr=float(train.lr), batch_size=int(train.batch_size), epochs=int(train.local_epochs),
                   steps=train.local_steps, max_grad_norm=train.max_grad_norm,
                   precision=train.precision or "fp32")

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; use one of {', '.join(PRECISIONS)}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 (or None: no clipping), got {self.max_grad_norm}")


def n_steps(n: int, spec: LocalSpec) -> int:
    """Local SGD steps of a client with ``n`` training samples (0 if it has none)."""
    if n == 0:
        return 0
    return spec.steps if spec.steps is not None else spec.epochs * math.ceil(n / spec.batch_size)


def batch_plan(n: int, spec: LocalSpec, g: torch.Generator) -> torch.Tensor:
    """LEAF's ``batch_data`` for one local update, as a ``(steps, batch_size)`` int64 matrix of row
    indices in ``0..n-1``: each epoch shuffles the n rows (one ``randperm`` from ``g``) and cuts
    consecutive batches, the last one short (padded with -1); ``spec.steps`` steps, if set, run
    over as many epochs as needed. Both executors train from this plan, hence the same batches."""
    B, total = spec.batch_size, n_steps(n, spec)
    per_epoch = math.ceil(n / B)
    epochs = math.ceil(total / per_epoch) if total else 0
    out = torch.full((epochs, per_epoch * B), -1, dtype=torch.long)
    for e in range(epochs):
        out[e, :n] = torch.randperm(n, generator=g)
    return out.view(epochs * per_epoch, B)[:total]


@dataclass
class Task:
    """One client's local update: start from ``start``; optional proximal anchor/mu and linear term;
    optional ``loss(module, x, y, rows)`` -> scalar minibatch loss, or ``(loss, aux)`` (default:
    cross-entropy of ``module(x)``; ``rows`` are the batch's row indices into the training arrays;
    ``batchable`` losses and ``aux``: see the module docstring)."""

    client: int
    start: torch.Tensor
    anchor: torch.Tensor | None = None
    mu: float = 0.0
    linear: torch.Tensor | None = None
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None


@dataclass
class LocalResult:
    weights: torch.Tensor
    loss: float           # mean training loss over the local steps
    n_samples: int        # the client's training-set size (the FedAvg weight)
    steps: int
    aux: torch.Tensor | None = None   # a custom loss's diagnostics, summed over the steps


class LocalTrainer:
    """Sequential executor: trains the clients of ``run(tasks)`` one after the other."""

    def __init__(self, model: FlatModel, data: DeviceData, spec: LocalSpec, seed: int):
        self.model, self.data, self.spec, self.seed = model, data, spec, int(seed)
        dev = model.device
        if spec.precision == "bf16" and not bf16_supported(dev):
            raise ValueError(f"precision bf16: torch.autocast cannot run bfloat16 on {dev}"
                             + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "")
                             + "; use fp32 (or tf32 on an NVIDIA GPU)")
        if spec.precision == "tf32" and dev.type != "cuda":
            log.warning("precision tf32 on %s: TF32 is a mode of NVIDIA GPUs' tensor cores, so this run "
                        "computes in fp32 (the same numbers as fp32)", dev.type)

    # -- precision (mcfl.precision) -------------------------------------------------------------
    def autocast(self):
        """The context of a training step's forward pass and loss (bf16: autocast)."""
        return autocast(self.spec.precision, self.model.device)

    def numerics(self):
        """The context of whole training steps, forward and backward (tf32 on CUDA)."""
        return numerics(self.spec.precision, self.model.device)

    # -- batching -------------------------------------------------------------------------------
    def plan(self, client: int, rnd: int, purpose: int = 0, spec: LocalSpec | None = None) -> torch.Tensor:
        """The client's :func:`batch_plan` for this (round, purpose), as global row indices (-1 = pad)."""
        spec = spec or self.spec
        g = generator(self.seed, rnd, client, purpose)
        rows = batch_plan(int(self.data.n_train[client]), spec, g)
        return torch.where(rows >= 0, rows + int(self.data.offsets["train"][client]), rows)

    def batches(self, client: int, rnd: int, purpose: int = 0,
                spec: LocalSpec | None = None) -> Iterator[torch.Tensor]:
        """Row indices of each minibatch of one local update (LEAF's ``batch_data`` semantics)."""
        for rows in self.plan(client, rnd, purpose, spec):
            yield rows[rows >= 0].to(self.data.device)

    # -- one client -----------------------------------------------------------------------------
    def train(self, task: Task, rnd: int, purpose: int = 0, spec: LocalSpec | None = None) -> LocalResult:
        spec = spec or self.spec
        m = self.model
        m.load(task.start)
        m.module.train()
        # Per-tensor views of w, the anchor and the linear term; the gradient comes straight from
        # autograd (no zeroing and accumulating into a gradient buffer: for a 6.6M-parameter model
        # that is three extra passes over 26 MB per step), then one fused multi-tensor update.
        w = list(m.module.parameters())
        anchor = m.param_views(task.anchor) if task.mu else None
        linear = m.param_views(task.linear) if task.linear is not None else None
        clip = None if spec.max_grad_norm is None else (lambda g: clip_(g, spec.max_grad_norm))
        # a custom loss may leave parameters out of its graph; a model may freeze some (FedFusion's)
        partial = task.loss is not None or not all(p.requires_grad for p in w)
        loss_sum = torch.zeros((), device=m.device)
        aux_sum = None
        steps = 0
        with self.numerics():
            for rows in self.batches(task.client, rnd, purpose, spec):
                x, y = self.data.inputs(rows), self.data.y["train"][rows]
                with self.autocast():
                    loss = task.loss(m.module, x, y, rows) if task.loss else F.cross_entropy(m.module(x), y)
                if isinstance(loss, tuple):                        # a custom loss with diagnostics
                    loss, aux = loss
                    aux = aux.detach().float()                     # bf16: sum in float32
                    aux_sum = aux if aux_sum is None else aux_sum + aux
                g = self._local_grad(loss, w, custom=partial)
                sgd_step_(w, g, spec.lr, task.mu, anchor, linear, clip)
                loss_sum += loss.detach()
                steps += 1
        out = m.get()
        mean_loss = float(loss_sum) / max(steps, 1)
        # A sum is finite iff every entry is (or weights near 1e38/|W|: diverged anyway); one pass
        # over the weights instead of isfinite's four.
        if not math.isfinite(mean_loss) or not math.isfinite(float(out.sum())):
            raise DivergenceError.local(rnd, task.client, mean_loss)
        return LocalResult(out, mean_loss, int(self.data.n_train[task.client]), steps, aux_sum)

    @staticmethod
    def _local_grad(loss: torch.Tensor, w: list[torch.Tensor], custom: bool) -> list[torch.Tensor]:
        """d loss / d w. A custom loss (FedCG's) may leave parameters out of the graph, and a model
        may freeze some (``requires_grad=False``: FedFusion's global extractor): with ``custom``
        their gradient is zero, as a zeroed gradient buffer gives, so they take no step."""
        if not custom:
            return list(torch.autograd.grad(loss, w))
        live = [p for p in w if p.requires_grad]
        grads = iter(torch.autograd.grad(loss, live, allow_unused=True, materialize_grads=True))
        return [next(grads) if p.requires_grad else torch.zeros_like(p) for p in w]

    def run(self, tasks: Iterable[Task], rnd: int, purpose: int = 0,
            spec: LocalSpec | None = None) -> Iterator[tuple[Task, LocalResult]]:
        """Train each task in turn and yield it with its result, so a server can fold each local
        model into running sums and drop it: peak memory is one local model, not m of them.
        ``purpose`` and ``spec`` as for :meth:`train` (evaluation's fine-tuning: its own stream
        and number of epochs)."""
        for task in tasks:
            yield task, self.train(task, rnd, purpose, spec)

    # -- gradients and evaluation ---------------------------------------------------------------
    def gradient(self, w: torch.Tensor, client: int, rows: torch.Tensor | None = None,
                 chunk: int = 4096) -> tuple[torch.Tensor, float]:
        """Gradient of the client's mean training loss at ``w`` (all its rows, or ``rows``)."""
        m, P = self.model, self.model.n_params
        m.load(w)
        m.module.train()
        rows = self.data.client_rows(client) if rows is None else rows
        m.grad.zero_()
        total = 0.0
        with self.numerics():
            for i in range(0, len(rows), chunk):
                r = rows[i:i + chunk]
                with self.autocast():
                    loss = F.cross_entropy(m.module(self.data.inputs(r)), self.data.y["train"][r],
                                           reduction="sum") / len(rows)
                loss.backward()
                total += float(loss.detach())
        m.load(w)                      # BatchNorm statistics moved in train mode: restore them
        return m.grad[:P].clone(), total

    @torch.no_grad()
    def predict(self, w: torch.Tensor, rows: torch.Tensor, split: str = "test",
                chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
        """Predicted labels and per-sample losses of model ``w`` on ``rows`` of ``split``."""
        m = self.model
        m.load(w)
        m.module.eval()
        preds, losses = [], []
        for i in range(0, len(rows), chunk):
            r = rows[i:i + chunk]
            logits = m.module(self.data.inputs(r, split))
            preds.append(logits.argmax(1))
            losses.append(F.cross_entropy(logits, self.data.y[split][r], reduction="none"))
        if not preds:
            empty = torch.zeros(0, device=m.device)
            return empty.long(), empty
        return torch.cat(preds), torch.cat(losses)
