"""The round loop: determinism, a shared client stream, resume from a checkpoint, divergence."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import make_run
from mcfl.engine import DivergenceError
from mcfl.federation import client_stream
from mcfl.runner import train


def test_same_seed_same_metrics_bitwise(digits_store, tmp_path):
    for method, params in [("FedAvg", {}), ("FeSEM", {"K": 2, "restarts": 2})]:
        run = make_run(method=method, params=params, clients_per_round=8)
        a = train(run, digits_store, tmp_path / "a", progress=False)
        b = train(run, digits_store, tmp_path / "b", progress=False)
        assert a["final"] == b["final"]
        assert (tmp_path / "a" / "history.csv").read_bytes() == (tmp_path / "b" / "history.csv").read_bytes()
        c = train(dict(run, seed=1), digits_store, tmp_path / "c", progress=False)
        assert c["final"] != a["final"]


def test_client_stream_is_shared_and_prefix_stable():
    s10 = client_stream(50, 5, seed=3, rounds=10)
    s20 = client_stream(50, 5, seed=3, rounds=20)
    assert np.array_equal(s10, s20[:10])
    assert all(len(set(r)) == 5 for r in s20)
    assert not np.array_equal(client_stream(50, 5, seed=4, rounds=10), s10)
    assert np.array_equal(client_stream(7, None, 0, 2), np.tile(np.arange(7), (2, 1)))


def test_resume_from_checkpoint_equals_uninterrupted(digits_store, tmp_path, monkeypatch):
    from mcfl.algorithms.fesem import FeSEM

    run = make_run(method="FeSEM", params={"K": 2, "restarts": 2}, rounds=6, clients_per_round=8,
                   checkpoint_every=2)
    full = train(run, digits_store, tmp_path / "full", progress=False)
    real_round = FeSEM.round

    def dying_round(self, state, clients, rnd):      # the job is killed during round 5
        if rnd == 5:
            raise KeyboardInterrupt
        return real_round(self, state, clients, rnd)

    ck = tmp_path / "ck.pt"
    monkeypatch.setattr(FeSEM, "round", dying_round)
    with pytest.raises(KeyboardInterrupt):
        train(run, digits_store, tmp_path / "resumed", checkpoint=ck, progress=False)
    monkeypatch.setattr(FeSEM, "round", real_round)
    assert torch.load(ck, weights_only=True)["round"] == 4
    assert not (tmp_path / "resumed" / "metrics.json").exists()
    resumed = train(run, digits_store, tmp_path / "resumed", checkpoint=ck, progress=False)
    assert resumed["final"] == full["final"]
    assert not ck.exists()                                     # removed once the run is done
    h = pd.read_csv(tmp_path / "resumed" / "history.csv")
    assert h["round"].tolist() == list(range(1, 7))


def test_divergence_names_round_and_client_and_writes_no_metrics(digits_store, tmp_path):
    run = make_run(lr=1e6, rounds=3)
    with pytest.raises(DivergenceError, match=r"round 1, client \d+"):
        train(run, digits_store, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_outputs_have_assignments_and_identity(digits_store, tmp_path):
    run = make_run(method="FeSEM", params={"K": 4, "restarts": 3}, rounds=2)
    res = train(run, digits_store, tmp_path, progress=False)
    a = pd.read_csv(tmp_path / "assignments.csv")
    assert len(a) == 16 and set(a["cluster"]) <= {0, 1, 2, 3}
    assert (a["true_cluster"].values >= 0).all()
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["data_hash"] and m["git"] and {"ari", "nmi", "micro_acc"} <= set(m["final"])
