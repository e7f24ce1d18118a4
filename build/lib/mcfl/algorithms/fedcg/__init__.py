"""FedCG: Cluster-driven Graph Federated Learning (Caldarola, Mancini, Galasso, Ciccone, Rodolà,
Caputo, "Cluster-driven Graph Federated Learning over Multiple Domains", CVPR Workshops (L2ID) 2021,
arXiv:2104.14628; §3-4). No public code exists; the paper text is the spec. Its symbols were lost in
conversion; the equations are reconstructed here and in :mod:`mcfl.models.fedcg` (Eqs. 4-6), with
every guess marked [GUESS].

One file per part of the method, each reading like its section of the paper:

* the model (§3.2-3.3, Eqs. 4-6): :mod:`mcfl.models.fedcg`, the run's network theta_a (same
  initial weights as every other method) + per-domain residual parameters on chosen layers, their
  GCN + a teacher g_t and a student g_s domain classifier; all in ONE flat vector, so the server
  averages it like FedAvg (wired up in :class:`FedCG` below);
* the local objective (§3.1-3.2, Eqs. 1, 3, 4): :mod:`.objective`;
* the server step (Eq. 2, the teacher update of §3.1, Eq. 6): :mod:`.server`;
* evaluation (test-time assignment, §3.2, and the domain metrics): :mod:`.evaluation`;
* the hyperparameters and the state: :mod:`.params`.

Reconstructed equations (Eqs. 4-6: :mod:`mcfl.models.fedcg`); S_r = the round's clients:

    Eq. 1  L(theta; D_i) = -1/|D_i| sum_{(x, y) in D_i} log f_theta(x)_y
    Eq. 2  theta = sum_{i in S_r} |D_i| theta_i / sum_{i in S_r} |D_i|
    Eq. 3  phi_s^i = argmin_phi -1/|D_i| sum_{x in D_i} log g_phi(x)_{y^(x)},
           y^(x) = argmax_k g_{phi_t}(x)_k;   phi_s = Eq. 2 over the phi_s^i;   phi_t <- phi_s every R

Round r: 1. each sampled client's local update from the global vector (:mod:`.objective`); 2-4.
FedAvg of the whole vector, the teacher update every R rounds and the adjacency update
(:mod:`.server`).

Our addition, ``calibrate_teacher`` (default on; off = the paper as written): the teacher's logits
are standardised over all training samples whenever it is (re)set (:func:`.server.calibrated_teacher`).
With it, the self-labelling converges to clusters aligned with the true domains (NMI ~0.5-0.65 with
the rotations of digits_domains).

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

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.base import Algorithm, param_span
from mcfl.algorithms.fedcg.evaluation import Evaluation, alphas
from mcfl.algorithms.fedcg.objective import LocalObjective
from mcfl.algorithms.fedcg.params import Params, State
from mcfl.algorithms.fedcg.server import calibrated_teacher, initial_adjacency, round_diagnostics, server_step
from mcfl.cluster.init import init_centres
from mcfl.engine import Task
from mcfl.models.fedcg import FedCGNet
from mcfl.streams import FEDCG_EXTRAS, derive_seed

__all__ = ["FedCG", "Params", "State"]


class FedCG(Algorithm):
    name = "FedCG"
    Params = Params
    State = State
    clustered = True

    def __init__(self, fed, params: Params):
        super().__init__(fed, params)
        p = params
        self.plain_fed = fed                      # the plain network's federation (k-means clustering)
        net = self.network(copy.deepcopy(fed.model.module), fed.data.x_shape, p)
        net.reset_extras(derive_seed(fed.seed, FEDCG_EXTRAS), alpha=p.alpha_init,
                         zero_theta=p.residual_init == "zero")
        self.fed = fed.with_network(net)          # FedCG's network, on the run's executor
        self.net, self.flat = net, self.fed.model
        self.c = p.domain_lr / self.fed.trainer.spec.lr if p.domain_lr else 1.0
        self.teacher_sl, self.student_sl = param_span(self.flat, "teacher."), param_span(self.flat, "student.")
        #: the domain layers: (name, module, theta slice, adjacency slice)
        self.layers = [(n, m, self.flat.slices[f"backbone.{n}.theta"], self.flat.slices[f"backbone.{n}.adjacency"])
                       for n, m in net.domain_layers()]
        domains = self._oracle_domains() if p.clustering == "oracle" else None
        row_client = {s: torch.from_numpy(np.repeat(np.arange(fed.n_clients), n)).to(fed.device)
                      for s, n in (("train", fed.dev.n_train), ("test", fed.dev.n_test))}
        domains = domains or {"train": None, "test": None}
        self.row_client_train, self.domains_train = row_client["train"], domains["train"]
        self.evaluation = Evaluation(self.fed, net, self.flat, p, self.layers, row_client=row_client["test"],
                                     domains=domains["test"])

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

    def _calibrated(self, w: torch.Tensor) -> torch.Tensor:
        return calibrated_teacher(self.net, self.flat, self.fed.dev, w)

    # -- the algorithm: initial state and one round ------------------------------------------------
    def init(self) -> State:
        p, w = self.p, self.fed.w0.clone()
        for i, (*_, adj) in enumerate(self.layers):
            w[adj] = initial_adjacency(p, i, self.fed.seed).reshape(-1).to(w)
        if p.clustering == "classifier" and p.calibrate_teacher:
            w = self._calibrated(w)
        cluster = torch.full((self.fed.n_clients,), -1, dtype=torch.long)
        if p.clustering == "kmeans":
            cluster = init_centres(self.plain_fed, p.K, restarts=p.restarts, distance="all").assign
        return State(w, cluster)

    def objective(self, state: State) -> LocalObjective:
        """The round's local loss (:mod:`.objective`) for ``state``'s k-means clusters."""
        return LocalObjective(self.p.clustering, self.p.K, self.c, cluster=state.client_cluster.to(self.fed.device),
                              row_client=self.row_client_train, domains=self.domains_train)

    def round(self, state: State, clients: np.ndarray, rnd: int):
        p = self.p
        stats = torch.zeros(2 + p.K, device=self.fed.device)
        loss = self.objective(state)
        acc = WeightedSum(1, state.w.numel(), state.w.device)
        losses = []
        tasks = (Task(int(c), state.w, loss=loss) for c in clients)
        for _, res in self.fed.trainer.run(tasks, rnd):                             # step 1
            acc.add(0, res.weights, res.n_samples)                                  # step 2 (Eq. 2)
            losses.append(res.loss)
            stats += res.aux
        w = server_step(p, state.w, acc.mean(0), rnd, teacher=self.teacher_sl, student=self.student_sl,
                        layers=self.layers, calibrate=self._calibrated)              # steps 2-4
        diag = round_diagnostics(p.K, losses, stats)
        diag.update(alphas(p, self.flat, self.layers, w))
        return State(w, state.client_cluster), diag

    # -- evaluation (:mod:`.evaluation`) ------------------------------------------------------------
    def eval_models(self, state: State):
        yield state.w, np.arange(self.fed.n_clients)

    def predict(self, w, rows, state=None):
        return self.evaluation.predict(w, rows, self.p.test_assignment, state)

    def extra_metrics(self, state: State) -> dict[str, float]:
        return self.evaluation.metrics(state)

    def assignments(self, state: State) -> np.ndarray:
        return self.evaluation.assignments(state)

    def client_columns(self, state: State) -> dict[str, np.ndarray]:
        return self.evaluation.client_columns(state)
