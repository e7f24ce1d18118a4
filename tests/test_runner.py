"""The round loop: a shared client stream, divergence, outputs. Determinism and resume for every
algorithm: tests/test_faults.py."""

import json

import numpy as np
import pandas as pd
import pytest

from conftest import make_run
from mcfl.engine import DivergenceError
from mcfl.federation import client_stream
from mcfl.runner import train


def test_client_stream_is_shared_and_prefix_stable():
    s10 = client_stream(50, 5, seed=3, rounds=10)
    s20 = client_stream(50, 5, seed=3, rounds=20)
    assert np.array_equal(s10, s20[:10])
    assert all(len(set(r)) == 5 for r in s20)
    assert not np.array_equal(client_stream(50, 5, seed=4, rounds=10), s10)
    assert np.array_equal(client_stream(7, None, 0, 2), np.tile(np.arange(7), (2, 1)))


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
    # every test sample's final prediction, in store order: their accuracy is the reported one
    from mcfl.data import load

    data = load(digits_store)
    p = pd.read_csv(tmp_path / "predictions.csv")
    assert len(p) == sum(data.n_test()) and (p["pred"] >= 0).all()
    assert p["client"].tolist() == np.repeat(data.client_ids, data.n_test()).tolist()
    assert p["y"].tolist() == np.asarray(data.y_test).tolist()
    assert (p["y"] == p["pred"]).mean() == pytest.approx(res["final"]["micro_acc"])
