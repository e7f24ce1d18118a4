"""FedGSP (Zeng et al., DASFAA 2022): ICG's min-cost-flow assignment and grouping, growth functions, STP against
a hand-rolled chain of local updates, CPD, cost models, the server-optimiser and IDA baselines, and
the FedGSP outputs."""

import itertools
import math
from dataclasses import asdict

import numpy as np
import pytest
import torch

from mcfl.algorithms import get
from mcfl.algorithms.fedgsp import FedGSP, NaiveGSP, growth
from mcfl.algorithms.fedopt import Params as OptParams
from mcfl.algorithms.fedopt import server_step
from mcfl.algorithms.ida import ida_weights
from mcfl.cluster.icg import balanced_assignment, icg_groups, layout, random_groups
from mcfl.data import load
from mcfl.engine import Task
from mcfl.federation import build_federation
from mcfl.fedgsp.metrics import (CostModel, class_counts, cpd, d_comm, group_counts, pairwise_cpd,
                                 rounds_to_target, t_comm, t_comp)

TRAIN = {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 3, "clients_per_round": None}


def fed_for(store, seed=0, **train):
    return build_federation(load(store), {"name": "digits_cnn"}, {**TRAIN, **train}, seed)


# ------------------------------------------------------------------------------------------ ICG
@pytest.mark.parametrize("K,L,seed", [(7, 3, 0), (7, 3, 1), (6, 2, 2), (8, 3, 3), (5, 5, 4)])
def test_min_cost_flow_assignment_is_optimal_and_balanced(K, L, seed):
    cost = np.random.default_rng(seed).random((K, L)) * 10
    got = balanced_assignment(cost)
    sizes = np.bincount(got, minlength=L)
    assert sizes.min() == K // L and sizes.max() == -(-K // L)
    best = min(cost[np.arange(K), a].sum() for a in itertools.product(range(L), repeat=K)
               if np.bincount(a, minlength=L).max() - np.bincount(a, minlength=L).min() <= 1)
    assert cost[np.arange(K), got].sum() == pytest.approx(best, rel=1e-6)


def test_min_cost_flow_beats_the_unconstrained_choice_when_it_must():
    # every point prefers cluster 0; the size constraint forces exactly half of them out, and the
    # optimum moves the ones for which cluster 1 costs least extra
    cost = np.array([[0, 5], [0, 1], [0, 9], [0, 2]], dtype=float)
    assert balanced_assignment(cost).tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("K,f,rounding", [(100, 3, "paper"), (100, 10, "paper"), (368, 10, "paper"),
                                          (368, 130, "paper"), (368, 130, "exact"), (37, 5, "exact"),
                                          (10, 4, "paper"), (9, 50, "paper"), (12, 1, "paper")])
def test_every_client_in_exactly_one_group_and_sizes_differ_by_at_most_one(K, f, rounding):
    rng = np.random.default_rng(K + f)
    V = rng.poisson(2.0, (K, 6)) * (rng.random((K, 6)) < 0.4)
    for group in (icg_groups(V, f, rng, rounding=rounding)[0], random_groups(K, f, rng, rounding)):
        assert group.shape == (K,)
        sizes = np.bincount(group)
        assert sizes.sum() == K and (sizes > 0).all()          # ids 0..M-1, each used, one per client
        assert sizes.max() - sizes.min() <= 1
        assert len(sizes) == layout(K, f, rounding)[1]
    if rounding == "exact":
        assert layout(K, f, rounding)[1] == min(f, K)


def test_icg_groups_take_one_client_from_each_cluster():
    rng = np.random.default_rng(0)
    V = rng.poisson(3.0, (60, 5))
    group, cl = icg_groups(V, 12, rng)               # L = 5 clusters of 12, 12 groups of 5
    assert np.bincount(cl.labels).tolist() == [12] * 5
    for g in range(12):
        assert sorted(cl.labels[group == g]) == [0, 1, 2, 3, 4]


def test_icg_lowers_group_divergence_on_label_skewed_clients():
    rng = np.random.default_rng(0)
    V = np.zeros((100, 10))
    for k in range(100):
        V[k, rng.choice(10, 2, replace=False)] = rng.integers(5, 15, 2)   # 2 classes per client
    icg = np.median(pairwise_cpd(group_counts(V, icg_groups(V, 10, rng)[0])))
    rnd = np.median(pairwise_cpd(group_counts(V, random_groups(100, 10, rng))))
    assert icg < 0.75 * rnd


# ------------------------------------------------------------------------------ growth, Eqs. 1-3
def test_growth_functions_match_equations_1_to_3():
    # Linear: beta * floor(alpha (r-1) + 1)
    assert [growth(r, "linear", 0.5, 10) for r in (1, 2, 3, 4, 5)] == [10, 10, 20, 20, 30]
    assert growth(101, "linear", 0.29, 1) == 30          # 0.29*100 + 1 = 30 despite rounding error
    # Log: beta * floor(alpha ln r + 1); 2 ln 2 + 1 = 2.39, 2 ln 5 + 1 = 4.22, 2 ln 500 + 1 = 13.43
    assert [growth(r, "log", 2, 10) for r in (1, 2, 3, 5, 500)] == [10, 20, 30, 40, 130]
    # Exp: beta * floor((1 + alpha)^(r-1)); 1.5^2 = 2.25, 1.5^3 = 3.375
    assert [growth(r, "exp", 1, 2) for r in (1, 2, 3, 4)] == [2, 4, 8, 16]
    assert [growth(r, "exp", 0.5, 3) for r in (1, 2, 3, 4)] == [3, 3, 6, 9]
    assert growth(10_000, "exp", 2, 10) >= 2 ** 62          # no overflow; capped (min{K, f} later)
    assert growth(7, "fixed", 2, 4) == 4
    with pytest.raises(ValueError, match="growth"):
        growth(1, "cubic", 1, 1)


# ------------------------------------------------------------------------------------------ STP
def test_stp_with_one_group_and_kappa_one_is_sequential_sgd(digits_store):
    fed = fed_for(digits_store)
    algo = FedGSP(fed, FedGSP.Params(growth="fixed", beta=1, kappa=1.0))
    state = algo.init()
    clients = fed.clients(1)
    new, diag = algo.round(state, clients, 1)
    order = np.argsort(new.rank.numpy())
    assert sorted(order.tolist()) == list(range(fed.n_clients)) and (new.group == 0).all()
    assert order.tolist() != list(range(fed.n_clients))              # the order was shuffled
    w = fed.w0
    for c in order:                                                  # hand-rolled chain of updates
        w = fed.trainer.train(Task(int(c), w), 1).weights
    assert torch.equal(new.w, w)
    assert diag["groups"] == 1 and diag["clients_trained"] == fed.n_clients


def test_stp_round_trains_each_client_of_the_sampled_groups_once_and_averages(digits_store):
    fed = fed_for(digits_store)
    algo = FedGSP(fed, FedGSP.Params(growth="fixed", beta=4, kappa=0.5))
    new, diag = algo.round(algo.init(), fed.clients(1), 1)
    assert diag["groups"] == 4 and diag["trained_groups"] == 2 and diag["clients_trained"] == 8
    # the aggregate is the mean of the two groups' chain results, recomputed by hand
    picked = np.sort(fed.rng(1, 2).choice(4, 2, replace=False))
    finals = []
    for g in picked:
        members = np.flatnonzero(new.group.numpy() == g)
        w = fed.w0
        for c in members[np.argsort(new.rank.numpy()[members])]:
            w = fed.trainer.train(Task(int(c), w), 1).weights
        finals.append(w)
    assert torch.allclose(new.w, (finals[0] + finals[1]) / 2, atol=1e-6)


@pytest.mark.parametrize("path", ["lowrank", "stacked"])
def test_stp_on_the_batched_executor_trains_the_same_chains(digits_store, path):
    """The groups' j-th clients go to the executor together: on the batched executor (its low-rank
    and its stacked path) the round's model equals the sequential executor's up to float rounding,
    with the same groups, ranks and mean loss."""
    from mcfl.executors import BatchedTrainer

    out = []
    for ex in ("sequential", "batched"):
        fed = fed_for(digits_store)
        if ex == "batched":
            fed.trainer = BatchedTrainer(fed.trainer.model, fed.trainer.data, fed.trainer.spec, fed.trainer.seed,
                                         lowrank=0 if path == "stacked" else 0.5, fallback="stacked")
            calls, run = [], fed.trainer.run
            fed.trainer.run = lambda tasks, rnd: (calls.append(len(tasks)), run(tasks, rnd))[1]
        algo = FedGSP(fed, FedGSP.Params(growth="fixed", beta=3, kappa=0.7))
        out.append(algo.round(algo.init(), fed.clients(1), 1))
    (seq, dseq), (bat, dbat) = out
    assert dseq["trained_groups"] == 2 and dseq["chain"] >= 5
    assert calls[0] == 2 and len(calls) == dseq["chain"]          # the two groups' j-th clients at once
    assert torch.equal(seq.group, bat.group) and torch.equal(seq.rank, bat.rank)
    assert not torch.allclose(seq.w, fed.w0, atol=1e-3)                         # it trained
    assert torch.allclose(seq.w, bat.w, atol=1e-5)
    assert dseq["train_loss"] == pytest.approx(dbat["train_loss"], rel=1e-5)


def test_naive_gsp_keeps_its_groups_and_order_fedgsp_regroups_and_grows(digits_store):
    fed = fed_for(digits_store)
    naive = NaiveGSP(fed, NaiveGSP.Params(beta=4))
    s0 = naive.init()
    s1, d1 = naive.round(s0, fed.clients(1), 1)
    s2, _ = naive.round(s1, fed.clients(2), 2)
    assert torch.equal(s0.group, s2.group) and torch.equal(s0.rank, s2.rank) and d1["groups"] == 4
    gsp = FedGSP(fed, FedGSP.Params(growth="linear", alpha=1.0, beta=2))
    g1, d1 = gsp.round(gsp.init(), fed.clients(1), 1)
    g2, d2 = gsp.round(g1, fed.clients(2), 2)
    assert (d1["groups"], d2["groups"]) == (2, 4)


def test_ablations_are_registered_with_their_defaults():
    assert asdict(get("NaiveGSP").Params()) == asdict(FedGSP.Params(growth="fixed", grouping="random",
                                                                    regroup=False))
    assert asdict(get("NaiveGSP+ICG").Params()) == asdict(FedGSP.Params(growth="fixed", regroup=False))
    with pytest.raises(ValueError, match="kappa"):
        FedGSP.Params(kappa=0)


# ------------------------------------------------------------------------------------------ CPD
def test_cpd_of_identical_distributions_is_zero_and_matches_eq_14():
    assert cpd(np.array([2, 4, 0]), np.array([1, 2, 0])) == pytest.approx(0, abs=1e-15)
    # P = e_0, Q = e_1: E k(x,x') = 1, E k(x,y) = exp(-1/sigma^2), E k(y,y') = 1
    for sigma in (0.5, 1.0, 2.0):
        assert cpd(np.array([1, 0]), np.array([0, 1]), sigma) == pytest.approx(2 * (1 - math.exp(-1 / sigma ** 2)))
    # Eq. 14's three expectations written out for P = (.5, .5, 0), Q = (0, .5, .5)
    P, Q, a = np.array([.5, .5, 0]), np.array([0, .5, .5]), math.exp(-1)
    k = lambda i, j: 1.0 if i == j else a                                      # noqa: E731
    E = lambda A, B: sum(A[i] * B[j] * k(i, j) for i in range(3) for j in range(3))   # noqa: E731
    assert cpd(P, Q) == pytest.approx(E(P, P) - 2 * E(P, Q) + E(Q, Q))
    V = np.array([[3, 1, 0], [0, 2, 2], [1, 1, 1]])
    assert pairwise_cpd(V) == pytest.approx([cpd(V[0], V[1]), cpd(V[0], V[2]), cpd(V[1], V[2])])


def test_class_counts_and_group_counts():
    V = class_counts(np.array([0, 1, 1, 2, 2, 2]), np.array([0, 3, 6]), 3)
    assert V.tolist() == [[1, 2, 0], [0, 0, 3]]
    assert group_counts(V, np.array([0, 0])).tolist() == [[1, 2, 3]]


# -------------------------------------------------------------------------------- Eqs. 15-17
def test_cost_models_match_equations_15_to_17():
    c = CostModel()
    K, n, e, kappa, f = 368, 226.0, 1, 0.3, [10, 20]
    comp = sum(96e6 / 567e9 * n * e * K / min(K, fr) + 6.3e6 / 567e9 * (kappa * fr - 1) for fr in f)
    assert t_comp(np.array(f), kappa, K, n, e, c) == pytest.approx(comp)
    assert t_comm(kappa, K, 2, c) == pytest.approx(8 * kappa * K * 25.2 * 2 * (1 / 567 + 1 / 567))
    assert d_comm(kappa, K, 2, c) == pytest.approx(2 * kappa * K * 25.2e6 * 2)
    assert rounds_to_target(np.array([1, 2, 3, 4]), np.array([.1, .79, .8, .9]), 0.8) == 3
    assert rounds_to_target(np.array([1, 2]), np.array([.1, .2]), 0.8) is None


# --------------------------------------------------------------------------- server optimisers
def test_server_optimisers_match_reddi_et_al_on_a_hand_checked_step():
    p = OptParams(eta=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    x, d = torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([0.2, -0.1], dtype=torch.float64)
    m0, v0 = torch.zeros(2, dtype=torch.float64), torch.full((2,), 1e-6, dtype=torch.float64)   # v_-1 = tau^2
    # m = 0.1 * delta = (0.02, -0.01)
    # Adam: v = 0.99e-6 + 0.01 delta^2 = (4.0099e-4, 1.0099e-4); step = 0.1 m / (sqrt v + 1e-3)
    x1, m1, v1 = server_step("adam", x, d, m0, v0, p)
    assert m1.tolist() == pytest.approx([0.02, -0.01])
    assert v1.tolist() == pytest.approx([4.0099e-4, 1.0099e-4])
    assert x1.tolist() == pytest.approx([1 + 0.09512605167558885, -2 - 0.09050283118522214])
    # Yogi: v = 1e-6 - 0.01 delta^2 sign(1e-6 - delta^2) = (4.01e-4, 1.01e-4)
    x1, _, v1 = server_step("yogi", x, d, m0, v0, p)
    assert v1.tolist() == pytest.approx([4.01e-4, 1.01e-4])
    assert x1.tolist() == pytest.approx([1 + 0.09512492197250395, -2 - 0.09049875621120891])
    # Adagrad with beta1 = 0: m = delta, v = 1e-6 + delta^2 = (0.040001, 0.010001)
    x1, m1, v1 = server_step("adagrad", x, d, m0, v0, OptParams(eta=0.1, beta1=0.0, tau=1e-3))
    assert v1.tolist() == pytest.approx([0.040001, 0.010001])
    assert x1.tolist() == pytest.approx([1 + 0.09950124999218761, -2 - 0.09900499987500626])
    # Yogi's v only moves by (1 - beta2) delta^2 towards delta^2, unlike Adam's decay of v
    _, _, vy = server_step("yogi", x, d, m0, torch.tensor([1.0, 1.0], dtype=torch.float64), p)
    assert vy.tolist() == pytest.approx([1 - 0.01 * 0.04, 1 - 0.01 * 0.01])


@pytest.mark.parametrize("name", ["FedAdam", "FedYogi", "FedAdagrad"])
def test_fedopt_round_applies_the_server_step_to_the_mean_update(digits_store, name):
    fed = fed_for(digits_store)
    cls = get(name)
    algo = cls(fed, cls.Params(eta=0.05))
    s0 = algo.init()
    clients = np.array([0, 3, 5])
    s1, _ = algo.round(s0, clients, 1)
    mean = torch.stack([fed.trainer.train(Task(int(c), fed.w0), 1).weights for c in clients]).mean(0)
    P = fed.model.n_params
    want, _, _ = server_step(cls.kind, fed.w0[:P], mean[:P] - fed.w0[:P], s0.m, s0.v, algo.p)
    assert torch.allclose(s1.w[:P], want, atol=1e-6)


def test_ida_weights_are_normalised_inverse_distances_to_the_mean():
    W = torch.tensor([[3.0], [-1.0], [-2.0]])        # mean 0: distances 3, 1, 2
    assert ida_weights(W, 1).tolist() == pytest.approx([2 / 11, 6 / 11, 3 / 11])
    assert ida_weights(W, 1, sizes=torch.tensor([1, 2, 3])).tolist() == pytest.approx([2 / 23, 12 / 23, 9 / 23])


def test_ida_weights_over_column_blocks_equal_the_whole_vector_formula():
    W = torch.randn(4, 23, generator=torch.Generator().manual_seed(0))
    theta = W[:, :20].double()                       # the last 3 columns are not parameters
    a = 1 / torch.linalg.vector_norm(theta - theta.mean(0), dim=1)
    for block in (1, 6, 20, 1 << 16):
        assert torch.allclose(ida_weights(W, 20, block=block), a / a.sum(), rtol=1e-12), block


def test_ida_round_combines_local_models_with_ida_weights(digits_store):
    fed = fed_for(digits_store)
    algo = get("IDA")(fed, get("IDA").Params())
    clients = np.array([1, 2, 7])
    s1, _ = algo.round(algo.init(), clients, 1)
    W = torch.stack([fed.trainer.train(Task(int(c), fed.w0), 1).weights for c in clients])
    a = ida_weights(W, fed.model.n_params).float()
    assert torch.allclose(s1.w, (a[:, None] * W).sum(0), atol=1e-6)
