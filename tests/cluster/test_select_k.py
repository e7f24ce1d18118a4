"""K selection (FeSEM §5.2): search K on a client sample for a few rounds; K: auto feeds training."""

import json

import numpy as np
import pytest

from conftest import make_run
from mcfl.config import ConfigError, expand_runs, validate
from mcfl.data import load
from mcfl.cluster.spec import SelectK
from mcfl.select_k import select_k, sub_store


def test_sub_store_keeps_the_chosen_clients_exactly(swapped_store, tmp_path):
    data = load(swapped_store)
    chosen = np.array([1, 4, 7])
    sub = load(sub_store(data, chosen, tmp_path / "sub"))
    assert sub.client_ids == [data.client_ids[c] for c in chosen]
    assert sub.true_clusters.tolist() == data.true_clusters[chosen].tolist()
    for i, c in enumerate(chosen):
        for split in ("train", "test"):
            a, b = getattr(sub, split)(i), getattr(data, split)(int(c))
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def auto_run(criterion, clients=8):
    run = make_run("swapped", "FeSEM", {"K": "auto", "restarts": 2, "lam": 0.1, "distance": "all",
                                        "mstep": "mean", "init": "kmeans"}, rounds=20, clients_per_round=3)
    run["model"] = {"name": "logreg"}
    run["select_k"] = {"K": [1, 2, 3], "clients": clients, "rounds": 3, "criterion": criterion}
    return run


def test_select_k_by_accuracy_separates_concept_shifted_groups(swapped_store, tmp_path):
    res = select_k(auto_run("accuracy"), swapped_store, tmp_path / "k.json", threads=1)
    assert json.loads((tmp_path / "k.json").read_text())["K"] == res["K"]
    scores = {s["K"]: s["micro_acc"] for s in res["scores"]}
    assert res["K"] == max(scores, key=lambda k: (scores[k], -k))       # best accuracy, ties to small K
    assert scores[2] > scores[1] + 0.2                                  # one model cannot fit both groups
    assert res["K"] >= 2
    assert len(res["clients"]) == len(set(res["clients"])) == 8
    again = select_k(auto_run("accuracy"), swapped_store, tmp_path / "k2.json", threads=1)
    assert again["clients"] == res["clients"] and again["K"] == res["K"]


def test_select_k_by_distance_takes_the_smallest_intra_cluster_distance(swapped_store, tmp_path):
    from mcfl.runner import train

    run = auto_run("distance", clients=12)
    res = select_k(run, swapped_store, tmp_path / "k.json", threads=1)
    d = {s["K"]: s["intra_distance"] for s in res["scores"]}
    assert res["K"] == min(d, key=lambda k: (d[k], k))
    assert d[1] > 1.5 * d[2]          # one centre cannot sit near both concept groups' models
    # each score is the last-round distance of an ordinary training run with that K on the sample
    sub = sub_store(load(swapped_store), np.array(res["clients"]), tmp_path / "sub")
    for K in (1, 2):
        r = dict(run, params={**run["params"], "K": K}, select_k=None,
                 train={**run["train"], "rounds": 3, "eval_every": 3, "clients_per_round": None})
        final = train(r, sub, tmp_path / f"K{K}", threads=1, progress=False)["final"]
        assert final["intra_distance"] == pytest.approx(d[K], rel=1e-6), K


def test_k_auto_in_config_expands_to_a_select_k_run():
    cfg = {"datasets": {"d": {"prepare": {"source": "digits", "clients": 20}, "model": {"name": "digits_cnn"}}},
           "methods": [{"method": "FeSEM", "K": "auto", "select_k": {"K": [2, 3], "rounds": 2}},
                       {"method": "Robust", "K": 3, "label": "Robust(TKM)"}]}
    runs = expand_runs(validate(cfg))
    auto, robust = runs
    assert auto["label"] == "FeSEM(auto)" and auto["run_id"] == "FeSEM-Kauto" and auto["params"]["K"] == "auto"
    assert auto["select_k"] == {"K": [2, 3], "clients": 100, "rounds": 2, "criterion": "accuracy"}
    assert robust["label"] == "Robust(TKM)" and robust["run_id"] == "Robust-K3" and robust["select_k"] is None


@pytest.mark.parametrize("entry, message", [
    ({"method": "FedAvg", "K": "auto"}, r"methods\[0\]\.K: FedAvg does not take K"),
    ({"method": "FeSEM", "K": 2, "select_k": {"K": [2]}}, r"methods\[0\]\.select_k: only used with K: auto"),
    ({"method": "FeSEM", "K": "auto", "select_k": {"criterion": "loss"}}, r"methods\[0\]\.select_k\.criterion"),
    ({"method": "FeSEM", "K": "auto", "select_k": {"K": [2, 50]}}, r"K=50 is larger than the number of clients"),
    ({"method": "FeSEM", "K": [2, 3], "label": "X"}, r"methods\[0\]\.label: one label for 2 values of K"),
])
def test_bad_k_selection_configs_name_the_key(entry, message):
    cfg = {"datasets": {"d": {"prepare": {"source": "digits", "clients": 20}, "model": {"name": "digits_cnn"}}},
           "methods": [entry]}
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_select_k_settings_validate():
    with pytest.raises(ValueError, match="criterion"):
        SelectK(criterion="loss")
