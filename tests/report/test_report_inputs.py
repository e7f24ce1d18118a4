"""Report commands check their inputs: ``report-writers`` refuses assignments naming a client the
store lacks or a cluster no run has, ``fedgsp heatmap``/``kappa`` refuse runs that are not FedGSP
runs, and ``report-protocols`` leaves the paper's FEMNIST numbers out beside runs on other data;
each refusal is one line naming the file, with nothing written."""

import json

import numpy as np
import pandas as pd
import pytest

from mcfl.cli import main
from test_protocols_report import fake_run


def _one_line(err: str, cmd: str, *parts: str) -> None:
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if ": error: " in x]
    assert len(lines) == 1 and lines[0].startswith(f"mcfl {cmd}: error: "), err
    assert all(p in lines[0] for p in parts), lines[0]


@pytest.fixture
def store(tmp_path):
    from mcfl.data import write_store
    from mcfl.data.store import ClientData

    rng = np.random.default_rng(0)
    clients = [ClientData(f"w{i}", rng.random((3, 784), dtype=np.float32), rng.integers(0, 62, 3),
                          rng.random((1, 784), dtype=np.float32), np.array([0])) for i in range(4)]
    return write_store(tmp_path / "s", clients, n_classes=62, source="test", params={})


def _assignments(d, clients, clusters):
    pd.DataFrame({"client": clients, "true_cluster": "", "cluster": clusters}).to_csv(
        d / "assignments.csv", index=False)


@pytest.mark.parametrize("clients, clusters, message", [
    (["w0", "w1", "w2", "zz"], [0, 0, 1, 1], "client 'zz' is not a client of the store"),
    (["w0", "w1", "w2", "w3"], [0, 0, 1, 999999999], "client 'w3' has cluster 999999999"),
    (["w0", "w1", "w2", "w3"], [0, 0, 1, -1], "client 'w3' has cluster -1"),
    (["w0", "w1", "w2", "w3"], [0, 0, 1, 0.5], "client 'w3' has cluster 0.5"),
    (["w0", "w1", "w1", "w3"], [0, 0, 1, 1], "client 'w1' is named twice"),
])
def test_report_writers_refuses_assignments_the_store_does_not_fit(clients, clusters, message, store,
                                                                  tmp_path, capsys):
    d = fake_run(tmp_path / "runs", "FeSEM(2)", 0, 0.5)
    _assignments(d, clients, clusters)
    out = tmp_path / "out" / "w"
    assert main(["report-writers", "--store", str(store), "--out", str(out), str(d)]) == 1
    _one_line(capsys.readouterr().err, "report-writers", str(d / "assignments.csv"), message)
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_report_writers_reads_valid_assignments(store, tmp_path):
    d = fake_run(tmp_path / "runs", "FeSEM(2)", 0, 0.5)
    _assignments(d, ["w0", "w1", "w2", "w3"], [0, 0, 1, 1])
    assert main(["report-writers", "--store", str(store), "--out", str(tmp_path / "out" / "w"), str(d)]) == 0
    t = pd.read_csv(tmp_path / "out" / "w.csv")
    assert set(t["clusters"]) == {2}


def _gsp_run(root, label, seed, params):
    d = fake_run(root, label, seed, 0.5)
    m = json.loads((d / "metrics.json").read_text())
    m.update(method=label.split("(")[0], params=params, final={"micro_acc": 0.5, "test_loss": 1.0})
    (d / "metrics.json").write_text(json.dumps(m))
    pd.DataFrame({"round": [1], "micro_acc": [0.5], "test_loss": [1.0]}).to_csv(d / "history.csv", index=False)
    return d


def test_fedgsp_heatmap_on_a_fedavg_run_is_one_line(tmp_path, capsys):
    gsp = _gsp_run(tmp_path / "runs", "FedGSP", 0, {"growth": "linear", "alpha": 1.0, "beta": 2})
    avg = _gsp_run(tmp_path / "runs", "FedAvg", 0, {})
    assert main(["fedgsp", "heatmap", str(gsp), str(avg), "--out", str(tmp_path / "out")]) == 1
    _one_line(capsys.readouterr().err, "fedgsp", str(avg / "metrics.json"),
              "a FedAvg run has no parameter 'growth'; this figure compares FedGSP runs")
    assert not (tmp_path / "out").exists()


def _with_source(d, dataset, source):
    m = json.loads((d / "metrics.json").read_text())
    m.update(dataset=dataset, config={"dataset": dataset, "data": {"source": source}})
    (d / "metrics.json").write_text(json.dumps(m))


def test_report_protocols_leaves_the_paper_out_beside_runs_on_other_data(tmp_path):
    from mcfl.report.protocols import write

    runs = [fake_run(tmp_path / "runs", label, 0, acc) for label, acc in (("FedAvg", 0.8), ("FeSEM(2)", 0.85))]
    for d in runs:
        _with_source(d, "digits", "digits")
    t = write(runs, tmp_path / "out" / "p")
    assert t["paper_mean"].isna().all()
    md = (tmp_path / "out" / "p.md").read_text()
    assert md.startswith("# FeSEM's Table 2 protocols on digits\n") and "FEMNIST writers" not in md.split("\n")[0]
    assert "these runs are on digits, not on FEMNIST" in md
    assert "84.9" not in md                                  # the paper's FedAvg


def test_report_protocols_keeps_the_paper_beside_femnist_runs(tmp_path):
    from mcfl.report.protocols import TITLE, write

    runs = [fake_run(tmp_path / "runs", label, 0, acc) for label, acc in (("FedAvg", 0.8), ("FeSEM(2)", 0.85))]
    for d in runs:
        _with_source(d, "femnist_sample", "femnist")
    t = write(runs, tmp_path / "out" / "p")
    assert t.set_index("method").loc["FedAvg", "paper_mean"] == pytest.approx(84.9)
    assert (tmp_path / "out" / "p.md").read_text().startswith(f"# {TITLE}\n")


@pytest.mark.parametrize("flags, message", [
    (["--train", "["], "--train: not JSON"),
    (["--train", "{}"], "--train: must be a JSON list, found dict"),
    (["--train", "[1]"], "--train: 1 is not allowed: each entry must be a JSON object"),
    (["--train", "[{}]", "--cost", '{"bogus": 1}'], "--cost: unknown constant 'bogus'; known: n_calc"),
    (["--train", "[{}]", "--cost", "[1]"], "--cost: must be a JSON object, found list"),
    (["--train", "[{}]", "--cost", '{"flops": -1}'], "--cost: flops: -1 is not allowed"),
])
def test_fedgsp_json_flags_are_checked_naming_the_flag(flags, message, tmp_path, capsys):
    assert main(["fedgsp", "kappa", str(tmp_path / "run"), "--store", str(tmp_path / "s"), *flags,
                 "--out", str(tmp_path / "out")]) == 1
    _one_line(capsys.readouterr().err, "fedgsp", message)
    assert not (tmp_path / "out").exists()


def test_report_writers_names_a_store_whose_samples_are_not_images(tmp_path, capsys):
    from mcfl.data import write_store
    from mcfl.data.store import ClientData

    rng = np.random.default_rng(0)
    clients = [ClientData(f"w{i}", rng.random((3, 5), dtype=np.float32), rng.integers(0, 3, 3),
                          rng.random((1, 5), dtype=np.float32), np.array([0])) for i in range(4)]
    store = write_store(tmp_path / "s", clients, n_classes=3, source="test", params={})
    d = fake_run(tmp_path / "runs", "FeSEM(2)", 0, 0.5)
    _assignments(d, ["w0", "w1", "w2", "w3"], [0, 0, 1, 1])
    assert main(["report-writers", "--store", str(store), "--out", str(tmp_path / "out" / "w"), str(d)]) == 1
    _one_line(capsys.readouterr().err, "report-writers", str(store),
              "samples of shape [5] are not one-channel square images")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, message", [("", "not a run's CSV"), ("a,b\n1,2\n", "no column 'y'"),
                                           ("y,pred\n\xff\n", "not a run's CSV")])
def test_a_runs_unreadable_predictions_csv_is_named(text, message, tmp_path):
    from mcfl.io import read_run

    d = fake_run(tmp_path / "runs", "FedAvg", 0, 0.5)
    (d / "predictions.csv").write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=rf"predictions\.csv: {message}"):
        read_run(d, predictions=True)


def test_fedgsp_table_names_a_run_without_test_loss(tmp_path, capsys):
    gsp = _gsp_run(tmp_path / "runs", "FedGSP", 0, {"growth": "linear", "alpha": 1.0, "beta": 2})
    m = json.loads((gsp / "metrics.json").read_text())
    del m["final"]["test_loss"]
    (gsp / "metrics.json").write_text(json.dumps(m))
    assert main(["fedgsp", "heatmap", str(gsp), "--out", str(tmp_path / "out")]) == 1
    _one_line(capsys.readouterr().err, "fedgsp", f"{gsp}: no final.test_loss")


def test_report_fedcg_names_an_empty_predictions_csv(tmp_path, capsys):
    d = fake_run(tmp_path / "runs", "FedAvg", 0, 0.5)
    (d / "predictions.csv").write_text("")
    assert main(["report-fedcg", "--out", str(tmp_path / "out"), str(d)]) == 1
    _one_line(capsys.readouterr().err, "report-fedcg", f"{d / 'predictions.csv'}: not a run's CSV")
