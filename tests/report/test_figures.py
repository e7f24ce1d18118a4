"""FeSEM Figs. 4 and 5 from a run's files, and the run's final state they read."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import make_run
from mcfl.runner import train


@pytest.fixture(scope="module")
def separable(tmp_path_factory):
    """Digits with IID labels (alpha = 1000), 16 clients of ~112 samples, 4 rotation clusters, and a
    FeSEM(4) run on it with 3 local epochs: a setting where the rotations are recovered exactly."""
    from mcfl.data import prepare

    root = tmp_path_factory.mktemp("sep")
    store = prepare("digits", root / "store", clients=16, clusters=4, alpha=1000.0, seed=0)
    run = make_run(method="FeSEM", params={"K": 4, "restarts": 3}, rounds=2, lr=0.05, batch_size=10,
                   local_epochs=3)
    run["params"] = {"K": 4, "lam": 0.1, "distance": "all", "mstep": "mean", "init": "kmeans", "restarts": 3}
    train(run, store, root / "run", progress=False)
    return store, run, root / "run"


def fig4(run, store, state, out, *, projection="pca", n_clients=400, seed=0):
    """FeSEM Fig. 4 as ``mcfl figure clusters`` makes it: the snapshot, then the drawing."""
    from mcfl.snapshot import cluster_snapshot
    from mcfl.report.figures import clusters_figure

    snap = cluster_snapshot(run, store, state, n_clients=n_clients, centres=projection == "pca", seed=seed)
    return clusters_figure(snap, out, projection=projection, seed=seed)


def test_runner_writes_final_state_of_clustered_runs_only(separable, digits_store, tmp_path):
    store, run, out = separable
    state = torch.load(out / "state.pt", weights_only=True)
    a = pd.read_csv(out / "assignments.csv")
    assert state["centres"].shape[0] == 4
    assert state["assign"].tolist() == a["cluster"].tolist()
    assert json.loads((out / "metrics.json").read_text())["partition"] == "natural"
    train(make_run(rounds=1), digits_store, tmp_path / "fedavg", progress=False)
    assert torch.load(tmp_path / "fedavg" / "state.pt", weights_only=True) == {}


def test_local_models_are_the_next_rounds_and_do_not_depend_on_the_sample(separable):
    from mcfl import algorithms
    from mcfl.data import load
    from mcfl.engine import Task
    from mcfl.federation import build_federation
    from mcfl.snapshot import local_models

    store, run, out = separable
    fed = build_federation(load(store), run["model"], run["train"], run["seed"])
    cls = algorithms.get("FeSEM")
    algo = cls(fed, cls.Params(**run["params"]))
    state = algo.load_state(torch.load(out / "state.pt", weights_only=True))
    sel = fed.model.select("all")
    every = local_models(algo, state, np.arange(16), 3, sel)
    some = local_models(algo, state, np.array([2, 11]), 3, sel)
    assert np.array_equal(every[11], some[11]) and set(some) == {2, 11}
    c, k = 11, int(state.assign[11])                      # Eq. 7 local update from the client's centre
    ref = fed.trainer.train(Task(c, state.centres[k], state.centres[k], mu=0.1), 3).weights[sel]
    assert np.array_equal(every[c], ref.numpy())
    assert "run" not in vars(fed.trainer)                 # the recording hook is removed again


def test_clusters_figure_separates_recoverable_rotations(separable, tmp_path):
    from sklearn.metrics import adjusted_rand_score, silhouette_score

    store, run, out = separable
    png = tmp_path / "fig4.png"
    summary = fig4(run, store, out / "state.pt", png, n_clients=400, seed=0)
    pts = pd.read_csv(png.with_suffix(".csv"))
    assert png.stat().st_size > 5000 and "16 of 16 clients" in summary
    assert "between-centre distance" in summary
    assert len(pts) == 16 and pts["client"].is_unique
    a = pd.read_csv(out / "assignments.csv").set_index("client")
    assert (pts["cluster"].values == a.loc[pts["client"], "cluster"].values).all()
    assert adjusted_rand_score(pts["true_cluster"], pts["cluster"]) == 1.0
    # in the 2-D picture the four rotations form four tight, separate groups
    assert silhouette_score(pts[["x", "y"]], pts["true_cluster"]) > 0.5
    few = fig4(run, store, out / "state.pt", tmp_path / "few.png", n_clients=6, seed=1,
                          projection="tsne")
    assert len(pd.read_csv(tmp_path / "few.csv")) == 6 and "tsne" in few


def test_spread_is_client_to_own_centre_over_between_centre_distance():
    """Centres (0, 0) and (10, 0); clients 1, 1 and 3 away from their own centre: median 1 / 10."""
    from mcfl.report.figures import _spread

    centres = {0: np.array([0.0, 0.0]), 1: np.array([10.0, 0.0])}
    feats = np.array([[1.0, 0.0], [10.0, 1.0], [10.0, -3.0]])
    assert _spread(feats, np.array([0, 1, 1]), centres) == pytest.approx(0.1)
    assert _spread(feats, np.array([0, 1, 1]), {0: centres[0]}) is None      # one centre: no scale


def test_clusters_figure_rejects_unclustered_runs(digits_store, tmp_path):
    train(make_run(rounds=1), digits_store, tmp_path / "r", progress=False)
    with pytest.raises(ValueError, match="does not cluster"):
        fig4(make_run(), digits_store, tmp_path / "r" / "state.pt", tmp_path / "f.png")


def test_cases_figure_picks_clients_of_each_cluster(separable, synthetic_store, tmp_path):
    from mcfl.data import load
    from mcfl.report.figures import cases_figure, pick_cases

    store, run, out = separable
    a = pd.read_csv(out / "assignments.csv")
    cases = pick_cases(a, 3, seed=0)
    assert sorted(cases) == sorted(a["cluster"].unique())
    for k, rows in cases.items():
        assert 1 <= len(rows) <= 3 and (a["cluster"].iloc[rows] == k).all()
    assert all(np.array_equal(rows, pick_cases(a, 3, seed=0)[k]) for k, rows in cases.items())
    text = cases_figure(store, out / "assignments.csv", tmp_path / "fig5.png", clients_per_cluster=2)
    assert (tmp_path / "fig5.png").stat().st_size > 5000 and text.count("cluster") == 4
    d = load(synthetic_store)                              # feature vectors: drawn as a heatmap
    fake = pd.DataFrame({"client": d.client_ids, "true_cluster": d.cluster, "cluster": d.cluster})
    fake.to_csv(tmp_path / "a.csv", index=False)
    cases_figure(synthetic_store, tmp_path / "a.csv", tmp_path / "vec.png")
    assert (tmp_path / "vec.png").stat().st_size > 5000
    with pytest.raises(ValueError, match="not those of"):
        cases_figure(store, tmp_path / "a.csv", tmp_path / "bad.png")
