"""Each FeSEM Table 2 baseline against its defining rule, on problems small enough to check."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from mcfl.algorithms.fedavg import FedAvg
from mcfl.algorithms.feddane import FedDANE
from mcfl.algorithms.feddane import Params as DANEParams
from mcfl.algorithms.feddist import FedDist, FedDWS
from mcfl.algorithms.feddist import Params as DistParams
from mcfl.algorithms.fedprox import FedProx
from mcfl.algorithms.fedprox import Params as ProxParams
from mcfl.algorithms.fedsgd import FedSGD
from mcfl.algorithms.fedsgd import Params as SGDParams
from mcfl.algorithms.fesem import FeSEM
from mcfl.algorithms.fesem import Params as FeSEMParams
from mcfl.algorithms.fesem_ma import FeSEMMA
from mcfl.algorithms.fesem_ma import Params as MAParams
from mcfl.algorithms.hypocluster import HypoCluster
from mcfl.algorithms.hypocluster import Params as HypoParams
from mcfl.algorithms.hypocluster import State as HypoState
from mcfl.algorithms.fedcluster import FedCluster
from mcfl.algorithms.fedcluster import Params as CFLParams
from mcfl.algorithms.robust import Params as RobustParams
from mcfl.algorithms.robust import Robust
from mcfl.algorithms.robust import State as RobustState
from mcfl.data import load
from mcfl.engine import LocalResult
from mcfl.federation import build_federation
from mcfl.metrics import clustering_scores

LOGREG = {"name": "logreg"}


def fed_for(store, rounds=5, model=LOGREG, seed=0, **train):
    t = {"lr": 0.1, "batch_size": 10, "local_epochs": 1, "rounds": rounds, **train}
    return build_federation(load(store), model, t, seed=seed)


def run_rounds(algo, fed, rounds):
    state = algo.init()
    for r in range(1, rounds + 1):
        state, _ = algo.round(state, fed.clients(r), r)
    return state


class StubTrainer:
    """Returns preset local models (client c weighs c + 1 samples), to test a server step alone."""

    def __init__(self, results):
        self.results = results

    def run(self, tasks, rnd):
        for t in tasks:
            yield t, LocalResult(self.results[t.client].clone(), 0.0, n_samples=t.client + 1, steps=1)


class StubFed:
    def __init__(self, results, size):
        self.trainer, self.n_clients, self.device = StubTrainer(results), len(results), torch.device("cpu")
        self.model = type("M", (), {"size": size, "n_params": size,
                                    "select": lambda self, which: slice(0, size)})()


# ------------------------------------------------------------------------------------------ FedProx
def _double_objective(fed, client, w, anchor, mu):
    """F_k(w) + (mu/2)||w - anchor||^2 in float64, on a double copy of the model (parameters only)."""
    module = copy.deepcopy(fed.model.module).double()
    nn.utils.vector_to_parameters(w, module.parameters())
    rows = fed.dev.client_rows(client)
    x = fed.dev.inputs(rows).double()
    loss = nn.functional.cross_entropy(module(x), fed.dev.y["train"][rows])
    return loss + 0.5 * mu * ((w - anchor) ** 2).sum()


def test_fedprox_local_gradient_includes_mu_times_distance_to_global(swapped_store):
    """Two full-batch local steps: the second uses grad F(w1) + mu (w1 - w_global); checked against a
    central finite difference of the proximal objective in float64."""
    mu, lr = 1.0, 0.5
    fed = fed_for(swapped_store, lr=lr, batch_size=1000, local_steps=1)
    two = fed_for(swapped_store, lr=lr, batch_size=1000, local_steps=2)
    w0 = fed.w0
    client = np.array([0])
    w1 = FedProx(fed, ProxParams(mu=mu)).round(FedAvg(fed, None).init(), client, 1)[0].w
    w2 = FedProx(two, ProxParams(mu=mu)).round(FedAvg(two, None).init(), client, 1)[0].w
    step = ((w1 - w2) / lr).double()                     # the gradient the second step used
    w1d, w0d = w1.double(), w0.double()
    h = 1e-6
    fd = torch.zeros_like(w1d)
    for j in range(len(w1d)):
        e = torch.zeros_like(w1d)
        e[j] = h
        fd[j] = (_double_objective(fed, 0, w1d + e, w0d, mu) - _double_objective(fed, 0, w1d - e, w0d, mu)) / (2 * h)
    assert torch.allclose(step, fd, atol=2e-5)
    prox = mu * (w1d - w0d)
    assert prox.abs().max() > 1e-2                      # the proximal part is far above the tolerance
    assert not torch.allclose(step, fd - prox, atol=1e-3)


def test_fedprox_with_mu_zero_is_fedavg(digits_store):
    fa, fp = fed_for(digits_store, model={"name": "digits_cnn"}, clients_per_round=5), \
        fed_for(digits_store, model={"name": "digits_cnn"}, clients_per_round=5)
    a = run_rounds(FedAvg(fa, None), fa, 3)
    p = run_rounds(FedProx(fp, ProxParams(mu=0.0)), fp, 3)
    assert torch.equal(a.w, p.w)
    q = run_rounds(FedProx(fp, ProxParams(mu=0.1)), fp, 3)
    assert not torch.allclose(a.w, q.w)


# ------------------------------------------------------------------------------------------- FedSGD
def test_fedsgd_full_batch_full_participation_is_one_centralised_gradient_step(digits_store):
    lr = 0.3
    fed = fed_for(digits_store, model={"name": "digits_cnn"}, lr=lr)
    w1 = FedSGD(fed, SGDParams()).round(FedAvg(fed, None).init(), np.arange(fed.n_clients), 1)[0].w
    union = torch.arange(int(fed.dev.offsets["train"][-1]))
    g, _ = fed.trainer.gradient(fed.w0, 0, rows=union)
    expect = fed.w0.clone()
    expect[:fed.model.n_params] -= lr * g
    assert torch.allclose(w1, expect, atol=1e-6)


def test_fedsgd_fraction_draws_that_share_of_each_client(digits_store):
    fed = fed_for(digits_store, model={"name": "digits_cnn"})
    seen = []
    train = fed.trainer.train
    fed.trainer.train = lambda task, rnd, purpose=0, spec=None: (seen.append(spec), train(task, rnd, purpose, spec))[1]
    FedSGD(fed, SGDParams(fraction=0.25)).round(FedAvg(fed, None).init(), np.array([0, 1]), 1)
    assert [s.batch_size for s in seen] == [max(1, int(0.25 * fed.n_train[c])) for c in (0, 1)]
    assert all(s.steps == 1 for s in seen)


# ------------------------------------------------------------------------------- FedDist and FedDWS
def test_feddist_and_fedddws_server_steps_by_hand():
    locals_ = {0: torch.tensor([1.0, 0.0]), 1: torch.tensor([4.0, 6.0])}
    w = torch.tensor([0.0, 3.0])
    state = FedAvg(None, None).State(w)
    dist = FedDist(StubFed(locals_, 2), DistParams(epsilon=0.5)).round(state, np.array([0, 1]), 1)[0].w
    # plain mean [2.5, 3]; w + 0.5 (mean - w) = [1.25, 3]
    assert torch.allclose(dist, torch.tensor([1.25, 3.0]))
    dws = FedDWS(StubFed(locals_, 2), DistParams(epsilon=0.5)).round(state, np.array([0, 1]), 1)[0].w
    # weights 1 and 2: mean [3, 4]; w + 0.5 (mean - w) = [1.5, 3.5]
    assert torch.allclose(dws, torch.tensor([1.5, 3.5]))


def test_fedddws_with_epsilon_one_is_fedavg(digits_store):
    fa, fd = (fed_for(digits_store, model={"name": "digits_cnn"}, clients_per_round=5) for _ in range(2))
    a = run_rounds(FedAvg(fa, None), fa, 3)
    d = run_rounds(FedDWS(fd, DistParams(epsilon=1.0)), fd, 3)
    assert torch.allclose(a.w, d.w, atol=1e-6)


# ------------------------------------------------------------------------------------------ FedDANE
def test_feddane_one_full_batch_step_moves_every_client_along_the_global_gradient(swapped_store):
    """With one full-batch local step from w_t, client k's solution is
    w_t - lr (grad F_k + g_t - grad F_k) = w_t - lr g_t: the round equals a FedSGD step."""
    fa, fb = (fed_for(swapped_store, lr=0.2, batch_size=1000, local_steps=1, clients_per_round=5)
              for _ in range(2))
    clients = fa.clients(1)
    dane = FedDANE(fa, DANEParams(mu=0.3)).round(FedAvg(fa, None).init(), clients, 1)[0].w
    sgd = FedSGD(fb, SGDParams()).round(FedAvg(fb, None).init(), clients, 1)[0].w
    assert torch.allclose(dane, sgd, atol=1e-6)
    avg = FedAvg(fb, None).round(FedAvg(fb, None).init(), clients, 1)[0].w
    assert torch.allclose(avg, sgd, atol=1e-6)            # one full-batch local step: FedAvg = FedSGD
    two = fed_for(swapped_store, lr=0.2, batch_size=1000, local_steps=2, clients_per_round=5)
    dane2 = FedDANE(two, DANEParams()).round(FedAvg(two, None).init(), clients, 1)[0].w
    avg2 = FedAvg(two, None).round(FedAvg(two, None).init(), clients, 1)[0].w
    assert not torch.allclose(dane2, avg2, atol=1e-4)     # the correction matters from step 2 on


# ------------------------------------------------------------------------------ clustered baselines
def test_hypocluster_clients_pick_the_hypothesis_with_the_lowest_training_loss(swapped_store):
    """Hand-made hypotheses: h_0 fits group 0's labels, h_1 group 1's (its rows rolled by one class)."""
    fed = fed_for(swapped_store)
    data = load(swapped_store)
    x, y = (torch.tensor(a) for a in data.train(0))
    w_lin = torch.linalg.lstsq(x, nn.functional.one_hot(y, 4).float() * 10).solution
    h0 = torch.cat([w_lin.T.reshape(-1), torch.zeros(4)])
    h1 = torch.cat([w_lin.T.roll(1, 0).reshape(-1), torch.zeros(4)])    # class c scores as c - 1 did
    algo = HypoCluster(fed, HypoParams(K=2))
    everyone = range(fed.n_clients)
    assert algo.choose(torch.stack([h0, h1]), everyone).tolist() == data.true_clusters.tolist()
    assert algo.choose(torch.stack([h1, h0]), everyone).tolist() == (1 - data.true_clusters).tolist()
    # one client at a time picks the same: a client's choice depends on its own rows only
    assert [int(algo.choose(torch.stack([h1, h0]), [c])) for c in everyone] == (1 - data.true_clusters).tolist()


@pytest.mark.parametrize("cls, params", [(HypoCluster, HypoParams(K=2, restarts=3)),
                                         (FeSEM, FeSEMParams(K=2, restarts=3)),
                                         (Robust, RobustParams(K=2, restarts=3)),
                                         (FeSEMMA, MAParams(K=2, restarts=3))])
def test_clustered_methods_recover_well_separated_clusters(swapped_store, cls, params):
    fed = fed_for(swapped_store, rounds=5, clients_per_round=8)
    algo = cls(fed, params)
    state = run_rounds(algo, fed, 5)
    assert clustering_scores(algo.assignments(state), fed.data.true_clusters)["ari"] == 1.0


def test_hypocluster_moves_a_client_to_the_better_hypothesis(swapped_store):
    """Start from the truth with two clients put in the wrong cluster: one round fixes them."""
    fed = fed_for(swapped_store, rounds=3)
    algo = HypoCluster(fed, HypoParams(K=2, restarts=3))
    good = run_rounds(algo, fed, 2)
    wrong = good.assign.clone()
    wrong[[0, 7]] = 1 - wrong[[0, 7]]
    fixed, diag = algo.round(HypoState(good.centres, wrong), np.arange(fed.n_clients), 3)
    assert torch.equal(fixed.assign, good.assign) and diag["moved"] == 2


def test_cfl_splits_two_label_swapped_groups_and_not_iid_clients(swapped_store, iid_store):
    params = CFLParams(eps1=0.1, eps2=0.3, start_round=1)
    fed = fed_for(swapped_store, rounds=25)
    algo = FedCluster(fed, params)
    state = run_rounds(algo, fed, 25)
    assert len(state.models) == 2
    assert clustering_scores(algo.assignments(state), fed.data.true_clusters)["ari"] == 1.0
    fed = fed_for(iid_store, rounds=25)
    state = run_rounds(FedCluster(fed, params), fed, 25)
    assert len(state.models) == 1 and state.assign.eq(0).all()


def test_cfl_keeps_one_cluster_before_start_round_and_splits_after_it(swapped_store):
    """The same run as above with start_round 11: one cluster in rounds 1-10, then the split (so the
    test fails both for a CFL that splits too early and for one that never splits)."""
    fed = fed_for(swapped_store, rounds=25)
    algo = FedCluster(fed, CFLParams(eps1=0.1, eps2=0.3, start_round=11))
    state, sizes = algo.init(), []
    for r in range(1, 26):
        state, _ = algo.round(state, fed.clients(r), r)
        sizes.append(len(state.models))
    assert sizes[:10] == [1] * 10 and sizes[-1] == 2
    assert clustering_scores(algo.assignments(state), fed.data.true_clusters)["ari"] == 1.0


def test_tkm_centre_does_not_move_when_one_client_sends_huge_weights():
    good = {c: torch.tensor([1.0, 2.0, 3.0]) for c in range(5)}
    good.update({c: torch.tensor([-5.0, 0.0, 5.0]) for c in range(5, 10)})
    start = RobustState(torch.tensor([[0.0, 0.0, 0.0], [-4.0, 0.0, 4.0]]), torch.tensor([0] * 5 + [1] * 5))
    clients = np.arange(10)

    def run(results, **kw):
        return Robust(StubFed(results, 3), RobustParams(K=2, **kw)).round(start, clients, 1)[0]

    clean = run(good)
    bad = dict(good)
    bad[2] = torch.full((3,), 1e9)
    attacked = run(bad, lloyd_iters=3)
    assert torch.equal(attacked.centres, clean.centres)
    assert torch.equal(clean.centres, torch.tensor([[1.0, 2.0, 3.0], [-5.0, 0.0, 5.0]]))
    assert attacked.assign[[0, 1, 3, 4]].eq(0).all() and attacked.assign[5:].eq(1).all()
    plain = run(bad, trim=0.0, centre_trim=0.0)
    assert plain.centres.abs().max() > 1e6                  # a plain mean is captured


def test_fesem_ma_equals_fesem_on_a_model_without_hidden_layers(swapped_store):
    """Matching permutes hidden units only; logistic regression has none, so FeSEM-MA = FeSEM."""
    fa, fb = fed_for(swapped_store, clients_per_round=6), fed_for(swapped_store, clients_per_round=6)
    a = run_rounds(FeSEM(fa, FeSEMParams(K=2, restarts=2)), fa, 3)
    b = run_rounds(FeSEMMA(fb, MAParams(K=2, restarts=2)), fb, 3)
    assert torch.equal(a.assign, b.assign)
    assert torch.allclose(a.centres, b.centres, atol=1e-6)


def test_cfl_places_unsampled_members_of_a_split_cluster_by_loss(swapped_store):
    """With 8 of 12 clients per round, members missing from the splitting round join the child
    whose model fits their data better (our extension of CFL to client sampling)."""
    fed = fed_for(swapped_store, rounds=30, clients_per_round=8)
    algo = FedCluster(fed, CFLParams(eps1=0.1, eps2=0.3, start_round=1))
    state = algo.init()
    for r in range(1, 31):
        state, diag = algo.round(state, fed.clients(r), r)
        if diag["splits"]:
            absent = set(range(12)) - set(fed.clients(r).tolist())
            assert absent                                          # someone was not sampled
            break
    assert len(state.models) == 2
    assert clustering_scores(algo.assignments(state), fed.data.true_clusters)["ari"] == 1.0
