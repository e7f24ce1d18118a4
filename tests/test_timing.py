"""Per-round seconds in every run's outputs (mcfl.timing): what the clock counts, on a fake clock."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import mcfl.timing as timing
from conftest import make_run
from mcfl.runner import train


class FakeTime:
    now = 0.0

    @classmethod
    def perf_counter(cls):
        return cls.now


class FakeTrainer:
    """``train`` takes 2 s; ``run`` takes 3 s per client plus a nested ``train`` (2 s) each."""

    def train(self, task, rnd):
        FakeTime.now += 2
        return task

    def gradient(self, w, c):
        FakeTime.now += 1
        return w

    def run(self, tasks, rnd):
        for t in tasks:
            FakeTime.now += 3
            yield t, self.train(t, rnd)


def test_local_clock_counts_nested_calls_once_and_not_the_consumers_time(monkeypatch):
    monkeypatch.setattr(timing, "time", FakeTime)
    trainer = FakeTrainer()
    clock = timing.LocalClock(trainer)
    for _ in trainer.run([1, 2], rnd=1):
        FakeTime.now += 100                 # the algorithm's own work between results: not local
    assert clock.seconds == 2 * (3 + 2)
    trainer.gradient(0, 0)
    assert clock.seconds == 11
    clock.reset()
    trainer.train(0, 1)
    assert clock.seconds == 2


def test_history_has_each_rounds_seconds_and_metrics_json_their_totals(digits_store, tmp_path):
    run = make_run(method="FeSEM", params={"K": 2}, rounds=3, eval_every=2, executor="batched")
    train(run, digits_store, tmp_path, progress=False)
    h = pd.read_csv(tmp_path / "history.csv")
    m = json.loads((tmp_path / "metrics.json").read_text())
    for c in timing.COLUMNS:
        assert (h[c] >= 0).all()
        assert m["time_s"][c[:-2]] == pytest.approx(h[c].sum(), abs=0.02)
        assert c not in m["final"]
    assert (h["local_s"] > 0).all()
    assert h["eval_s"].tolist()[1] > 0 and h["eval_s"].tolist()[0] < h["eval_s"].tolist()[1]   # round 2 evaluates
