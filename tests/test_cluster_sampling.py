"""Per-cluster client sampling (``train.clients_per_cluster``, FeSEM's authors' code: 2 clients of
each cluster a round): which clients a round trains, how many per cluster, the seeded stream, the
config checks, and the round loop training exactly the drawn clients."""

import numpy as np
import pandas as pd
import pytest

from conftest import make_run
from mcfl.algorithms.fesem import FeSEM
from mcfl.federation import cluster_clients, round_clients
from mcfl.runner import sampled_columns, train

# clusters 0: {0, 1, 2}; 1: {3, 4}; 2: {5}; 3: none; 4: {6}
ASSIGN = np.array([0, 0, 0, 1, 1, 2, 4])


def test_two_per_cluster_hand_checked():
    """Two of cluster 0's three members; all of clusters 1 (two), 2 and 4 (one each); none of the
    empty cluster 3: 2 + 2 + 1 + 1 = 6 clients, sorted, every round and seed."""
    seen = set()
    for seed in range(4):
        for rnd in range(1, 11):
            c = cluster_clients(ASSIGN, 2, seed, rnd)
            assert c.dtype == np.int64 and list(c) == sorted(c) and len(set(c)) == len(c) == 6
            assert {3, 4, 5, 6} <= set(c)
            zero = set(c) & {0, 1, 2}
            assert len(zero) == 2
            seen.add(frozenset(zero))
            assert np.bincount(ASSIGN[c], minlength=5).tolist() == [2, 2, 1, 0, 1]
    assert len(seen) == 3            # every pair of cluster 0 is drawn over 40 rounds


def test_more_per_cluster_than_members_trains_everyone():
    assert cluster_clients(ASSIGN, 3, 0, 1).tolist() == list(range(7))
    one = cluster_clients(ASSIGN, 1, 0, 1).tolist()         # one of {0, 1, 2}, one of {3, 4}, 5, 6
    assert len(one) == 4 and one[0] in (0, 1, 2) and one[1] in (3, 4) and one[2:] == [5, 6]


def test_seeded_from_the_client_stream():
    """Deterministic per (seed, round); one cluster holding every client gives exactly the
    clients_per_round draw of the same stream."""
    a = [cluster_clients(ASSIGN, 2, 5, r).tolist() for r in range(1, 21)]
    assert a == [cluster_clients(ASSIGN, 2, 5, r).tolist() for r in range(1, 21)]
    assert a != [cluster_clients(ASSIGN, 2, 6, r).tolist() for r in range(1, 21)]
    for seed in range(3):
        for rnd in range(1, 6):
            assert np.array_equal(cluster_clients(np.zeros(40, dtype=int), 7, seed, rnd),
                                  round_clients(40, 7, seed, rnd))


def test_sampled_columns():
    assert sampled_columns(None, np.array([0, 1])) == {}
    assert sampled_columns(ASSIGN, np.array([1, 2, 3, 6])) == \
        {"sampled/0": 2, "sampled/1": 1, "sampled/2": 0, "sampled/3": 0, "sampled/4": 1}


def test_round_loop_trains_two_clients_of_each_cluster(digits_store, tmp_path, monkeypatch):
    """FeSEM(3) on 16 clients: every round trains exactly the clients drawn from the clustering it
    starts from, min(2, members) of each cluster, and the V1 `active` protocol scores those."""
    trained = []
    orig = FeSEM.round

    def spy(self, state, clients, rnd):
        expected = cluster_clients(state.assign.numpy(), 2, self.fed.seed, rnd)
        assert np.array_equal(clients, expected)
        trained.append((state.assign.numpy().copy(), np.asarray(clients).copy()))
        return orig(self, state, clients, rnd)

    monkeypatch.setattr(FeSEM, "round", spy)
    run = make_run(method="FeSEM", params={"K": 3, "restarts": 2, "init": "random"}, rounds=4,
                   clients_per_cluster=2, clients_per_round=None,
                   eval_protocols={"active": {"clients": "active"}})
    train(run, digits_store, tmp_path, progress=False)
    hist = pd.read_csv(tmp_path / "history.csv")
    assert len(trained) == 4
    for (assign, clients), (_, row) in zip(trained, hist.iterrows()):
        sizes = np.bincount(assign, minlength=3)
        counts = np.bincount(assign[clients], minlength=3)
        assert counts.tolist() == np.minimum(sizes, 2).tolist()
        assert [row[f"sampled/{k}"] for k in range(3)] == counts.tolist()
    assert hist["active/micro_acc"].notna().all()


def test_config_rejects_per_cluster_sampling_without_clusters(tmp_path):
    from mcfl.config import ConfigError, load_config

    base = {"datasets": {"d": {"prepare": {"source": "digits", "clients": 8}, "model": {"name": "digits_cnn"},
                               "train": {"rounds": 2}}}}
    import yaml

    for methods, msg in (([{"method": "FedAvg", "train": {"clients_per_cluster": 2}}], "no clusters"),
                         ([{"method": "FeSEM", "K": 2, "train": {"clients_per_cluster": 2,
                                                                  "clients_per_round": 4}}],
                          "clients_per_round: null")):
        p = tmp_path / "c.yaml"
        p.write_text(yaml.safe_dump({**base, "methods": methods}))
        with pytest.raises(ConfigError, match=msg):
            load_config(p)
    p.write_text(yaml.safe_dump({**base, "methods": [{"method": "FeSEM", "K": 2, "train": {"clients_per_cluster": 2}}]}))
    cfg = load_config(p)
    assert cfg["methods"][0]["train"]["clients_per_cluster"] == 2
