"""Runs recorded before MLflow runs carried their run folder (no ``run_dir`` tag): a new record of
the same run (its name and parameters) supersedes them as it does its folder's older runs."""

from conftest import make_run
from mcfl.track import MLflowTracker


def test_a_record_supersedes_the_untagged_runs_of_its_name_and_parameters(mlflow_uri):
    from mlflow import MlflowClient

    from mcfl.tracked_runs import RUN_DIR_TAG, SUPERSEDED_TAG

    client = MlflowClient(mlflow_uri)
    identity = {"git": "g", "data_hash": "d", "run_hash": "h"}

    def record(run, run_dir=None):
        t = MLflowTracker("legacy", client=client, defer=False, run_dir=run_dir)
        t.start(run, identity)
        t.log({"micro_acc": 0.5}, step=1)
        t.end("FINISHED")
        return t.run_id

    fedavg = make_run(method="FedAvg")
    legacy = [record(fedavg), record(fedavg)]                  # two records before the tag existed
    other_lr = record(make_run(method="FedAvg", lr=0.05))      # same name, other parameters
    other_name = record(make_run(method="FedAvg", seed=1))     # another run
    new = record(fedavg, "results/runs/digits/FedAvg/seed0")
    exp = client.get_experiment_by_name("legacy").experiment_id
    assert {r.info.run_id for r in client.search_runs([exp])} == {other_lr, other_name, new}
    for old in legacy:
        gone = client.get_run(old)
        assert gone.info.lifecycle_stage == "deleted" and gone.data.tags[SUPERSEDED_TAG] == new
    assert client.get_run(new).data.tags[RUN_DIR_TAG] == "results/runs/digits/FedAvg/seed0"
