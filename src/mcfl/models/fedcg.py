"""FedCG's network (Caldarola et al., "Cluster-driven Graph Federated Learning over Multiple Domains",
CVPR-W 2021, arXiv:2104.14628, §3.1-3.3): a backbone whose chosen layers get domain-specific residual
parameters (Eq. 4), connected across domains by a GCN (Eqs. 5-6), plus the teacher and student
domain classifiers (§3.1, §4.1 "Implementation details").

The converted paper text lost its symbols; the equations below are reconstructed from the
surrounding sentences. [GUESS] marks what the text does not determine.

Eq. 4 (residual domain-specific layer l; f_l is the layer's operation, conv or linear)::

    h_l = f_l(h_{l-1}; theta_a^l) + alpha_l * sum_k w_k(x) f_l(h_{l-1}; theta^_k^l)

  theta_a^l domain-agnostic (the plain network's layer), theta^_k^l domain k's parameters after the
  GCN (Eq. 5; the raw theta_k^l without GCN), alpha_l a learnable scalar per layer initialised to 0
  (first author's GLDv2 prototype; the paper only says "learnable"). w(x) is one-hot on the
  teacher's pseudo-label in training and the student's probabilities at test. The residual is added
  to the layer's linear output, before its normalisation/non-linearity [GUESS: "residual
  activations"]. Without the domain-agnostic part (the "GCN" and "domain-specific models" rows of
  Table 3): h_l = sum_k w_k(x) f_l(h_{l-1}; theta^_k^l).

Eq. 5 (GCN over the K domain nodes of layer l; X^l in R^{K x d} stacks the flattened theta_k^l)::

    X^^l = sigma(A^l X^l W^l)

  sigma = ReLU (switchable, Table 3), W^l in R^{d x d} ("we set d' = d"), initialised to the
  identity [GUESS]. "In case d is large, we implement W as a multi-layer bottleneck": with
  ``bottleneck`` r > 1, W = P Q with P in R^{d x ceil(d/r)}, Q in R^{ceil(d/r) x d}, initialised
  as a random orthonormal basis and its transpose, scaled to keep norms (a projection) [GUESS]. ``gcn_layers`` = 2 (the
  FEMNIST setting) stacks two propagations with a ReLU between them:
  sigma(A relu(A X W_1) W_2), W_1: d -> d/r, W_2: d/r -> d [GUESS: the text says only "2-layers
  GCN ... bottleneck dividing the features by a factor"]. No W: X^^ = sigma(A X) (Table 3).

Eq. 6 (adjacency from the parameters, computed by the server and sent with them)::

    s_ij = 1 / ||theta_i^l - theta_j^l||_2            (i != j)
    A_ij = lambda * [i = j] + (1 - lambda) * [i != j] * s_ij / sum_{k != i} s_ik

  "normalised inverse pairwise distances" with "lambda weighing the impact of the self-connection,
  which we set to (lost)" [GUESS: lambda = 0.75, this normalisation, Euclidean distance]. Each row of
  A sums to 1; s is symmetric, A is symmetric when the rows' normalisers are equal (K = 2, or the
  uniform and Hamming graphs of equidistant codes). The same rule builds the uniform graph (U:
  s_ij = 1) and the Hamming graph of Table 3 (H: s_ij = 1 / Hamming(code_i, code_j)).

  Why lambda = 0.75: A scales the differences between domains. With equal similarities they shrink
  by (K lambda - 1) / (K - 1), which is 0 at lambda = 1/K: then every domain gets the same
  parameters. With K = 2, A is [[lambda, 1 - lambda], [1 - lambda, lambda]] whatever the distances,
  so the guess lambda = 0.5 (this package before 2026-11) erased all domain information after the
  first distance update (tests/algorithms/test_fedcg.py, two domains with conflicting labels: 52% with it, as
  FedAvg, against 99% with 0.75 or without the GCN). Any lambda > 0.5 makes A strictly diagonally
  dominant, hence invertible for every K and every similarity (Gershgorin: every eigenvalue's real
  part is at least 2 lambda - 1, 0.5 at 0.75); with equal similarities 0.75 keeps 0.5 of a
  difference at K = 2, 0.62 at K = 3, 0.67 at K = 4. ``FedCG`` refuses lambda = 1/K where A is
  then singular for sure (K = 2, or the uniform graph).

Domain classifiers: "two convolutional layers of (lost) and (lost) features and kernel size (lost),
followed by an average pooling and a linear layer" -> conv(C, w) ReLU conv(w, 2w) ReLU global-avg-pool
linear(2w, K) [GUESS: w = 32, kernel 5, the ReLUs, global pooling].
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

#: a W with more entries than this is refused (use a bottleneck): 1e8 floats = 400 MB per copy
MAX_PROJECTION = 100_000_000
#: hard assignment with at most this many domains: one pass over all K domains' kernels, mixed with
#: one-hot weights (K times the layer's FLOPs, but one fixed-shape call; on digits_domains' tiny
#: convolutions 1.9x faster training than a pass per domain on its varying subset of the batch)
ONE_PASS_MAX_K = 8


# ----------------------------------------------------------------------------- adjacency (Eq. 6)
def normalise_adjacency(s: torch.Tensor, self_weight: float) -> torch.Tensor:
    """Eq. 6: A_ij = lambda [i=j] + (1-lambda) [i!=j] s_ij / sum_{k!=i} s_ik (rows sum to 1)."""
    K = s.shape[0]
    if K == 1:
        return torch.ones(1, 1, dtype=s.dtype, device=s.device)
    off = s * (1 - torch.eye(K, dtype=s.dtype, device=s.device))
    rows = off.sum(1, keepdim=True)
    if (rows <= 0).any():
        raise ValueError("every domain needs a positive similarity to at least one other domain")
    return self_weight * torch.eye(K, dtype=s.dtype, device=s.device) + (1 - self_weight) * off / rows


def inverse_distances(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """s_ij = 1 / ||x_i - x_j||_2 between the rows of ``x`` (diagonal 0): Eq. 6's similarity."""
    d = torch.cdist(x.double().unsqueeze(0), x.double().unsqueeze(0)).squeeze(0)
    s = 1.0 / d.clamp_min(eps)
    return s.fill_diagonal_(0).to(x.dtype)


def distance_adjacency(x: torch.Tensor, self_weight: float) -> torch.Tensor:
    """Eq. 6 on the domain-specific parameters of one layer (rows of ``x``)."""
    return normalise_adjacency(inverse_distances(x), self_weight)


def uniform_adjacency(K: int, self_weight: float) -> torch.Tensor:
    """Table 3's "U": every other domain weighted equally."""
    return normalise_adjacency(torch.ones(K, K), self_weight)


def hamming_adjacency(K: int, self_weight: float) -> torch.Tensor:
    """Table 3's "H": normalised inverse Hamming distance between the domains' binary codes (the
    domain id's bits: for CelebA's oracle domains, the 5 binary attributes)."""
    ids = torch.arange(K)
    h = torch.zeros(K, K)
    for b in range(max(1, (K - 1).bit_length())):
        bit = (ids >> b) & 1
        h += (bit[:, None] != bit[None, :]).float()
    s = torch.where(h > 0, 1.0 / h.clamp_min(1), torch.zeros_like(h))
    return normalise_adjacency(s, self_weight)


def random_adjacency(K: int, self_weight: float, generator: torch.Generator) -> torch.Tensor:
    """Table 4's "rand" initialisation: random symmetric similarities, normalised like Eq. 6."""
    u = torch.rand(K, K, generator=generator)
    return normalise_adjacency((u + u.T) / 2, self_weight)


# ------------------------------------------------------------------------ domain-specific layer
class DomainLayer(nn.Module):
    """One Conv2d or Linear layer made domain-specific (Eq. 4) with its GCN (Eq. 5).

    ``assign`` must be set before a forward pass: an int64 (N,) domain per sample (hard) or a
    float (N, K) mixing weight per sample (soft). :class:`FedCGNet` does this.
    """

    def __init__(self, base: nn.Module, K: int, *, agnostic: bool = True, gcn: bool = True,
                 projection: bool = True, relu: bool = True, gcn_layers: int = 1, bottleneck: int = 1,
                 name: str = "layer"):
        super().__init__()
        if isinstance(base, nn.Conv2d):
            if base.groups != 1 or base.padding_mode != "zeros":
                raise ValueError(f"{name}: FedCG supports ungrouped, zero-padded convolutions only")
            self.op = "conv"
            self.conv_args = dict(stride=base.stride, padding=base.padding, dilation=base.dilation)
        elif isinstance(base, nn.Linear):
            self.op, self.conv_args = "linear", {}
        else:
            raise ValueError(f"{name}: only Conv2d and Linear layers can be domain-specific")
        self.K, self.agnostic, self.use_gcn, self.relu = int(K), agnostic, gcn, relu
        self.w_shape = tuple(base.weight.shape)
        self.has_bias = base.bias is not None
        self.fan_in = base.weight[0].numel()
        d = base.weight.numel() + (base.weight.shape[0] if self.has_bias else 0)
        self.d = d
        self.base = base if agnostic else None
        self.alpha = nn.Parameter(torch.zeros(())) if agnostic else None
        self.theta = nn.Parameter(torch.zeros(self.K, d))              # X^l: one row per domain
        self.register_buffer("adjacency", torch.eye(self.K))
        self.weights = nn.ParameterList()                                # the GCN's W (Eq. 5)
        if gcn and projection:
            h = d if bottleneck <= 1 else math.ceil(d / bottleneck)
            if bottleneck <= 1:
                dims = [(d, d)] * gcn_layers
            elif gcn_layers == 1:
                dims = [(d, h), (h, d)]                                  # W = P Q, no activation
            else:
                dims = [(d, h)] + [(h, h)] * (gcn_layers - 2) + [(h, d)]
            for a, b in dims:
                if a * b > MAX_PROJECTION:
                    raise ValueError(f"{name}: a {a}x{b} GCN projection ({a * b:,} parameters) is too "
                                     f"large; set a bottleneck factor (bottleneck > 1)")
                self.weights.append(nn.Parameter(torch.zeros(a, b)))
        self.gcn_layers = int(gcn_layers)
        self.bottleneck = int(bottleneck)
        self.assign: torch.Tensor | None = None
        #: theta^ computed by a trainer (for the duration of one forward pass), else None
        self.given: torch.Tensor | None = None
        self._cache: tuple | None = None

    @torch.no_grad()
    def reset_domain_parameters(self, generator: torch.Generator, alpha: float = 0.0,
                                zero_theta: bool = False) -> None:
        """theta_k: the layer's default initialisation, drawn independently per domain (U(-b, b),
        b = 1/sqrt(fan_in), as PyTorch's Conv2d/Linear), or 0 with ``zero_theta`` (the generator is
        drawn from either way, so the rest of the initialisation does not change); alpha (0 by
        default); A = I; W = I, or with a
        bottleneck a scaled projection P Q = sqrt(d/h) U U^T (U a random d x h orthonormal basis), so
        that W keeps the norm of a random parameter vector in expectation [GUESS]."""
        b = 1.0 / math.sqrt(self.fan_in)
        self.theta.copy_(torch.rand(self.theta.shape, generator=generator) * 2 * b - b)
        if zero_theta:
            self.theta.zero_()
        if self.alpha is not None:
            self.alpha.fill_(alpha)
        self.adjacency.copy_(torch.eye(self.K))
        if not len(self.weights):
            return
        if self.bottleneck <= 1:
            for w in self.weights:
                w.copy_(torch.eye(self.d))
            return
        h = self.weights[0].shape[1]
        u, _ = torch.linalg.qr(torch.randn(self.d, h, generator=generator))
        c = (self.d / h) ** 0.25            # P Q = sqrt(d/h) U U^T keeps a random row's norm
        for i, w in enumerate(self.weights):
            w.copy_(u * c if i == 0 else u.T * c if i == len(self.weights) - 1 else torch.eye(h))

    # -- Eq. 5 ----------------------------------------------------------------------------------
    def gcn(self, x: torch.Tensor, project=None) -> torch.Tensor:
        """X^ = sigma(A X W) (Eq. 5); with gcn_layers = L, L propagations with ReLU between them.
        ``x``: (K, d), or (n, K, d) for n stacked clients; ``project(j, h)``: h times the j-th
        matrix of W (default ``h @ self.weights[j]``; the batched executor passes its low-rank
        products, :mod:`mcfl.executors.projected`)."""
        if not self.use_gcn:
            return x
        a = self.adjacency
        project = project or (lambda j, h: h @ self.weights[j])
        if len(self.weights) and self.bottleneck > 1 and self.gcn_layers == 1:
            h = project(1, project(0, a @ x))
        else:
            h = x
            for j in range(self.gcn_layers):
                h = a @ h
                if len(self.weights):
                    h = project(j, h)
                if j < self.gcn_layers - 1:
                    h = torch.relu(h)
        return torch.relu(h) if self.relu else h

    def domain_parameters(self) -> torch.Tensor:
        """(K, d) GCN output theta^ (``given``, when a trainer computed it outside the module, as
        the batched executor's projected path does). Without autograd (inference) it is computed
        once and reused until any of its inputs changes (the paper's "precompute at inference")."""
        if self.given is not None:
            return self.given
        if torch.is_grad_enabled():
            return self.gcn(self.theta)
        key = (self.theta._version, self.adjacency._version, *(w._version for w in self.weights))
        if self._cache is None or self._cache[0] != key or self._cache[1].device != self.theta.device:
            self._cache = (key, self.gcn(self.theta))
        return self._cache[1]

    # -- Eq. 4 ----------------------------------------------------------------------------------
    def _layer_op(self, h: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """f_l(h; p) for one or several stacked parameter rows p (n, d): outputs concatenated along
        the channel/feature axis."""
        n, out = p.shape[0], self.w_shape[0]
        nw = p.shape[1] - (out if self.has_bias else 0)
        weight = p[:, :nw].reshape(n * out, *self.w_shape[1:])
        bias = p[:, nw:].reshape(n * out) if self.has_bias else None
        if self.op == "conv":
            return F.conv2d(h, weight, bias, **self.conv_args)
        return F.linear(h, weight, bias)

    def residual(self, h: torch.Tensor, assign: torch.Tensor) -> torch.Tensor:
        """sum_k w_k f(h; theta^_k): hard (int ids: one-hot weights when K <= ONE_PASS_MAX_K, else
        one pass per domain present) or soft (float (N, K) weights: all K outputs, mixed per sample)."""
        p = self.domain_parameters()
        if assign.dtype == torch.long and self.K <= ONE_PASS_MAX_K:
            assign = F.one_hot(assign, self.K).to(h.dtype)
        if assign.dtype == torch.long:
            out = None
            for k in torch.unique(assign).tolist():
                idx = torch.nonzero(assign == k).squeeze(1)
                r = self._layer_op(h[idx], p[k:k + 1])
                if out is None:
                    out = r.new_zeros((h.shape[0], *r.shape[1:]))
                out = out.index_copy(0, idx, r)
            return out if out is not None else self._layer_op(h, p[:1])
        r = self._layer_op(h, p)                                            # (N, K*C, ...)
        r = r.view(h.shape[0], self.K, self.w_shape[0], *r.shape[2:])
        w = assign.to(r.dtype).view(h.shape[0], self.K, *([1] * (r.dim() - 2)))
        return (w * r).sum(1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.assign is None:
            raise RuntimeError("DomainLayer called without a domain assignment (use FedCGNet)")
        res = self.residual(h, self.assign)
        return self.base(h) + self.alpha * res if self.agnostic else res


# ------------------------------------------------------------------------------- full network
def domain_classifier(in_channels: int, K: int, width: int = 32, kernel: int = 5) -> nn.Module:
    """§4.1: two conv layers, average pooling, a linear layer to K domains [GUESS: sizes]."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, kernel, padding=kernel // 2), nn.ReLU(),
        nn.Conv2d(width, 2 * width, kernel, padding=kernel // 2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, K),
    )


def select_layers(backbone: nn.Module, layers: str) -> list[str]:
    """Names of the layers made domain-specific: ``last`` = the last convolution (the paper's final
    choice, §4.2.2/§4.3), ``conv`` = every convolution (Table 4's "all"), ``all`` = every convolution
    and linear layer (separate domain-specific models, Table 3). Networks without convolutions use
    their linear layers for ``last``/``conv``."""
    convs = [n for n, m in backbone.named_modules() if isinstance(m, nn.Conv2d)]
    linears = [n for n, m in backbone.named_modules() if isinstance(m, nn.Linear)]
    pool = convs or linears
    if not pool:
        raise ValueError("the network has no Conv2d or Linear layer to make domain-specific")
    if layers == "last":
        return pool[-1:]
    if layers == "conv":
        return pool
    if layers == "all":
        return [n for n, m in backbone.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    raise ValueError(f"layers must be 'last', 'conv' or 'all', got {layers!r}")


class FedCGNet(nn.Module):
    """backbone (with DomainLayers) + teacher + student domain classifiers.

    The domain weights w(x) of Eq. 4 come from, in order: an explicit assignment set with
    :meth:`assigned` (pseudo-labels in training, oracle or k-means domains), else the teacher's
    argmax in train mode, else the student at test (``test_assignment``: ``soft`` probabilities,
    ``hard`` argmax, or ``teacher`` argmax; ``soft`` unless set for a block with :meth:`testing`).
    """

    def __init__(self, backbone: nn.Module, input_shape, K: int, *, layers: str = "last",
                 dc_width: int = 32, dc_kernel: int = 5, **layer_kw):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"FedCG's domain classifiers need image inputs (C, H, W); the data have "
                             f"shape {tuple(input_shape)}")
        self.K = int(K)
        self.backbone = backbone
        self.layer_names = select_layers(backbone, layers)
        for name in self.layer_names:
            *path, attr = name.split(".")
            parent = backbone
            for part in path:
                parent = getattr(parent, part)
            setattr(parent, attr, DomainLayer(getattr(parent, attr), K, name=name, **layer_kw))
        self.teacher = domain_classifier(input_shape[0], K, dc_width, dc_kernel)
        self.student = domain_classifier(input_shape[0], K, dc_width, dc_kernel)
        for p in self.teacher.parameters():
            p.requires_grad_(False)                  # fixed between updates from the student (§3.1)
        self.test_assignment = "soft"
        self._external: torch.Tensor | None = None

    def domain_layers(self) -> list[tuple[str, DomainLayer]]:
        return [(n, self.backbone.get_submodule(n)) for n in self.layer_names]

    def projected_layers(self) -> list[tuple[str, DomainLayer]]:
        """The domain layers whose GCN has a projection W, by their name in this module: the
        batched executor trains W as an implicit low-rank update (:mod:`mcfl.executors.projected`)."""
        return [(f"backbone.{n}", m) for n, m in self.domain_layers() if m.use_gcn and len(m.weights)]

    @torch.no_grad()
    def reset_extras(self, seed: int, alpha: float = 0.0, zero_theta: bool = False) -> None:
        """Initialise everything FedCG adds to the plain network (the backbone keeps its weights)."""
        g = torch.Generator().manual_seed(int(seed))
        for _, layer in self.domain_layers():
            layer.reset_domain_parameters(g, alpha, zero_theta)
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(int(seed) + 1)
            for m in list(self.teacher.modules()) + list(self.student.modules()):
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
        finally:
            torch.random.set_rng_state(state)

    @contextlib.contextmanager
    def testing(self, mode: str):
        """Use test assignment ``mode`` (``soft``, ``hard`` or ``teacher``) inside the block."""
        if mode not in ("soft", "hard", "teacher"):
            raise ValueError(f"unknown test assignment {mode!r}")
        old, self.test_assignment = self.test_assignment, mode
        try:
            yield self
        finally:
            self.test_assignment = old

    @contextlib.contextmanager
    def assigned(self, assign: torch.Tensor):
        """Use ``assign`` (int (N,) domains or float (N, K) weights) as w(x) inside the block."""
        old, self._external = self._external, assign
        try:
            yield self
        finally:
            self._external = old

    def assignment(self, x: torch.Tensor) -> torch.Tensor:
        if self._external is not None:
            return self._external
        if self.training or self.test_assignment == "teacher":
            with torch.no_grad():
                return self.teacher(x).argmax(1)
        p = torch.softmax(self.student(x), 1)
        if self.test_assignment == "soft":
            return p
        if self.test_assignment == "hard":
            return p.argmax(1)
        raise ValueError(f"unknown test assignment {self.test_assignment!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.assignment(x)
        layers = [m for _, m in self.domain_layers()]
        for m in layers:
            m.assign = a
        try:
            return self.backbone(x)
        finally:
            for m in layers:
                m.assign = None
