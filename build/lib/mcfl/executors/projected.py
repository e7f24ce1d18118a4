"""Projections trained as implicit low-rank updates (the ``batched`` executor's path for a custom
loss whose model computes small per-client parameter blocks through large shared-shape matrices:
FedCG's GCN, ``theta^ = sigma(A X W)``, Eq. 5 of Caldarola et al., CVPR-W 2021).

On FedCG's digits CNN the GCN's projection W (two d x d/64 matrices through a bottleneck, d =
4,640) is 0.68M of the model's 0.72M parameters, yet at each step it multiplies only the K rows of
``A X``. Stacked, every client step reads its own W twice, writes its gradient (two outer products
over the K domains), takes its norm and updates it. With plain local SGD a projection matrix is
updated like a Linear layer applied to K "samples" (the rows of its input): after s steps
``W_s = W0 - lr sum_{j<s} c_j U_j^T dV_j`` (U_j: the K rows it multiplied at step j, dV_j: the loss
gradient w.r.t. its output, c_j: that step's clipping factor). So the matrices are kept as that
history and never materialised (:class:`~mcfl.executors.lowrank.LowRankLinear` with K rows per
step): each step is one product with the shared W0 for all the chunk's clients plus corrections
over the history; at the end ``W = W0 - lr G^T A``, one GEMM per client and matrix. Gradient
clipping needs each step's full gradient norm: a projection's gradient ``U^T dV`` has
``||U^T dV||^2 = sum((U U^T) * (dV dV^T))``, two K x K Gram matrices, and the step's factor c is
folded into the stored dV rows.

A model offers this with ``projected_layers()``: ``(name, layer)`` pairs whose ``layer`` has
``theta`` (K, d), the matrices ``weights`` (a ParameterList of (in, out) matrices, applied as
``h @ W``), ``gcn(x, project)`` computing theta^ from stacked ``x`` (n, K, d) with
``project(j, h)`` standing for ``h @ weights[j]``, and ``given``, the theta^ its forward uses when
set (:class:`mcfl.models.fedcg.DomainLayer`). The path applies to a batchable custom loss, when
no task has a proximal or linear term, when the stacked path is the fallback and while the
longest client's history (steps x K rows of each matrix's inputs and output gradients) holds at
most ``PROJECTED`` times the matrices' entries: the corrections read the history four times a
step, the stacked path its matrices about ten times (FedCG(3) on digits_domains with 2, 4, 8, 16
local epochs, history 0.6, 1.2, 2.3, 4.7 times the entries: 1.6x, 1.5x, 1.4x, 1.0x the stacked
path's speed). ``lowrank=0`` turns it off (the stacked path, as before). Frozen parameters equal
in every task of a chunk (FedCG's teacher) are not stacked: their layers run once on all the
chunk's rows.
"""

from __future__ import annotations

import torch
from torch.func import functional_call, vmap

from mcfl.engine import LocalResult, Task, clip_coef, sgd_step_
from mcfl.executors.lowrank import LowRankLinear, _History
from mcfl.executors.stack import stack_parts

#: the projected path applies while the longest client's history (steps x K rows of every
#: projection matrix's input and output gradient) has at most this many times the matrices' entries
PROJECTED = 3.0


class ProjectedPath:
    """The projected path of :class:`~mcfl.executors.batched.BatchedTrainer` (a mixin: it uses the
    trainer's model, data, spec and stacked-path helpers)."""

    def _init_projected(self) -> None:
        """The model's projected layers (none where the model has no ``projected_layers``) and a
        vmapped custom loss that takes their theta^ as an input."""
        find = getattr(self.model.module, "projected_layers", None)
        self._projected = list(find()) if callable(find) and not self._unsupported else []
        layers = [m for _, m in self._projected]

        def call(p, given, x, y, r, m):
            for layer, g in zip(layers, given):
                layer.given = g
            try:
                return functional_call(self._wrap, p, (x, y, r, m))
            finally:
                for layer in layers:
                    layer.given = None

        self._custom_given = vmap(call)
        self._projected_buffers: dict = {}

    def _buffer(self, key: str, C: int, L: int, n_in: int, n_out: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uninitialised history buffers ``a`` (C, L, n_in) and ``g`` (C, L, n_out) for matrix
        ``key``, kept between chunks (allocating and first touching them anew cost as much as
        a tenth of a round). Only rows written at a step are read: a client training at step s
        trained at every step before it."""
        bufs = self._projected_buffers
        a, g = bufs.get(key, (None, None))
        if a is None or a.shape[0] < C or a.shape[1] < L:
            dev = self.data.device
            a = torch.empty(max(C, 0 if a is None else a.shape[0]), max(L, 0 if a is None else a.shape[1]),
                            n_in, device=dev)
            g = torch.empty(a.shape[0], a.shape[1], n_out, device=dev)
            bufs[key] = a, g
        return a[:C, :L], g[:C, :L]

    def _projected_applies(self, tasks: list[Task], steps: int) -> bool:
        """Whether ``tasks`` (their longest client: ``steps`` steps) train on the projected path."""
        if not self._projected or self.lowrank <= 0 or self.fallback != "stacked":
            return False
        if any(t.mu or t.linear is not None for t in tasks) or not getattr(tasks[0].loss, "batchable", False):
            return False
        mats = [(layer.K, w.shape) for _, layer in self._projected for w in layer.weights]
        history = sum(steps * K * (n_in + n_out) for K, (n_in, n_out) in mats)
        return history <= PROJECTED * sum(n_in * n_out for _, (n_in, n_out) in mats)

    def _train_chunk_projected(self, tasks, rnd, rows, mask, steps, active) -> list[LocalResult]:
        """The chunk on the stacked path, except that the projection matrices are never
        materialised per client (module docstring)."""
        spec, dev, P, lr = self.spec, self.data.device, self.model.n_params, self.spec.lr
        C, shape, sl = len(tasks), self.data.x["train"].shape[1:], self.model.slices
        self.model.module.train()
        self.model.flat[P:].copy_(tasks[0].start[P:])       # constant buffers (the adjacency)
        starts = [t.start.to(dev) for t in tasks]
        S = len(rows)
        lazy, hists = set(), []                              # per layer: its matrices' histories
        for name, layer in self._projected:
            hs = []
            for j, wj in enumerate(layer.weights):
                key = f"{name}.weights.{j}"
                lazy.add(key)
                n_in, n_out = wj.shape
                view = lambda v, key=key, n_in=n_in, n_out=n_out: v[sl[key]].view(n_in, n_out)  # noqa: E731
                h = _History.__new__(_History)                # its buffers reused across chunks
                h.a, h.g = self._buffer(key, C, S * layer.K, n_in, n_out)
                h.lr, h.device, h.terms, h.coef, h.decay = lr, dev, [], [], None
                h.add_term([view(w).T for w in starts], [t.start.data_ptr() for t in tasks], lambda s: None)
                hs.append((key, view, h))
            hists.append(hs)
        flat_h = [h for hs in hists for h in hs]
        stacked = {n: stack_parts(starts, sl[n], dev).view(C, *s)
                   for n, s in zip(self._names, self._shapes) if n not in lazy}
        live = [n for n, t in zip(self._names, self._trainable) if t and n in stacked]
        thetas = [f"{name}.theta" for name, _ in self._projected]
        # frozen parameters equal in every task (FedCG's teacher): the module's own, unstacked,
        # so their layers run once on all the chunk's rows instead of one group per client
        shared = [n for n, t in zip(self._names, self._trainable) if not t and n not in lazy
                  and all(torch.equal(w[sl[n]], starts[0][sl[n]]) for w in starts[1:])]
        for n in shared:
            self.model.flat[sl[n]].copy_(starts[0][sl[n]])
        unstacked = set(thetas) | set(shared)
        loss_fn = tasks[0].loss
        self._wrap.fn = loss_fn
        loss_sum, aux_sum = torch.zeros(C, device=dev), None
        B = self.spec.batch_size
        for s, n in enumerate(active):
            r = rows[s, :n]
            for *_, h in flat_h:
                h.step(s, 0, None)
            leaves = {k: v[:n].detach().requires_grad_(k in live) for k, v in stacked.items()}
            given = []
            for (name, layer), hs in zip(self._projected, hists):
                zero = [torch.zeros(n, h.g.shape[2], device=dev, requires_grad=True) for *_, h in hs]
                project = lambda j, x, hs=hs, zero=zero: LowRankLinear.apply(x, zero[j], hs[j][2], s)  # noqa: E731
                given.append(layer.gcn(leaves[f"{name}.theta"], project))
            x = self.data.inputs(r.reshape(-1)).view(n, B, *shape)
            params = {f"net.{k}": v for k, v in leaves.items() if k not in unstacked}
            loss = self._custom_given(params, given, x, self.data.y["train"][r], r, mask[s, :n])
            aux = None
            if isinstance(loss, tuple):
                loss, aux = loss[0], loss[1].detach()
            grads = list(torch.autograd.grad(loss.sum(), [leaves[k] for k in live], allow_unused=True,
                                             materialize_grads=True))
            if spec.max_grad_norm is not None:               # each client's full gradient norm
                sq = torch.stack([g.reshape(n, -1).pow(2).sum(1) for g in grads]).sum(0)
                for (name, layer), hs in zip(self._projected, hists):
                    K = layer.K
                    for *_, h in hs:
                        a, g = h.a[:n, s * K:(s + 1) * K], h.g[:n, s * K:(s + 1) * K]
                        sq += (a @ a.transpose(1, 2) * (g @ g.transpose(1, 2))).sum((1, 2))
                coef = clip_coef(sq.sqrt(), spec.max_grad_norm)
                for g in grads:
                    g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
                for (name, layer), hs in zip(self._projected, hists):
                    for *_, h in hs:
                        h.g[:n, s * layer.K:(s + 1) * layer.K] *= coef.view(-1, 1, 1)
            sgd_step_([stacked[k][:n] for k in live], grads, lr)
            loss_sum[:n] += loss.detach()
            if aux is not None:
                aux_sum = aux.new_zeros(C, aux.shape[1]) if aux_sum is None else aux_sum
                aux_sum[:n] += aux
        weights = []
        with torch.no_grad():
            for c in range(C):
                w = torch.empty(self.model.size, device=dev)
                for name, v in stacked.items():
                    w[sl[name]].copy_(v[c].reshape(-1))
                for (name, layer), hs in zip(self._projected, hists):
                    for key, view, h in hs:                 # W0 - lr A^T G (clipped G), one GEMM
                        L = int(steps[c]) * layer.K
                        torch.addmm(view(starts[c]), h.a[c, :L].T, h.g[c, :L], alpha=-lr, out=view(w))
                w[P:].copy_(starts[c][P:])
                weights.append(w)
        return self._results(tasks, rnd, weights, loss_sum, steps, aux_sum)
