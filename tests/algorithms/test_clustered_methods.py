"""The field's clustered methods (FL+HC, PACFL, FedSoft) and the original-paper switches of CFL
(FedCluster) and IFCA (HypoCluster), each against a property its paper states."""

import dataclasses

import numpy as np
import pytest
import torch

from mcfl.algorithms.fedavg import FedAvg
from mcfl.algorithms.fedcluster import FedCluster
from mcfl.algorithms.fedcluster import Params as CFLParams
from mcfl.algorithms.fedprox import FedProx
from mcfl.algorithms.fedprox import Params as ProxParams
from mcfl.algorithms.fedsoft import FedSoft, importance
from mcfl.algorithms.fedsoft import Params as SoftParams
from mcfl.algorithms.fedsoft import State as SoftState
from mcfl.algorithms.flhc import FLHC
from mcfl.algorithms.flhc import Params as HCParams
from mcfl.algorithms.hypocluster import HypoCluster
from mcfl.algorithms.hypocluster import Params as HypoParams
from mcfl.algorithms.pacfl import PACFL, client_subspace, cluster_proximity, proximity_matrix
from mcfl.algorithms.pacfl import Params as PACFLParams
from mcfl.data import load
from mcfl.federation import build_federation
from mcfl.metrics import clustering_scores

LOGREG = {"name": "logreg"}


def fed_for(store, rounds=5, model=LOGREG, seed=0, **train):
    t = {"lr": 0.1, "batch_size": 10, "local_epochs": 1, "rounds": rounds, **train}
    return build_federation(load(store), model, t, seed=seed)


def run_rounds(algo, fed, rounds, state=None):
    state = algo.init() if state is None else state
    for r in range(1, rounds + 1):
        state, _ = algo.round(state, fed.clients(r), r)
    return state


def ari(algo, state, fed) -> float:
    return clustering_scores(algo.assignments(state), fed.data.true_clusters)["ari"]


# -------------------------------------------------------------------------------------------- FL+HC
def test_flhc_is_fedavg_until_round_n_then_separates_two_label_swapped_groups(swapped_store):
    fed, ref = fed_for(swapped_store, clients_per_round=6), fed_for(swapped_store, clients_per_round=6)
    algo = FLHC(fed, HCParams(rounds_before=3, K=2))
    before = run_rounds(algo, fed, 3)
    assert torch.equal(before.models[0], run_rounds(FedAvg(ref, None), ref, 3).w)
    assert before.assign.eq(0).all()
    state, diag = algo.round(before, fed.clients(4), 4)
    assert diag["clusters"] == 2 and len(state.models) == 2
    assert ari(algo, state, fed) == 1.0
    after, _ = algo.round(state, fed.clients(5), 5)          # the clusters are never revised
    assert torch.equal(after.assign, state.assign)


def test_flhc_threshold_huge_gives_one_cluster_tiny_gives_singletons(swapped_store):
    fed = fed_for(swapped_store)
    one = FLHC(fed, HCParams(rounds_before=0, threshold=1e9)).round(FLHC(fed, HCParams()).init(),
                                                                   fed.clients(1), 1)[0]
    assert len(one.models) == 1
    alone = FLHC(fed, HCParams(rounds_before=0, threshold=1e-9, linkage="average", metric="cosine"))
    state = alone.round(alone.init(), fed.clients(1), 1)[0]
    assert len(state.models) == fed.n_clients and sorted(state.assign.tolist()) == list(range(fed.n_clients))


def test_flhc_threshold_cut_separates_the_groups(swapped_store):
    """A cut between the within-group and the cross-group distances finds the two groups unasked."""
    fed = fed_for(swapped_store)
    algo = FLHC(fed, HCParams(rounds_before=2, threshold=1.0, linkage="average", metric="cosine"))
    state = run_rounds(algo, fed, 3)
    assert len(state.models) == 2 and ari(algo, state, fed) == 1.0


@dataclasses.dataclass
class EarlyHCParams(HCParams):
    rounds_before: int = 1


class EarlyFLHC(FLHC):
    """FL+HC clustering in round 2, so the conformance kit's 3 rounds cross the clustering round."""
    Params = EarlyHCParams


@pytest.mark.slow
def test_flhc_keeps_the_contract_across_its_clustering_round():
    from mcfl.check import check_method

    failed = [r.line() for r in check_method(EarlyFLHC) if not r.passed]
    assert not failed, failed


def test_flhc_refuses_ward_without_euclidean():
    with pytest.raises(ValueError, match="^linkage 'ward' needs metric 'euclidean'"):
        HCParams(metric="cosine")


# -------------------------------------------------------------------------------------------- PACFL
def test_pacfl_groups_writers_by_rotation(digits_store):
    """Clients of the digits store are drawn from four rotated copies of the digits: the one-shot
    subspace clustering recovers the rotations, and the clusters then stay fixed."""
    fed = fed_for(digits_store, model={"name": "digits_cnn"}, clients_per_round=4)
    algo = PACFL(fed, PACFLParams(p=3, beta=16.0))
    state = algo.init()
    assert len(state.models) == 4 and ari(algo, state, fed) == 1.0
    assert all(torch.equal(m, fed.w0) for m in state.models)       # every cluster from the common init
    after = run_rounds(algo, fed, 2, state)
    assert torch.equal(after.assign, state.assign)


def test_pacfl_proximity_is_symmetric_sign_free_and_zero_for_equal_subspaces():
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(40, 16, generator=g), torch.arange(40) % 2
    u = client_subspace(x, y, 2)
    assert u.shape == (16, 4)
    other = client_subspace(torch.rand(40, 16, generator=g), y, 2)
    for how in ("entrywise", "principal"):
        a = proximity_matrix([u, u.clone(), other], how)
        assert np.allclose(a, a.T) and np.allclose(np.diag(a), 0)
        assert a[0, 1] < 1e-3 and a[0, 2] > 0.1     # the same subspace: angle 0
    assert proximity_matrix([u, -u], "principal")[0, 1] < 1e-3     # sign-free
    assert proximity_matrix([u, -u], "entrywise")[0, 1] > 1.0      # the authors' angle depends on signs


def test_pacfl_beta_infinite_is_one_cluster_and_zero_is_singletons():
    a = np.array([[0, 1, 9], [1, 0, 8], [9, 8, 0]], dtype=float)
    assert cluster_proximity(a, 100.0).tolist() == [0, 0, 0]
    assert cluster_proximity(a, 0.5).tolist() == [0, 1, 2]
    assert cluster_proximity(a, 1.0).tolist() == [0, 0, 1]          # merged while distance <= beta


# ------------------------------------------------------------------------------------------ FedSoft
def test_fedsoft_importance_counts_the_samples_each_centre_fits_best():
    losses = torch.tensor([[0.1, 0.5, 0.2, 0.9], [0.3, 0.4, 0.1, 0.2], [0.5, 0.6, 0.7, 0.8]])
    u = importance(losses, sigma=1e-4)
    assert u.tolist() == [0.25, 0.75, 1e-4]      # wins 1 and 3 of 4; centre 2 none: sigma


def test_fedsoft_with_one_centre_starting_from_it_is_fedprox_bit_for_bit(digits_store):
    lam = 0.3
    fs = fed_for(digits_store, model={"name": "digits_cnn"}, clients_per_round=5)
    fp = fed_for(digits_store, model={"name": "digits_cnn"}, clients_per_round=5)
    m = fs.n_clients
    start = SoftState(fs.w0.clone()[None], torch.zeros(m, dtype=torch.long),
                      torch.ones(m, 1, dtype=torch.float64), torch.zeros(0, fs.model.size),
                      torch.zeros(m, dtype=torch.bool))
    soft = run_rounds(FedSoft(fs, SoftParams(K=1, lam=lam, start="mix")), fs, 3, start)
    prox = run_rounds(FedProx(fp, ProxParams(mu=lam)), fp, 3)
    assert torch.equal(soft.centres[0], prox.w)
    assert soft.u.eq(1.0).all()


def test_fedsoft_pure_clients_get_their_groups_centre(swapped_store):
    fed = fed_for(swapped_store, rounds=4)
    algo = FedSoft(fed, SoftParams(K=2, restarts=3, lam=0.1))
    state = run_rounds(algo, fed, 4)
    assert ari(algo, state, fed) == 1.0
    assert state.u.max(1).values.min() > 0.8                 # nearly one-hot importance
    assert state.has_local.all() and len(state.local) == fed.n_clients
    models = list(algo.eval_models(state))
    assert sorted(int(c) for _, cs in models for c in cs) == list(range(fed.n_clients))
    assert torch.equal(models[0][0], state.local[0])          # tested with its own model


# ---------------------------------------------------------------------------- IFCA and CFL switches
def test_ifca_model_averaging_with_one_cluster_is_fedavg(digits_store):
    fi = fed_for(digits_store, model={"name": "digits_cnn"}, clients_per_round=5)
    fa = fed_for(digits_store, model={"name": "digits_cnn"}, clients_per_round=5)
    ifca = HypoCluster(fi, HypoParams(K=1, init_models="independent"))
    assert not HypoCluster.uses_centres({"init_models": "independent"})
    assert torch.equal(run_rounds(ifca, fi, 3).centres[0], run_rounds(FedAvg(fa, None), fa, 3).w)


def test_ifca_independent_models_are_distinct_and_model_zero_is_the_initial_one(swapped_store):
    fed = fed_for(swapped_store)
    state = HypoCluster(fed, HypoParams(K=3, init_models="independent")).init()
    assert torch.equal(state.centres[0], fed.w0)
    assert not torch.equal(state.centres[1], state.centres[2]) and not torch.equal(state.centres[1], fed.w0)
    assert torch.equal(fed.model.get(), fed.w0)               # the shared model is left as it was


def test_ifca_gradient_averaging_is_one_step_on_the_chosen_clients_mean_gradient(swapped_store):
    """Option I: theta_j <- theta_j - (lr/m) sum_{i chose j} grad F_i(theta_j), by hand."""
    fed = fed_for(swapped_store, lr=0.5)
    algo = HypoCluster(fed, HypoParams(K=2, init_models="independent", averaging="gradient"))
    state = algo.init()
    clients = np.arange(fed.n_clients)
    new, _ = algo.round(state, clients, 1)
    chosen = algo.choose(state.centres, clients)
    for j in range(2):
        grads = [fed.trainer.gradient(state.centres[j], int(c))[0] for c in clients if chosen[c] == j]
        step = 0.5 / len(clients) * torch.stack(grads).sum(0) if grads else 0
        want = state.centres[j] - step
        assert torch.allclose(new.centres[j], want, atol=1e-6)
    assert torch.equal(new.assign, chosen)


def test_cfl_with_the_papers_rule_splits_exactly_when_eps1_and_eps2_say_so(swapped_store):
    """Sattler et al.'s criterion alone (``start_round: 1, min_split_size: 2``): a round splits iff
    the cluster's mean update norm is below eps1 and some client's update norm above eps2."""
    fed = fed_for(swapped_store, rounds=25)
    eps1, eps2 = 0.1, 0.3
    algo = FedCluster(fed, CFLParams(eps1=eps1, eps2=eps2, start_round=1, min_split_size=2))
    state, splits = algo.init(), 0
    for r in range(1, 26):
        one = len(state.models) == 1
        state, d = algo.round(state, fed.clients(r), r)
        if one:                        # one cluster: its norms are the round's diagnostics
            assert bool(d["splits"]) == (d["mean_update_norm"] < eps1 and d["max_update_norm"] > eps2)
        splits += d["splits"]
    assert splits >= 1 and ari(algo, state, fed) == 1.0


# ------------------------------------------------------------------------------------ the whole DAG
@pytest.mark.slow
def test_the_new_methods_and_the_aliases_run_through_snakemake(tmp_path, cli_env):
    """A tiny digits config with FL+HC (clustering in round 2), PACFL, FedSoft and CFL/IFCA with
    their original-paper switches: the DAG trains them and tabulates one row each, with clusters."""
    import pandas as pd

    from dag_helpers import snakemake, write_config

    cfg = {"experiment": "clustered-test", "seeds": [0],
           "datasets": {"digits": {
               "prepare": {"source": "digits", "clients": 12, "clusters": 2, "seed": 0},
               "model": {"name": "digits_cnn"},
               "train": {"rounds": 3, "lr": 0.1, "eval_every": 3, "clients_per_round": 6}}},
           "methods": [{"method": "FedAvg"}, {"method": "FL+HC", "K": 2, "rounds_before": 1},
                       {"method": "PACFL", "beta": 16.0}, {"method": "FedSoft", "K": 2, "restarts": 2},
                       {"method": "IFCA", "K": 2, "init_models": "independent", "averaging": "gradient"},
                       {"method": "CFL", "start_round": 1, "min_split_size": 2}]}
    write_config(tmp_path, cfg)
    r = snakemake(tmp_path, cli_env)
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(tmp_path / "results" / "table.csv")
    assert table["method"].tolist()[:4] == ["FedAvg", "FL+HC(2)", "PACFL", "FedSoft(2)"]
    assert len(table) == 6
    rows = table.set_index("method")
    assert rows.loc[["FL+HC(2)", "PACFL", "FedSoft(2)"], "ari_mean"].notna().all()
