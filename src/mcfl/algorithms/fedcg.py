"""FedCG: Cluster-driven Graph Federated Learning (Caldarola, Mancini, Galasso, Ciccone, Rodolà,
Caputo, "Cluster-driven Graph Federated Learning over Multiple Domains", CVPR Workshops (L2ID) 2021,
arXiv:2104.14628; §3-4). No public code exists; the paper text is the spec. Its symbols were lost in
conversion; the equations are reconstructed here and in :mod:`mcfl.models.fedcg` (Eqs. 4-6), with
every guess marked [GUESS].

Model: the run's network theta_a (same initial weights as every other method) + per-domain residual
parameters on chosen layers, their GCN (Eqs. 4-5) + a teacher g_t and a student g_s domain
classifier; all in ONE flat vector, so the server averages it like FedAvg.

Reconstructed equations (Eqs. 4-6: :mod:`mcfl.models.fedcg`); S_r = the round's clients:

    Eq. 1  L(theta; D_i) = -1/|D_i| sum_{(x, y) in D_i} log f_theta(x)_y
    Eq. 2  theta = sum_{i in S_r} |D_i| theta_i / sum_{i in S_r} |D_i|
    Eq. 3  phi_s^i = argmin_phi -1/|D_i| sum_{x in D_i} log g_phi(x)_{y^(x)},
           y^(x) = argmax_k g_{phi_t}(x)_k;   phi_s = Eq. 2 over the phi_s^i;   phi_t <- phi_s every R

Round r, for the sampled clients i (training data D_i):

1. Local update, from the global vector (Eqs. 1, 3, 4). For a minibatch, the teacher's pseudo-label
   y^(x) = argmax_k g_t(x)_k (Eq. 3) is the hard domain of x (w(x) = onehot(y^(x)) in Eq. 4), and
   SGD minimises  CE(f(x; w(x)), y) + c * CE(g_s(x), y^(x)):  Eq. 1 for the classifier (including
   alpha, the domain-specific parameters and the GCN's W) and Eq. 3 for the student. The teacher is
   fixed (no gradient). c = ``domain_lr``/lr makes the student's SGD step use ``domain_lr`` (the
   student's parameters get gradient from its term only; SGD has no weight decay, as §4.1 asks)
   [GUESS: the two objectives are minimised in the same local pass].
2. Server (Eq. 2): FedAvg of the whole vector, weighted by training-set size ("we perform FedAvg on
   both domain-agnostic and domain-specific parameters in each training round"; the student:
   "updated after each round with standard FedAvg"). The teacher and the adjacency matrices, which
   no client changes, are copied from the previous state exactly (averaging n equal copies can move
   the last bit of a float).
3. Every R = ``teacher_every`` rounds the teacher takes the student's weights (§3.1).
4. Adjacency (Eq. 6, ``adjacency: distance``): the server recomputes each layer's A from the averaged
   domain-specific parameters after every round from round R on, and sends it with the weights;
   before that the initial A is used (``adjacency_init``: ``eye``, disconnected domains, or ``random``;
   Table 4) [GUESS: when A is first recomputed; the text: eye init "allows the model to refine the
   domain-specific components separately before merging them based on their distance"].
   ``uniform``/``hamming`` fix A (Table 3's U/H) for the whole run.

Our addition, ``calibrate_teacher`` (default on; off = the paper as written): whenever the teacher
is (re)set (at initialisation and at each step 3) its logits are standardised over all training
samples (per logit: subtract the mean, divide by the standard deviation; in FL each client would
send K sums and K sums of squares). A randomly initialised classifier's argmax is almost the same
for every input, so without it all samples get one pseudo-label, the student learns that constant
and the pair never leaves the collapse (observed on digits_domains: domain entropy 0 by round 10).
With it, the self-labelling converges to clusters aligned with the true domains (NMI ~0.5-0.65 with
the rotations of digits_domains).

Test (§3.2): w(x) = g_s(x), the student's probabilities (``test_assignment: soft``), so an unseen
domain is a mix of seen ones; ``hard`` uses the student's argmax; ``source`` the training-time source
(teacher argmax, the client's k-means cluster, the oracle domain). Evaluation rounds also report
``soft_acc``/``hard_acc`` (on stores with per-sample domains also ``*_acc_unseen``/``*_acc_seen``,
and ``soft_only_unseen``/``hard_only_unseen``: how many unseen-domain test images only soft / only
hard assignment classifies correctly, for a paired test), each layer's alpha and, with true domains,
``domain_nmi`` between the student's argmax and the true domain of the training samples.

Our addition, ``residual_init: zero`` (with ``alpha_init: 1`` and ``relu: false``): the domain
parameters start at 0 instead of the layer's random initialisation. Both choices start from the
plain network's function (alpha = 0 gates a random branch off; here the branch itself is 0), but
with alpha = 0 the gradient reaching theta_k is alpha times its signal, so the domain parameters
barely train while alpha stays small (observed on digits_domains: alpha ~ -0.1 after 20-60 rounds,
soft and hard test assignment giving the same accuracy to 3 digits); a zero branch behind alpha = 1
trains at the full learning rate from the first step (a zero-initialised residual branch). The paper
does not say how alpha or theta are initialised.

Ablations (Tables 3-4), all Params: ``agnostic: false`` drops theta_a and alpha (the "GCN" rows;
with ``gcn: false`` as well: "domain-specific models", best with ``layers: all``); ``gcn``,
``projection`` (W), ``relu``; ``adjacency`` distance/uniform/hamming; ``clustering``: ``classifier``
(teacher-student), ``kmeans`` (every client's data in its cluster, from k-means over the clients'
first local models of the plain network, as in :mod:`mcfl.cluster.init`) or ``oracle`` (the store's
per-sample domains, §4.2.1); ``adjacency_init`` eye/random; ``test_assignment`` soft/hard/source;
``layers`` last/conv/all.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.base import Algorithm, param_span
from mcfl.engine import FlatModel, Task, generator
from mcfl.executors import same_executor
from mcfl.metrics import domain_scores, paired_counts, per_client_scores, summarize
from mcfl.models.fedcg import (ONE_PASS_MAX_K, FedCGNet, distance_adjacency, hamming_adjacency, random_adjacency,
                               uniform_adjacency)
from mcfl.streams import FEDCG_ADJ, FEDCG_EXTRAS, derive_seed



@dataclass
class Params:
    K: int = 3
    clustering: str = "classifier"   # classifier (teacher-student, §3.1) | kmeans | oracle
    teacher_every: int = 5           # R: teacher <- student every R rounds [value lost; GUESS]
    domain_lr: float = 0.0           # student's SGD lr [value lost]; 0 = the run's lr
    layers: str = "last"             # last (last conv) | conv (all convs) | all (convs + linears)
    agnostic: bool = True            # residual on a domain-agnostic layer (Eq. 4) vs domain-specific only
    gcn: bool = True                 # connect the domains through the GCN (Eq. 5)
    projection: bool = True          # the GCN's W
    relu: bool = True                # sigma of Eq. 5
    gcn_layers: int = 1              # 1 (CelebA) or 2 (FEMNIST)
    bottleneck: int = 1              # W as d -> ceil(d/r) -> d when r > 1
    adjacency: str = "distance"      # distance (Eq. 6) | uniform (U) | hamming (H)
    adjacency_init: str = "eye"      # eye | random | uniform: A before the first distance update
    self_weight: float = 0.75        # lambda of Eq. 6 [value lost; GUESS: see models.fedcg]
    test_assignment: str = "soft"    # soft | hard | source
    dc_width: int = 32               # domain classifier conv features w, 2w [lost; GUESS]
    dc_kernel: int = 5               # domain classifier kernel size [lost; GUESS]
    restarts: int = 10               # k-means restarts (clustering: kmeans)
    calibrate_teacher: bool = True   # standardise the teacher's logits when (re)set (OUR ADDITION)
    alpha_init: float = 0.0          # initial alpha of Eq. 4 (first author's prototype: 0)
    residual_init: str = "uniform"   # theta_k at start: uniform (layer default) | zero (OUR ADDITION)

    def __post_init__(self):
        choices = {"clustering": ("classifier", "kmeans", "oracle"), "layers": ("last", "conv", "all"),
                   "adjacency": ("distance", "uniform", "hamming"),
                   "adjacency_init": ("eye", "random", "uniform"),
                   "test_assignment": ("soft", "hard", "source"), "residual_init": ("uniform", "zero")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} must be one of {', '.join(allowed)}; got {getattr(self, key)!r}")
        for key in ("K", "teacher_every", "gcn_layers", "bottleneck", "dc_width", "dc_kernel", "restarts"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.self_weight <= 1:
            raise ValueError(f"self_weight must be in [0, 1], got {self.self_weight}")
        if (self.gcn and self.K > 1 and math.isclose(self.K * self.self_weight, 1)
                and (self.K == 2 or self.adjacency == "uniform")):
            raise ValueError(f"self_weight = 1/K = {self.self_weight:g} makes the GCN's adjacency "
                             f"uniform, so every domain would get the same parameters; use > 0.5")
        if self.domain_lr < 0:
            raise ValueError(f"domain_lr must be >= 0, got {self.domain_lr}")
        if self.residual_init == "zero":
            if self.gcn and self.relu:
                raise ValueError("residual_init: zero needs relu: false (or gcn: false): the GCN's "
                                 "ReLU has zero gradient at 0, so the domain parameters would never move")
            if self.agnostic and self.alpha_init == 0:
                raise ValueError("residual_init: zero needs alpha_init != 0: with both at 0 neither "
                                 "alpha nor the domain parameters get a gradient")


@dataclass
class State:
    w: torch.Tensor               # the whole FedCG model, one flat vector
    client_cluster: torch.Tensor  # (m,) k-means cluster per client (clustering: kmeans), else -1


class _Objective:
    """FedCG's local loss for one round (:meth:`FedCG.local_loss` with the round's k-means clusters):
    vmap-safe for up to ``ONE_PASS_MAX_K`` domains, so the batched executor can stack it."""

    def __init__(self, fn, cluster: torch.Tensor, K: int):
        self.fn, self.cluster = fn, cluster
        self.batchable = K <= ONE_PASS_MAX_K        # more: one pass per domain present (not vmap-safe)

    def __call__(self, module, x, y, rows, mask=None):
        return self.fn(module, x, y, rows, cluster=self.cluster, mask=mask)


class FedCG(Algorithm):
    name = "FedCG"
    Params = Params
    State = State
    clustered = True

    def __init__(self, fed, params: Params):
        super().__init__(fed, params)
        p = params
        self.plain_fed = fed
        net = self.network(copy.deepcopy(fed.model.module), fed.data.x_shape, p)
        net.reset_extras(derive_seed(fed.seed, FEDCG_EXTRAS), alpha=p.alpha_init,
                         zero_theta=p.residual_init == "zero")
        flat = FlatModel(net, fed.device)
        trainer = same_executor(fed.trainer, flat, fed.dev)
        self.fed = dataclasses.replace(fed, model=flat, trainer=trainer, w0=flat.get())
        self.net, self.flat = net, flat
        self.c = p.domain_lr / trainer.spec.lr if p.domain_lr else 1.0
        self.teacher_sl, self.student_sl = param_span(flat, "teacher."), param_span(flat, "student.")
        self.layers = [(n, m, flat.slices[f"backbone.{n}.theta"], flat.slices[f"backbone.{n}.adjacency"])
                       for n, m in net.domain_layers()]
        self.domains = self._oracle_domains() if p.clustering == "oracle" else None
        self._row_client = {s: torch.from_numpy(np.repeat(np.arange(fed.n_clients), n)).to(fed.device)
                            for s, n in (("train", fed.dev.n_train), ("test", fed.dev.n_test))}

    @staticmethod
    def network(backbone, input_shape, p: Params) -> FedCGNet:
        """The plain ``backbone`` (modified in place) made FedCG's network for ``p``."""
        return FedCGNet(backbone, input_shape, p.K, layers=p.layers, dc_width=p.dc_width,
                        dc_kernel=p.dc_kernel, agnostic=p.agnostic, gcn=p.gcn,
                        projection=p.projection, relu=p.relu, gcn_layers=p.gcn_layers,
                        bottleneck=p.bottleneck)

    def _oracle_domains(self) -> dict[str, torch.Tensor]:
        d = self.fed.data
        if d.domain_train is None:
            raise ValueError("clustering: oracle needs a store with per-sample domains "
                             "(domain_train.npy / domain_test.npy)")
        train = np.asarray(d.domain_train)
        if train.max() >= self.p.K:
            raise ValueError(f"clustering: oracle: the training data have {train.max() + 1} domains, "
                             f"more than K={self.p.K}")
        return {s: torch.from_numpy(np.array(getattr(d, f"domain_{s}"))).to(self.fed.device)
                for s in ("train", "test")}

    # -- initial state ---------------------------------------------------------------------------
    def init(self) -> State:
        p, w = self.p, self.fed.w0.clone()
        for i, (_, m, _, adj) in enumerate(self.layers):
            if p.adjacency == "uniform" or (p.adjacency == "distance" and p.adjacency_init == "uniform"):
                a = uniform_adjacency(p.K, p.self_weight)
            elif p.adjacency == "hamming":
                a = hamming_adjacency(p.K, p.self_weight)
            elif p.adjacency_init == "random":
                a = random_adjacency(p.K, p.self_weight, generator(self.fed.seed, FEDCG_ADJ, i))
            else:
                a = torch.eye(p.K)
            w[adj] = a.reshape(-1).to(w)
        if p.clustering == "classifier" and p.calibrate_teacher:
            w = self._calibrated_teacher(w)
        cluster = torch.full((self.fed.n_clients,), -1, dtype=torch.long)
        if p.clustering == "kmeans":
            from mcfl.cluster.init import init_centres

            cluster = init_centres(self.plain_fed, p.K, restarts=p.restarts, distance="all").assign
        return State(w, cluster)

    @torch.no_grad()
    def _calibrated_teacher(self, w: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
        """Standardise the initial teacher's logits over all training samples: its last layer
        becomes (W z + b - mu) / sigma, with mu, sigma each logit's mean and standard deviation (in
        FL: K sums and K sums of squares per client). A randomly initialised classifier's argmax is
        almost constant (the mean pooled feature times W dominates), so without this every sample
        gets one pseudo-label and the teacher-student pair stays collapsed on one domain."""
        self.flat.load(w)
        self.net.eval()
        n = int(self.fed.dev.offsets["train"][-1])
        z = torch.cat([self.net.teacher(self.fed.dev.inputs(torch.arange(i, min(i + chunk, n),
                                                                       device=self.fed.device)))
                       for i in range(0, n, chunk)]).double()
        mu, sigma = z.mean(0), z.std(0).clamp_min(1e-8)
        last = self.net.teacher[-1]
        last.weight.copy_((last.weight.double() / sigma[:, None]).float())
        last.bias.copy_(((last.bias.double() - mu) / sigma).float())
        return self.flat.get()

    # -- one round -------------------------------------------------------------------------------
    def _targets(self, module: FedCGNet, x: torch.Tensor, rows: torch.Tensor,
                 cluster: torch.Tensor) -> torch.Tensor:
        """The training-time hard domain of each sample: teacher pseudo-label, k-means cluster of
        its client (``cluster``: the state's client_cluster), or oracle domain."""
        if self.p.clustering == "oracle":
            return self.domains["train"][rows]
        if self.p.clustering == "kmeans":
            return cluster[self._row_client["train"][rows]]
        with torch.no_grad():
            return module.teacher(x).argmax(1)

    def local_loss(self, module: FedCGNet, x, y, rows, *, cluster: torch.Tensor,
                   mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """CE(f(x; onehot(y^)), y) + c * CE(g_s(x), y^) (Eqs. 1, 3, 4 with hard assignment), and the
        round's diagnostics for this batch: [sum of CE_cls, sum of CE_dom, samples per domain].
        ``mask`` (the batched executor's padded batches): the means and sums over its real rows."""
        target = self._targets(module, x, rows, cluster)
        K = self.p.K
        with module.assigned(target):
            logits = module(x)
        if mask is None:                       # the sequential path: plain means
            cls = F.cross_entropy(logits, y)
            dom = F.cross_entropy(module.student(x), target)
            counts = torch.bincount(target, minlength=K)[:K].float()
            aux = torch.cat([(cls * len(y)).view(1), (dom * len(y)).view(1), counts])
        else:
            n = mask.sum().clamp(min=1)
            cls = (F.cross_entropy(logits, y, reduction="none") * mask).sum() / n
            dom = (F.cross_entropy(module.student(x), target, reduction="none") * mask).sum() / n
            counts = (F.one_hot(target, K).float() * mask[:, None]).sum(0)
            aux = torch.cat([(cls * n).view(1), (dom * n).view(1), counts])
        return cls + self.c * dom, aux.detach()

    def round(self, state: State, clients: np.ndarray, rnd: int):
        p = self.p
        stats = torch.zeros(2 + p.K, device=self.fed.device)
        loss = _Objective(self.local_loss, state.client_cluster.to(self.fed.device), p.K)
        acc = WeightedSum(1, state.w.numel(), state.w.device)
        losses = []
        tasks = (Task(int(c), state.w, loss=loss) for c in clients)
        for _, res in self.fed.trainer.run(tasks, rnd):                             # step 1
            acc.add(0, res.weights, res.n_samples)                                  # step 2 (Eq. 2)
            losses.append(res.loss)
            stats += res.aux
        w = acc.mean(0)
        w[self.teacher_sl] = state.w[self.teacher_sl]   # server-owned, unchanged by clients: keep them
        for *_, adj in self.layers:                     # exact (averaging n copies moves the last bit)
            w[adj] = state.w[adj]
        if p.clustering == "classifier" and rnd % p.teacher_every == 0:             # step 3
            w[self.teacher_sl] = w[self.student_sl]
            if p.calibrate_teacher:
                w = self._calibrated_teacher(w)
        if p.adjacency == "distance" and rnd >= p.teacher_every:                    # step 4 (Eq. 6)
            for _, m, theta, adj in self.layers:
                a = distance_adjacency(w[theta].view(p.K, -1), p.self_weight)
                w[adj] = a.reshape(-1)
        n = float(stats[2:].sum())
        share = (stats[2:] / max(n, 1)).cpu().numpy()
        ent = -(share[share > 0] * np.log(share[share > 0])).sum() / math.log(p.K) if p.K > 1 else 1.0
        diag = {"train_loss": float(np.mean(losses)), "cls_loss": float(stats[0]) / max(n, 1),
                "domain_loss": float(stats[1]) / max(n, 1), "domain_entropy": float(ent)}
        diag.update(self._alphas(w))
        return State(w, state.client_cluster), diag

    # -- evaluation ------------------------------------------------------------------------------
    def eval_models(self, state: State):
        yield state.w, np.arange(self.fed.n_clients)

    def _external(self, rows: torch.Tensor, mode: str, state: State) -> torch.Tensor | None:
        """The test-time assignment of ``rows`` when it does not come from the network itself."""
        if mode != "source" or self.p.clustering == "classifier":
            return None
        K = self.p.K
        if self.p.clustering == "kmeans":
            ids = state.client_cluster.to(rows.device)[self._row_client["test"][rows]]
        else:
            ids = self.domains["test"][rows]
        out = torch.full((len(rows), K), 1.0 / K, device=rows.device)   # unseen oracle domains: uniform
        known = ids < K
        out[known] = F.one_hot(ids[known], K).float()
        return out

    def _predict(self, w: torch.Tensor, rows: torch.Tensor, mode: str, state: State, chunk: int = 4096):
        self.net.test_assignment = {"source": "teacher"}.get(mode, mode)
        preds, losses = [], []
        for i in range(0, len(rows), chunk):
            r = rows[i:i + chunk]
            ext = self._external(r, mode, state)
            if ext is None:
                p, l = self.fed.trainer.predict(w, r, chunk=chunk)
            else:
                with self.net.assigned(ext):
                    p, l = self.fed.trainer.predict(w, r, chunk=chunk)
            preds.append(p)
            losses.append(l)
        self.net.test_assignment = "soft"
        return torch.cat(preds), torch.cat(losses)

    def predict(self, w, rows, state=None):
        return self._predict(w, rows, self.p.test_assignment, state)

    def extra_metrics(self, state: State) -> dict[str, float]:
        """Soft and hard test assignment side by side, alpha per layer, and clustering quality."""
        fed = self.fed
        rows = torch.arange(int(fed.dev.offsets["test"][-1]), device=fed.device)
        owner = self._row_client["test"].cpu().numpy()
        truth = fed.dev.y["test"].cpu().numpy()
        out, hit = {}, {}
        for mode in ("soft", "hard"):
            pred = self._predict(state.w, rows, mode, state)[0].cpu().numpy()
            s = summarize(per_client_scores(owner, truth, pred, fed.n_clients, fed.dev.n_classes))
            out[f"{mode}_acc"] = s["micro_acc"]
            hit[mode] = truth == pred
            if fed.data.domain_test is not None:
                d = domain_scores(np.asarray(fed.data.domain_test), hit[mode], fed.data.unseen_domains)
                out.update({f"{mode}_{k}": v for k, v in d.items() if k in ("acc_seen", "acc_unseen")})
        if "soft_acc_unseen" in out:    # the discordant unseen images, for a paired (sign) test
            new = np.isin(np.asarray(fed.data.domain_test), list(fed.data.unseen_domains))
            only = paired_counts(hit["soft"][new], hit["hard"][new])
            out["soft_only_unseen"], out["hard_only_unseen"] = map(float, only)
        if fed.data.domain_train is not None:
            from sklearn.metrics import normalized_mutual_info_score

            labels = self._student_labels(state.w)
            out["domain_nmi"] = float(normalized_mutual_info_score(np.asarray(fed.data.domain_train),
                                                                   labels))
        out.update(self._alphas(state.w))
        return out

    @torch.no_grad()
    def _student_labels(self, w: torch.Tensor, chunk: int = 4096) -> np.ndarray:
        """The student's argmax on every training sample."""
        self.flat.load(w)
        self.net.eval()
        n = int(self.fed.dev.offsets["train"][-1])
        out = [self.net.student(self.fed.dev.inputs(torch.arange(i, min(i + chunk, n),
                                                                 device=self.fed.device))).argmax(1)
               for i in range(0, n, chunk)]
        return torch.cat(out).cpu().numpy() if out else np.zeros(0, dtype=np.int64)

    def _domain_counts(self, state: State) -> np.ndarray:
        """(clients, K): how many of each client's training samples fall in each domain (oracle
        domain, or the student's argmax)."""
        labels = (np.asarray(self.fed.data.domain_train) if self.p.clustering == "oracle"
                  else self._student_labels(state.w))
        off = self.fed.dev.offsets["train"]
        return np.stack([np.bincount(labels[off[c]:off[c + 1]], minlength=self.p.K)
                         for c in range(self.fed.n_clients)])

    def assignments(self, state: State) -> np.ndarray:
        """Cluster per client: its k-means cluster, else its most frequent domain among its training
        samples (oracle domain, or the student's argmax)."""
        if self.p.clustering == "kmeans":
            return state.client_cluster.cpu().numpy().copy()
        return self._domain_counts(state).argmax(1)

    def client_columns(self, state: State) -> dict[str, np.ndarray]:
        """With discovered domains, each client's share of training samples the student puts in
        each domain (``domain_share_<k>``): a client's mix of domains, where its majority alone
        (``cluster``) can hide that every client spreads over the same few."""
        if self.p.clustering != "classifier":
            return {}
        counts = self._domain_counts(state)
        share = counts / np.maximum(counts.sum(1, keepdims=True), 1)
        return {f"domain_share_{k}": np.round(share[:, k], 4) for k in range(self.p.K)}

    def _alphas(self, w: torch.Tensor) -> dict[str, float]:
        if not self.p.agnostic:
            return {}
        return {f"alpha_{n}": float(w[self.flat.slices[f"backbone.{n}.alpha"]])
                for n, *_ in self.layers}
