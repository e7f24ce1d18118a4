"""Divergence watch (mcfl.divergence): a loss far above its running minimum marks the round in
history.csv, metrics.json, the log and both report tables; a run without a jump is left as it was."""

import json
import logging

import pandas as pd
import pytest
from conftest import make_run

from mcfl.divergence import DivergenceWatch, summary


# --------------------------------------------------------------------------------- the rule by hand
def test_a_jump_is_above_factor_times_the_running_minimum_or_the_floor():
    w = DivergenceWatch(factor=10, floor=0.1)
    # train loss 2.3 -> 0.5 -> 0.02: minimum 0.02, but the floor 0.1 sets the bar at 10 x 0.1 = 1.0
    assert w.check({"round": 1, "train_loss": 2.3}) is None
    assert w.check({"round": 2, "train_loss": 0.5}) is None
    assert w.check({"round": 3, "train_loss": 0.02}) is None
    assert w.check({"round": 4, "train_loss": 0.9}) is None          # 45x the minimum, below 1.0
    why = w.check({"round": 5, "train_loss": 1.11})                    # above 1.0
    assert why == "train_loss 1.11 > 10 x max(lowest 0.02, 0.1)"
    # above the floor the minimum itself sets the bar: test loss 0.5 -> 4.9 no, 5.1 yes
    w = DivergenceWatch(factor=10, floor=0.1)
    assert w.check({"test_loss": 0.5}) is None
    assert w.check({"test_loss": 4.9}) is None
    assert w.check({"test_loss": 5.1}) == "test_loss 5.1 > 10 x max(lowest 0.5, 0.1)"


def test_each_loss_has_its_own_minimum_and_missing_values_are_skipped():
    w = DivergenceWatch()
    assert w.check({"train_loss": 0.05, "test_loss": 2.0}) is None
    # train 0.9 is under 10 x 0.1; test 10.4 is over 10 x 0.1 but under 10 x 2.0: no jump
    assert w.check({"train_loss": 0.9, "test_loss": float("nan")}) is None
    assert w.check({"train_loss": 0.9}) is None
    assert w.best == {"train_loss": 0.05, "test_loss": 2.0}
    why = w.check({"train_loss": 1.5, "test_loss": 25.0})
    assert why.startswith("train_loss 1.5 > ") and "; test_loss 25 > 10 x max(lowest 2, 0.1)" in why


def test_a_resumed_history_sets_the_minima_without_marking():
    rows = [{"round": 1, "train_loss": 2.0}, {"round": 2, "train_loss": 0.01},
            {"round": 3, "train_loss": 5.0, "diverged": "train_loss 5 > ..."}]
    w = DivergenceWatch()
    w.replay(rows)
    assert w.best == {"train_loss": 0.01}
    assert w.check({"train_loss": 1.2}) is not None
    assert summary(rows) == {"round": 3, "reason": "train_loss 5 > ...", "rounds": [3]}
    assert summary(rows[:2]) is None


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="factor must be > 1"):
        DivergenceWatch(factor=1)
    with pytest.raises(ValueError, match="floor must be >= 0"):
        DivergenceWatch(floor=-1)


# ------------------------------------------------------------------------------------ a real run
def _blow_up_at(monkeypatch, rnd: int, scale: float):
    """FedAvg's global model multiplied by ``scale`` after round ``rnd``'s aggregation: the model a
    too-large step would leave (finite, confidently wrong)."""
    from mcfl import algorithms

    cls = algorithms.get("FedAvg")
    real = cls.round

    def round_(self, state, clients, r):
        state, diag = real(self, state, clients, r)
        if r == rnd:
            state = type(state)(state.w * scale)
        return state, diag

    monkeypatch.setattr(cls, "round", round_)


def _train(store, out, **train):
    from mcfl.runner import train as run_train

    run = make_run("synthetic", rounds=6, lr=0.05, **train)
    return run_train(run, store, out, device="cpu", progress=False)


@pytest.mark.faults
def test_a_run_whose_model_blows_up_is_marked(synthetic_store, tmp_path, monkeypatch, caplog):
    _blow_up_at(monkeypatch, 4, 200.0)
    with caplog.at_level(logging.WARNING, logger="mcfl"):
        result = _train(synthetic_store, tmp_path / "bad")
    h = pd.read_csv(tmp_path / "bad" / "history.csv")
    flagged = h.loc[h["diverged"].notna(), "round"].tolist()
    # round 4's evaluation sees the blown-up model; its test loss is the first jump
    assert flagged[0] == 4 and flagged == list(range(4, 4 + len(flagged)))
    first_loss, best = h["test_loss"][3], h["test_loss"][:3].min()
    assert first_loss > 10 * max(best, 0.1)
    assert h["diverged"][3].startswith("test_loss ")
    m = json.loads((tmp_path / "bad" / "metrics.json").read_text())
    assert m["diverged"] == {"round": 4, "reason": h["diverged"][3], "rounds": flagged}
    assert result["diverged"]["round"] == 4 and "diverged" not in m["final"]
    lines = [r.getMessage() for r in caplog.records if "diverged in round 4" in r.getMessage()]
    assert len(lines) == 1 and "synthetic FedAvg seed 0" in lines[0] and "train.max_grad_norm" in lines[0]


@pytest.mark.faults
def test_a_normal_run_is_not_marked_and_writes_what_it_wrote_before(synthetic_store, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mcfl"):
        _train(synthetic_store, tmp_path / "ok")
    h = pd.read_csv(tmp_path / "ok" / "history.csv")
    m = json.loads((tmp_path / "ok" / "metrics.json").read_text())
    assert "diverged" not in h and "diverged" not in m
    assert not [r for r in caplog.records if "diverged" in r.getMessage()]


@pytest.mark.faults
def test_a_resumed_run_keeps_its_mark(synthetic_store, tmp_path, monkeypatch):
    """Killed after the jump and resumed: the mark and the running minima come back from the
    checkpoint's history, and the outputs equal an uninterrupted run's."""
    from conftest import interrupt_round

    from mcfl.runner import train as run_train

    _blow_up_at(monkeypatch, 3, 200.0)
    run = make_run("synthetic", rounds=6, lr=0.05, checkpoint_every=1)
    run_train(run, synthetic_store, tmp_path / "whole", device="cpu", progress=False)
    restore = interrupt_round(monkeypatch, "FedAvg", 5)       # wraps the blown-up round
    with pytest.raises(KeyboardInterrupt):
        run_train(run, synthetic_store, tmp_path / "cut", device="cpu", progress=False,
                  checkpoint=tmp_path / "ck.pt")
    restore()
    run_train(run, synthetic_store, tmp_path / "cut", device="cpu", progress=False, checkpoint=tmp_path / "ck.pt")
    a, b = (pd.read_csv(tmp_path / d / "history.csv") for d in ("whole", "cut"))
    cols = [c for c in a if not c.endswith("_s")]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    ma, mb = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "cut"))
    assert ma["diverged"] == mb["diverged"] and ma["diverged"]["round"] == 3


# ------------------------------------------------------------------------------------ the tables
def _fake_run(root, dataset, label, seed, acc, diverged=None):
    d = root / dataset / label / f"seed{seed}"
    d.mkdir(parents=True)
    m = {"dataset": dataset, "method": label, "label": label, "seed": seed, "params": {},
         "final": {"micro_acc": acc, "micro_f1": acc, "macro_acc": acc, "macro_f1": acc, "test_loss": 1 - acc}}
    if diverged:
        m["diverged"] = diverged
    (d / "metrics.json").write_text(json.dumps(m))
    pd.DataFrame({"round": [1, 2], "train_loss": [1.0, 0.5], "micro_acc": [acc / 2, acc],
                  "test_loss": [1.0, 1 - acc]}).to_csv(d / "history.csv", index=False)
    return d


def test_the_results_table_marks_a_row_with_a_diverged_seed(tmp_path):
    from mcfl.report.table import collect, divergence_notes, summary_table, to_markdown

    jump = {"round": 50, "reason": "test_loss 10.4 > 10 x max(lowest 0.12, 0.1)", "rounds": [50]}
    dirs = [_fake_run(tmp_path, "ds", "A", 0, 0.97), _fake_run(tmp_path, "ds", "A", 1, 0.96),
            _fake_run(tmp_path, "ds", "A", 2, 0.154, jump),
            _fake_run(tmp_path, "ds", "B", 0, 0.5), _fake_run(tmp_path, "ds", "B", 1, 0.6)]
    finals, _ = collect(dirs)
    t = summary_table(finals)
    assert t.set_index("method")["n_diverged"].to_dict() == {"A": 1, "B": 0}
    # the diverged seed stays in the mean: (97 + 96 + 15.4) / 3
    a = t[t["method"] == "A"].iloc[0]
    assert a["micro_acc_mean"] == pytest.approx((97 + 96 + 15.4) / 3)
    md = to_markdown(t)
    row_a = next(ln for ln in md.splitlines() if "| A |" in ln)
    row_b = next(ln for ln in md.splitlines() if "| B |" in ln)
    assert row_a.count("†") == 4 and "69.5 ± 46.8 †" in row_a and "†" not in row_b
    notes = divergence_notes(finals)
    assert notes.strip() == ("† A on ds: 1 of 3 seeds diverged (seed 2 from round 50: a loss above 10x its "
                             "lowest, the run's history.csv column `diverged`); the mean ± std include them.")
    assert divergence_notes(finals[finals["method"] == "B"]) == ""


def test_fedgsp_table_marks_a_row_with_a_diverged_seed(tmp_path):
    from mcfl.fedgsp.metrics import CostModel
    from mcfl.papers.fedgsp.tables import divergence_notes, load_runs, table, table_markdown

    jump = {"round": 2, "reason": "test_loss ...", "rounds": [2]}
    dirs = [_fake_run(tmp_path, "ds", "NaiveGSP+ICG", s, a, jump if s == 2 else None)
            for s, a in ((0, 0.97), (1, 0.96), (2, 0.154))]
    dirs.append(_fake_run(tmp_path, "ds", "FedAvg", 0, 0.5))
    recs = load_runs(dirs, [{"clients_per_round": None, "local_epochs": 1}] * len(dirs))
    per, t = table(recs, 0.4, 10, 10.0, CostModel())
    assert per["diverged_round"].isna().tolist() == [True, True, False, True] and per["diverged_round"][2] == 2
    assert t.set_index("method")["n_diverged"].to_dict() == {"NaiveGSP+ICG": 1, "FedAvg": 0}
    md = table_markdown(t)
    gsp = next(ln for ln in md.splitlines() if ln.startswith("| NaiveGSP+ICG |"))
    assert "69.5 ± 46.8 †" in gsp and gsp.count("†") == 2
    assert "†" not in next(ln for ln in md.splitlines() if ln.startswith("| FedAvg |"))
    assert "NaiveGSP+ICG: 1 of 3 seeds diverged (seed 2 from round 2" in divergence_notes(recs)


def test_readme_table_carries_the_footnotes_of_its_rows(tmp_path):
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("sync_results", ROOT / "docs" / "tools" / "sync_results.py")
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    table = tmp_path / "table.md"
    table.write_text("| dataset | partition | method | seeds | micro acc | micro F1 | macro acc | macro F1 | ARI |\n"
                     "|---|---|---|---|---|---|---|---|---|\n"
                     "| digits_2class | natural | FedGSP | 3 | 70.2 ± 47.5 † | 1 † | 70.0 ± 47.0 † | 1 † |  |\n"
                     "| digits_2class | natural | NaiveGSP | 3 | 60.0 ± 40.0 † | 1 † | 60.0 ± 40.0 † | 1 † |  |\n"
                     "\n† FedGSP on digits_2class: 1 of 3 seeds diverged (seed 2 from round 50: ...).\n"
                     "† NaiveGSP on digits_2class: 1 of 3 seeds diverged (seed 0 from round 9: ...).\n")
    out = sync.readme_table(table, tmp_path)
    assert "| digits_2class | FedGSP | 70.2 ± 47.5 † | 70.0 ± 47.0 † |  |" in out
    # the README shows FedGSP's row, not NaiveGSP's: only FedGSP's footnote comes along
    assert "† FedGSP on digits_2class: 1 of 3 seeds diverged (seed 2 from round 50: ...)." in out
    assert "NaiveGSP on" not in out


def test_chain_stability_rows_by_hand(tmp_path):
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("chain", ROOT / "tools" / "chain_stability.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({
        "label": "NaiveGSP+ICG", "seed": 2, "cpu": "AVX512", "final": {"micro_acc": 0.154},
        "config": {"train": {"lr": 0.1}}, "diverged": {"round": 6, "reason": "...", "rounds": [6]}}))
    # rounds 4-6 are the second half: accuracy 0.95, 0.962, 0.154 -> lowest 15.4, largest drop 80.8
    pd.DataFrame({"round": range(1, 7), "micro_acc": [0.2, 0.5, 0.9, 0.95, 0.962, 0.154],
                  "train_loss": [2.0, 1.0, 0.3, 0.1, 0.08, 1.11]}).to_csv(d / "history.csv", index=False)
    assert tool.row(d) == ["NaiveGSP+ICG", "2", "AVX512", "0.1", "none", "15.4", "15.4", "80.8", "1.110", "6"]
