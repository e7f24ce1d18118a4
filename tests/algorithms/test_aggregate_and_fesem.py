"""FedAvg's weighted mean, FeSEM's E-step and M-step, and FeSEM(K=1) == FedAvg."""

import numpy as np
import pytest
import torch

from mcfl.aggregate import WeightedSum, weighted_mean
from mcfl.algorithms.fedavg import FedAvg
from mcfl.algorithms.fesem import FeSEM, Params, State, e_step
from mcfl.data import load
from mcfl.engine import LocalResult
from mcfl.federation import build_federation


def test_weighted_mean_by_hand():
    w = weighted_mean([(torch.tensor([1.0, 0.0]), 1), (torch.tensor([4.0, 3.0]), 2)])
    assert torch.allclose(w, torch.tensor([3.0, 2.0]))        # (1·[1,0] + 2·[4,3]) / 3


def test_e_step_picks_the_nearest_centre_by_hand():
    centres = torch.tensor([[0.0, 0.0, 9.0], [2.0, 2.0, 0.0], [5.0, 0.0, 0.0]])
    w = torch.tensor([1.5, 1.0, 100.0])
    # over all coordinates: d = [2.25+1+8281, 0.25+1+10000, 12.25+1+10000] -> centre 0
    assert e_step(w, centres, slice(0, 3)) == (0, pytest.approx(8284.25))
    # over the first two only: d = [3.25, 1.25, 13.25] -> centre 1
    assert e_step(w, centres, slice(0, 2)) == (1, pytest.approx(1.25))


class StubTrainer:
    """Returns preset local models, to test the server step alone."""

    def __init__(self, results):
        self.results = results

    def run(self, tasks, rnd):
        for t in tasks:
            yield t, LocalResult(self.results[t.client], 0.0, n_samples=t.client + 1, steps=1)


class StubFed:
    def __init__(self, trainer, n, size):
        self.trainer, self.n_clients, self.device = trainer, n, torch.device("cpu")
        self.model = type("M", (), {"size": size, "select": lambda self, which: slice(0, size)})()


def test_fesem_round_assigns_by_eq8_and_averages_by_eq9():
    locals_ = {0: torch.tensor([0.0, 1.0]), 1: torch.tensor([1.0, 0.0]),
               2: torch.tensor([9.0, 9.0]), 3: torch.tensor([11.0, 9.0])}
    fed = StubFed(StubTrainer(locals_), 4, 2)
    centres = torch.tensor([[0.0, 0.0], [10.0, 10.0], [-50.0, -50.0]])
    algo = FeSEM(fed, Params(K=3, lam=0.0))
    state = State(centres, torch.tensor([1, 1, 0, 0]))
    new, diag = algo.round(state, np.arange(4), rnd=1)
    assert new.assign.tolist() == [0, 0, 1, 1]
    assert torch.allclose(new.centres[0], torch.tensor([0.5, 0.5]))        # plain mean
    assert torch.allclose(new.centres[1], torch.tensor([10.0, 9.0]))
    assert torch.equal(new.centres[2], centres[2])                          # empty: unchanged
    assert diag["moved"] == 4
    weighted = FeSEM(fed, Params(K=3, lam=0.0, mstep="weighted")).round(state, np.arange(4), 1)[0]
    # clients 2 and 3 weigh 3 and 4: (3·[9,9] + 4·[11,9]) / 7
    assert torch.allclose(weighted.centres[1], torch.tensor([71 / 7, 9.0]))


def test_fesem_k1_lambda0_weighted_equals_fedavg(digits_store):
    data = load(digits_store)
    train = {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 4, "clients_per_round": 6}
    fed_a = build_federation(data, {"name": "digits_cnn"}, train, seed=5)
    fed_b = build_federation(data, {"name": "digits_cnn"}, train, seed=5)
    avg = FedAvg(fed_a, None)
    sem = FeSEM(fed_b, Params(K=1, lam=0.0, mstep="weighted"))
    sa = avg.init()
    sb = State(fed_b.w0.clone()[None], torch.zeros(data.n_clients, dtype=torch.long))
    for r in range(1, 5):
        assert np.array_equal(fed_a.clients(r), fed_b.clients(r))
        sa, _ = avg.round(sa, fed_a.clients(r), r)
        sb, _ = sem.round(sb, fed_b.clients(r), r)
        assert torch.allclose(sa.w, sb.centres[0], atol=1e-6)
    assert not torch.allclose(sa.w, fed_a.w0)


def test_weighted_sum_tracks_empty_clusters():
    acc = WeightedSum(2, 3, torch.device("cpu"))
    acc.add(1, torch.ones(3), 2.0)
    assert not acc.has(0) and acc.has(1)
    assert torch.equal(acc.mean(1), torch.ones(3))


class HeadStubFed(StubFed):
    """Models of three coordinates: a body (the first two) and an output layer (the third)."""

    def __init__(self, trainer, n):
        super().__init__(trainer, n, 3)
        self.model.select = lambda which: {"all": slice(0, 3), "last_layer": slice(2, 3),
                                           "head": slice(2, 3)}[which]


def test_fesem_shared_body_averages_the_body_over_all_clients_and_the_head_per_cluster():
    """``shared: body``: the E-step and each head as in Eq. 8-9; every centre's body is the mean of
    ALL the round's local models' bodies, an empty cluster's too."""
    locals_ = {0: torch.tensor([0.0, 1.0, 2.0]), 1: torch.tensor([2.0, 3.0, 4.0]),
               2: torch.tensor([8.0, 9.0, 30.0]), 3: torch.tensor([10.0, 7.0, 34.0])}
    fed = HeadStubFed(StubTrainer(locals_), 4)
    centres = torch.tensor([[1.0, 1.0, 0.0], [9.0, 9.0, 30.0], [-50.0, -50.0, -50.0]])
    state = State(centres, torch.tensor([2, 2, 2, 2]))
    new, _ = FeSEM(fed, Params(K=3, lam=0.0, shared="body")).round(state, np.arange(4), rnd=1)
    assert new.assign.tolist() == [0, 0, 1, 1]
    body = torch.tensor([5.0, 5.0])                  # ([0,1] + [2,3] + [8,9] + [10,7]) / 4
    assert torch.equal(new.centres[:, :2], body.expand(3, 2))
    assert new.centres[:, 2].tolist() == [3.0, 32.0, -50.0]          # heads: cluster means; empty kept
    weighted = FeSEM(fed, Params(K=3, lam=0.0, shared="body", mstep="weighted")).round(state, np.arange(4), 1)[0]
    # weights 1, 2, 3, 4: body (1·[0,1] + 2·[2,3] + 3·[8,9] + 4·[10,7]) / 10; head 0 (1·2 + 2·4) / 3
    assert torch.allclose(weighted.centres[:, :2], torch.tensor([6.8, 6.2]).expand(3, 2))
    assert weighted.centres[0, 2] == pytest.approx(10 / 3)
    plain = FeSEM(fed, Params(K=3, lam=0.0)).round(state, np.arange(4), 1)[0]
    assert torch.equal(plain.centres[:, 2], new.centres[:, 2])          # heads: as the paper's FeSEM


def test_fesem_shared_body_init_and_k1(digits_store):
    """The shared-body centres start from the paper's k-means centres with one body, the mean of all
    first local models' bodies; with K = 1 the switch changes nothing, bitwise."""
    data = load(digits_store)
    train = {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 2, "clients_per_round": 6}
    fed = build_federation(data, {"name": "digits_cnn"}, train, seed=3)
    paper = FeSEM(fed, Params(K=3, restarts=2)).init()
    shared = FeSEM(fed, Params(K=3, restarts=2, shared="body"))
    s = shared.init()
    head = fed.model.select("head")
    assert head.stop == fed.model.n_params and head.start > 0
    assert torch.equal(s.assign, paper.assign)
    assert torch.equal(s.centres[:, head], paper.centres[:, head])
    counts = torch.bincount(paper.assign, minlength=3).float()
    body = (counts[:, None] * paper.centres[:, :head.start]).sum(0) / counts.sum()
    for k in range(3):
        assert torch.allclose(s.centres[k, :head.start], body, atol=1e-6)
    assert not torch.allclose(paper.centres[0, :head.start], paper.centres[1, :head.start])
    new, _ = shared.round(s, fed.clients(1), 1)
    assert torch.equal(new.centres[0, :head.start], new.centres[2, :head.start])
    one = [State(fed.w0.clone()[None], torch.zeros(data.n_clients, dtype=torch.long)) for _ in range(2)]
    algos = [FeSEM(fed, Params(K=1)), FeSEM(fed, Params(K=1, shared="body"))]
    for r in (1, 2):
        one = [a.round(st, fed.clients(r), r)[0] for a, st in zip(algos, one)]
    assert torch.equal(one[0].centres, one[1].centres)
    with pytest.raises(ValueError, match="shared must be 'none' or 'body'"):
        Params(shared="head")


def test_fesem_warmup_is_fesem1_until_round_r_then_kmeans_on_updates_from_the_warm_model(digits_store):
    """``warmup: R``: rounds 1..R are FeSEM(1) bitwise (every centre the same model); after round R
    the centres are the k-means initialisation of every client's local update from that model."""
    from mcfl.cluster.init import init_centres

    data = load(digits_store)
    train = {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 3, "clients_per_round": 6}
    fed = build_federation(data, {"name": "digits_cnn"}, train, seed=4)
    warm = FeSEM(fed, Params(K=3, restarts=2, warmup=2))
    s = warm.init()
    assert torch.equal(s.centres, fed.w0.expand(3, -1)) and s.assign.eq(0).all()
    one, so = FeSEM(fed, Params(K=1)), State(fed.w0.clone()[None], torch.zeros(data.n_clients, dtype=torch.long))
    s, _ = warm.round(s, fed.clients(1), 1)
    so, _ = one.round(so, fed.clients(1), 1)
    for k in range(3):
        assert torch.equal(s.centres[k], so.centres[0])
    assert s.assign.eq(0).all()
    before = s
    s, diag = warm.round(s, fed.clients(2), 2)
    so, _ = one.round(so, fed.clients(2), 2)
    ref = init_centres(fed, 3, restarts=2, start=so.centres[0], rnd=2)
    assert torch.equal(s.centres, ref.centres) and torch.equal(s.assign, ref.assign)
    assert len(torch.unique(s.assign)) == 3 and not torch.equal(s.centres[0], s.centres[1])
    assert diag["moved"] == int((s.assign != before.assign).sum())
    # the warm model's updates, not the first local models: other features, other centres
    assert not torch.equal(ref.centres, init_centres(fed, 3, restarts=2).centres)
    s3, _ = warm.round(s, fed.clients(3), 3)                 # from here on the paper's FeSEM(3)
    paper, _ = FeSEM(fed, Params(K=3, restarts=2)).round(s, fed.clients(3), 3)
    assert torch.equal(s3.centres, paper.centres) and torch.equal(s3.assign, paper.assign)


def test_fesem_warmup_recovers_rotations_from_the_warm_model(tmp_path):
    """Known cluster recovery: digits with IID labels and 4 rotations; after one warm-up round the
    k-means on the clients' updates from the common model puts each rotation in its own cluster."""
    from sklearn.metrics import adjusted_rand_score

    from mcfl.data import prepare

    store = prepare("digits", tmp_path / "store", clients=16, clusters=4, alpha=1000.0, seed=0)
    data = load(store)
    train = {"lr": 0.05, "batch_size": 10, "local_epochs": 3, "rounds": 1}
    fed = build_federation(data, {"name": "digits_cnn"}, train, seed=0)
    algo = FeSEM(fed, Params(K=4, restarts=20, warmup=1))
    s, _ = algo.round(algo.init(), fed.clients(1), 1)
    assert adjusted_rand_score(np.asarray(data.cluster), s.assign.numpy()) == 1.0


def test_fesem_warmup_needs_no_centre_file_and_is_checked():
    from mcfl.algorithms.fesem_ma import FeSEMMA
    from mcfl.algorithms.fesem_ma import Params as MAParams

    assert FeSEM.uses_centres({"K": 3, "warmup": 0}) and not FeSEM.uses_centres({"K": 3, "warmup": 5})
    assert FeSEMMA.uses_centres({"K": 3})
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="warmup must be an integer >= 0"):
            Params(warmup=bad)
    with pytest.raises(ValueError, match="FeSEM-MA has the paper's M-step only"):
        MAParams(warmup=3)
