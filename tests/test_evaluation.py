"""Evaluation protocols (mcfl.evaluation): the FeSEM authors' choices as switches, on a case small
enough to count by hand, and the standard protocol as their common base."""

import numpy as np
import pytest
import torch

from conftest import make_run
from mcfl.data import load, write_store
from mcfl.data.store import ClientData
from mcfl.evaluation import Protocol, RoundCache, evaluate, evaluate_protocol
from mcfl.federation import build_federation

# test labels per client, and training-set sizes (the V1 weights are train + test samples)
Y_TEST = {"c0": [0, 0], "c1": [0, 1, 1, 1], "c2": [1, 1], "c3": [0, 1]}
N_TRAIN = {"c0": 2, "c1": 4, "c2": 2, "c3": 6}


class TwoModels:
    """Clusters {c0, c1} -> a model that always says 0, {c2, c3} -> one that always says 1."""

    name = "stub"
    clustered = True

    def __init__(self, fed):
        self.fed = fed

    def eval_models(self, state):
        return [(torch.zeros(1), np.array([0, 1])), (torch.ones(1), np.array([2, 3]))]

    def predict(self, w, rows, state=None):
        return torch.full((len(rows),), int(w[0])), torch.zeros(len(rows))

    def assignments(self, state):
        return np.array([0, 0, 1, 1])

    def extra_metrics(self, state):
        return {}


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    clients = [ClientData(u, np.zeros((N_TRAIN[u], 3), np.float32), np.zeros(N_TRAIN[u], np.int64),
                          np.zeros((len(y), 3), np.float32), np.array(y)) for u, y in Y_TEST.items()]
    store = write_store(tmp_path_factory.mktemp("eval") / "s", clients, n_classes=2, source="test",
                        params={})
    f = build_federation(load(store), {"name": "logreg"}, make_run(rounds=1)["train"], seed=0)
    f.clients = lambda rnd: np.array([1, 3])        # the active clients of every round: c1 and c3
    return f


def test_standard_protocol_pools_over_clients(fed):
    out, pred = evaluate(TwoModels(fed), None, fed)
    # per-client accuracy 1, 1/4, 1, 1/2 on 2, 4, 2, 2 test samples
    assert out["micro_acc"] == pytest.approx(6 / 10) and out["macro_acc"] == pytest.approx(2.75 / 4)
    assert pred.tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert evaluate_protocol(Protocol(), TwoModels(fed), None, fed, 1) == \
        {k: pytest.approx(out[k]) for k in ("micro_acc", "macro_acc", "micro_f1", "macro_f1")}


def test_v1_cluster_mean_weights_by_train_plus_test_samples_then_averages_clusters(fed):
    out = evaluate_protocol(Protocol(combine="cluster_mean"), TwoModels(fed), None, fed, 1)
    a = (4 * 1 + 8 * 0.25) / 12                       # cluster {c0, c1}: sizes 2+2, 4+4
    b = (4 * 1 + 8 * 0.5) / 12                        # cluster {c2, c3}: sizes 2+2, 6+2
    assert out["micro_acc"] == pytest.approx((a + b) / 2)
    assert out["macro_acc"] == pytest.approx(((1 + 0.25) / 2 + (1 + 0.5) / 2) / 2)
    assert out["micro_f1"] == out["macro_acc"]        # per-device micro-F1 is accuracy


def test_v2_cluster_max_tests_everyone_on_every_model(fed):
    out = evaluate_protocol(Protocol(combine="cluster_max"), TwoModels(fed), None, fed, 1)
    # all on "0": 2+1+0+1 of 10 right; all on "1": 0+3+2+1 of 10 right
    assert out["micro_acc"] == pytest.approx(0.6)
    assert out["macro_acc"] == pytest.approx((0 + 0.75 + 1 + 0.5) / 4)    # under the last model


def test_v2_scores_personal_and_single_models_as_the_standard_protocol(fed):
    """cluster_max tests every client on every *cluster* model; one model per client (NoFed) or
    one model for all are scored as the standard protocol."""
    class Personal(TwoModels):
        clustered = False

        def eval_models(self, state):      # the own models of c0..c3 say 1, 0, 1, 1
            return [(torch.full((1,), int(i != 1)), np.array([i])) for i in range(4)]

    out = evaluate_protocol(Protocol(combine="cluster_max"), Personal(fed), None, fed, 1)
    standard, _ = evaluate(Personal(fed), None, fed)
    # own models: c0 0 of 2, c1 1 of 4, c2 2 of 2, c3 1 of 2 right (everyone on the "1" models
    # would score 6 of 10)
    assert out["micro_acc"] == pytest.approx(4 / 10) == standard["micro_acc"]
    assert out["macro_acc"] == pytest.approx((0 + 0.25 + 1 + 0.5) / 4)


def test_active_clients_only(fed):
    out = evaluate_protocol(Protocol(clients="active"), TwoModels(fed), None, fed, 1)
    assert out["micro_acc"] == pytest.approx(2 / 6)   # c1: 1 of 4, c3: 1 of 2
    v1 = evaluate_protocol(Protocol(clients="active", combine="cluster_mean"), TwoModels(fed), None, fed, 1)
    assert v1["micro_acc"] == pytest.approx((0.25 + 0.5) / 2)


class Counted(TwoModels):
    """The two clusters with real (logistic) models; counts the test rows it predicts."""

    def __init__(self, fed):
        super().__init__(fed)
        self.w, self.rows = [fed.w0.clone(), fed.w0 + 0.5], 0

    def eval_models(self, state):
        return [(self.w[0], np.array([0, 1])), (self.w[1], np.array([2, 3]))]

    def predict(self, w, rows, state=None):
        self.rows += len(rows)
        return self.fed.trainer.predict(w, rows)


def test_a_rounds_protocols_share_predictions_and_fine_tuning(fed, monkeypatch):
    """With one RoundCache a protocol scores as it does alone, but every client is predicted once
    per model and fine-tuned once per model for all the protocols that fine-tune."""
    protos = [Protocol(), Protocol(combine="cluster_max"), Protocol(clients="active", finetune_epochs=1),
              Protocol(clients="active", finetune_epochs=1, combine="cluster_mean")]
    alone = [evaluate_protocol(p, Counted(fed), None, fed, 1) for p in protos]
    tuned, train = [], fed.trainer.train
    monkeypatch.setattr(fed.trainer, "train", lambda task, *a: tuned.append(task.client) or train(task, *a))
    algo = Counted(fed)
    cache = RoundCache(algo, None, fed, 1)
    standard, _ = evaluate(algo, None, fed, rnd=1, cache=cache)
    shared = [evaluate_protocol(p, algo, None, fed, 1, cache) for p in protos]
    for a, b in zip(alone, shared):
        assert b == pytest.approx(a)
    assert shared[0] == pytest.approx({k: standard[k] for k in shared[0]})
    assert sorted(tuned) == [1, 3]          # the active clients c1, c3: once each, for two protocols
    # every client on both models (10 test rows each), plus c1's 4 and c3's 2 rows after fine-tuning
    assert algo.rows == 2 * 10 + 4 + 2


def test_fine_tuning_stacks_under_the_batched_executor(digits_store, monkeypatch):
    """A model's fine-tuned clients go to the executor in one call, and each client's predictions,
    made as the batched executor yields its fine-tuned model chunk by chunk, are those of the
    model it fine-tuned (collected first and predicted afterwards), bit for bit."""
    import dataclasses

    from mcfl import algorithms
    from mcfl.engine import Task
    from mcfl.streams import FINETUNE

    fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                           {"lr": 0.2, "rounds": 1, "batch_size": 10, "local_epochs": 1,
                            "executor": "batched", "executor_chunk": 3}, seed=0)
    algo = algorithms.get("FedAvg")(fed, algorithms.get("FedAvg").Params())
    state = algo.init()
    calls, run = [], fed.trainer.run
    monkeypatch.setattr(fed.trainer, "run", lambda tasks, *a: calls.append(len(tasks)) or run(tasks, *a))
    clients = np.arange(8)
    owners, rows, preds, losses = RoundCache(algo, state, fed, 1).tested(0, clients, 1)
    assert calls == [8]                                       # one call for all 8 clients
    spec = dataclasses.replace(fed.trainer.spec, epochs=1, steps=None)
    tuned = {t.client: r.weights for t, r in run([Task(int(c), state.w) for c in clients], 1, FINETUNE, spec)}
    off = fed.dev.offsets["test"]
    for c in clients:
        p, loss = algo.predict(tuned[int(c)], torch.arange(off[c], off[c + 1]), state)
        assert np.array_equal(p.numpy(), preds[owners == c]) and np.array_equal(loss.numpy(), losses[owners == c])
    plain = RoundCache(algo, state, fed, 1).tested(0, clients, 0)            # fine-tuning changed them
    assert not np.array_equal(plain[3], losses)


def test_protocol_switches_are_checked():
    with pytest.raises(ValueError, match="combine must be one of"):
        Protocol(combine="max")
    with pytest.raises(ValueError, match="clients must be one of"):
        Protocol(clients="some")


@pytest.mark.slow
def test_a_run_records_each_protocol_on_the_same_model(digits_store, tmp_path):
    """Fine-tuning as a protocol equals the standard evaluation with finetune_epochs, and the
    protocol columns sit beside the standard ones in history.csv and metrics.json."""
    import pandas as pd

    from mcfl.runner import train

    protos = {"ft": {"finetune_epochs": 1}, "plain": {}, "v1": {"clients": "active", "combine": "cluster_mean"}}
    run = make_run(method="FeSEM", params={"K": 2, "restarts": 2}, rounds=2, clients_per_round=6,
                   eval_protocols=protos)
    res = train(run, digits_store, tmp_path / "a", threads=1, progress=False)
    tuned = train(make_run(method="FeSEM", params={"K": 2, "restarts": 2}, rounds=2,
                           clients_per_round=6, finetune_epochs=1),
                  digits_store, tmp_path / "b", threads=1, progress=False)
    f = res["final"]
    assert f["plain/micro_acc"] == pytest.approx(f["micro_acc"])
    assert f["ft/micro_acc"] == pytest.approx(tuned["final"]["micro_acc"])
    assert f["ft/micro_acc"] != pytest.approx(f["micro_acc"])
    h = pd.read_csv(tmp_path / "a" / "history.csv")
    assert {"v1/micro_acc", "ft/macro_f1"} <= set(h.columns) and h["v1/micro_acc"].notna().all()


def test_a_run_with_eval_protocols_passes_the_cli_check_and_a_bad_one_is_named():
    """`mcfl train --run JSON` validates the run's `train` block, whose eval_protocols entry refers to
    another schema definition: it must resolve (it did not, so every such job failed)."""
    import json

    from mcfl.config import ConfigError, expand_runs, parse_run

    cfg = {"seeds": [0], "datasets": {"d": {"prepare": {"source": "digits"}, "model": {"name": "digits_cnn"},
                                            "train": {"rounds": 1, "eval_protocols": {"v1": {"clients": "active"}}}}},
           "methods": [{"method": "FedAvg"}]}
    from mcfl.config import validate

    run = expand_runs(validate(cfg))[0]
    assert parse_run(json.dumps(run))["train"]["eval_protocols"] == {"v1": {"clients": "active"}}
    run["train"]["eval_protocols"] = {"v1": {"clients": "some"}}
    with pytest.raises(ConfigError, match="eval_protocols.v1.clients"):
        parse_run(json.dumps(run))
