"""Low-rank dense layers (the ``batched`` executor's default where valid; ``lowrank=0`` turns it off):
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
"""

from __future__ import annotations

import bisect

import torch
from torch import nn

from mcfl.engine import DeviceData, LocalResult, Task, sgd_step_
from mcfl.executors.stack import client_ce, stack_parts

#: Low-rank dense layers: a Linear layer is trained lazily in a chunk when the longest client's
#: history (steps x batch rows) is at most this fraction of min(in_features, out_features).
LOWRANK = 0.5


class LowRankPath:
    """The low-rank path of :class:`~mcfl.executors.batched.BatchedTrainer` (a mixin: it uses the
    trainer's model, data, spec, children and stacked-path helpers)."""

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
        stack = lambda vs: {n: stack_parts(vs, sl[n], dev).view(C, *s)  # noqa: E731
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
            with self.autocast():             # bf16: the vmapped children get bf16 (BatchedTrainer._cast)
                for i, child in enumerate(self._children):
                    if i in hist:
                        x = LowRankLinear.apply(x, leaves[f"{i}.bias"], hist[i], s)
                    elif self._local[i]:
                        x = self._vmapped[i](self._cast({k: leaves[f"{i}.{k}"] for k in self._local[i]}),
                                             self._cast(x))
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
                m = (m if back else m.T).to(x.dtype)          # bf16: the GEMM in x's dtype
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
        a, g = self.a[:n, :s * B].to(x.dtype), self.g[:n, :s * B].to(x.dtype)
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
    layer).

    Under autocast (``bf16``) the products run in the autocast dtype, as ``nn.Linear``'s would:
    ``x``, ``b`` and the operands are cast to it, while the history and the final weights stay
    float32; the backward computes in its incoming gradient's dtype."""

    @staticmethod
    def forward(ctx, x, b, hist, s):
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            dt = torch.get_autocast_dtype(dev)
            with torch.autocast(dev, enabled=False):
                return LowRankLinear._forward(ctx, x.to(dt), b.to(dt), hist, s)
        return LowRankLinear._forward(ctx, x, b, hist, s)

    @staticmethod
    def _forward(ctx, x, b, hist, s):
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
