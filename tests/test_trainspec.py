"""TrainSpec: a run's train settings, typed, with the defaults of the config schema and nowhere else."""

import dataclasses

import pytest

from mcfl.config import validate
from mcfl.engine import LocalSpec
from mcfl.trainspec import DEFAULTS, FILLED, TrainSpec


def test_defaults_are_the_schemas_and_validation_fills_the_same():
    cfg = validate({"experiment": "t", "seeds": [0],
                    "datasets": {"d": {"prepare": {"source": "digits"}, "model": {"name": "digits_cnn"}}},
                    "methods": [{"method": "FedAvg"}]})
    assert cfg["datasets"]["d"]["train"] == FILLED
    assert set(DEFAULTS) - set(FILLED) == {"max_grad_norm", "eval_protocols", "precision",
                                           "clients_per_cluster"}   # absent = off
    assert [f.name for f in dataclasses.fields(TrainSpec)] == list(DEFAULTS)
    assert TrainSpec.of({}) == TrainSpec(**DEFAULTS)
    assert LocalSpec(lr=0.1) == LocalSpec.of(TrainSpec.of({"lr": 0.1}))         # LocalSpec's defaults too


def test_of_fills_defaults_and_rejects_unknown_settings():
    t = TrainSpec.of({"lr": 0.5, "local_steps": 3, "executor": "batched"})
    assert (t.lr, t.local_steps, t.executor, t.rounds) == (0.5, 3, "batched", DEFAULTS["rounds"])
    assert TrainSpec.of(t) is t
    with pytest.raises(ValueError, match="unknown train settings: epochs"):
        TrainSpec.of({"epochs": 2})
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.lr = 1.0
    local = LocalSpec.of(t)
    assert (local.lr, local.steps, local.batch_size, local.epochs) == (0.5, 3, DEFAULTS["batch_size"], 1)
    assert set(TrainSpec.LOCAL_KEYS) <= set(DEFAULTS)


def test_schema_parsed_with_libyaml_is_the_pure_python_parse():
    import yaml

    from mcfl.config import _schema
    from mcfl.trainspec import SCHEMA_PATH, read_schema

    assert read_schema() == yaml.safe_load(SCHEMA_PATH.read_text())
    a = read_schema()
    a["$defs"]["train"]["properties"]["rounds"]["default"] = -1    # callers' edits stay theirs
    assert read_schema() == yaml.safe_load(SCHEMA_PATH.read_text())
    assert _schema()["$defs"]["method"]["properties"]["model"]["properties"]["name"]["enum"]  # enums filled in
