"""No command overwrites or deletes a file it did not create: ``mcfl train --checkpoint`` takes only
a missing file or this run's own checkpoint (mcfl.checkpoints.refuse_foreign_checkpoint)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from conftest import make_run
from mcfl import cli
from mcfl.checkpoints import checkpoint_owner, refuse_foreign_checkpoint
from mcfl.runner import train


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _train(run: dict, store, out: Path, ck: Path) -> int:
    return cli.main(["train", "--run", json.dumps(run), "--store", str(store), "--out", str(out),
                     "--checkpoint", str(ck), "--no-tracking", "--no-progress", "--threads", "1"])


OTHER = {"dataset": "digits", "run_id": "FeSEM-K4", "seed": 0}
FOREIGN = {
    "notes.txt": (b"my notes, not a checkpoint\n", "a file that is no checkpoint of this run"),
    "state.pt": (_torch_bytes({"centres": torch.zeros(2, 3)}), "a file that is no checkpoint of this run"),
    "other.pt": (_torch_bytes({"round": 1, "run_hash": "0" * 16, "owner": OTHER, "state": {}}),
                 "the checkpoint of digits FeSEM-K4 seed 0"),
    "old.pt": (_torch_bytes({"round": 1, "run_hash": "0" * 16, "state": {}}), "another run's checkpoint"),
}


@pytest.mark.parametrize("name", list(FOREIGN))
def test_a_checkpoint_path_holding_anything_else_is_refused_and_kept(name, digits_store, tmp_path, capsys):
    content, what = FOREIGN[name]
    ck = tmp_path / name
    ck.write_bytes(content)
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text('{"earlier": "result"}')    # an earlier run's, kept too
    assert _train(make_run(rounds=2, checkpoint_every=1), digits_store, out, ck) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"mcfl train: error: {ck}: --checkpoint holds {what}; refusing to overwrite it: give "
                   f"this run its own checkpoint path, or delete the file")
    assert ck.read_bytes() == content
    assert (out / "metrics.json").read_text() == '{"earlier": "result"}'


def test_a_missing_file_and_this_runs_own_checkpoint_are_taken(tmp_path):
    run = make_run()
    refuse_foreign_checkpoint(tmp_path / "absent.pt", run, "h")
    own = tmp_path / "own.pt"
    own.write_bytes(_torch_bytes({"round": 1, "run_hash": "other settings", "owner": checkpoint_owner(run)}))
    refuse_foreign_checkpoint(own, run, "h")
    old = tmp_path / "old.pt"                     # written before owners were recorded: same settings
    old.write_bytes(_torch_bytes({"round": 1, "run_hash": "h"}))
    refuse_foreign_checkpoint(old, run, "h")


def test_a_checkpoint_that_is_one_of_the_runs_outputs_is_refused(digits_store, tmp_path, capsys):
    out = tmp_path / "out"
    assert _train(make_run(), digits_store, out, out / "metrics.json") == 1
    assert capsys.readouterr().err.strip() == (f"mcfl train: error: {out / 'metrics.json'}: --checkpoint is "
                                               f"one of the run's outputs in --out; give the checkpoint a "
                                               f"path of its own")


def test_a_checkpoint_that_is_a_directory_is_refused(digits_store, tmp_path):
    with pytest.raises(ValueError, match="--checkpoint must be a file path"):
        train(make_run(), digits_store, tmp_path / "out", checkpoint=digits_store, progress=False)


@pytest.mark.slow
def test_a_checkpoint_of_another_configs_run_is_refused_after_a_kill(digits_store, tmp_path, capsys):
    """A run killed with a checkpoint: a different run (another config's, another method) pointed
    at that file is refused; the run itself then resumes from it."""
    ck = tmp_path / "ck.pt"
    run = make_run(rounds=3, checkpoint_every=1)
    with pytest.raises(KeyboardInterrupt):
        from fault_helpers import _DieAt

        train(run, digits_store, tmp_path / "a", checkpoint=ck, progress=False, tracker=_DieAt(2))
    saved = ck.read_bytes()
    other = make_run(method="FedProx", params={"mu": 0.0}, rounds=3, checkpoint_every=1)
    assert _train(other, digits_store, tmp_path / "b", ck) == 1
    assert "holds the checkpoint of digits FedAvg seed 0" in capsys.readouterr().err
    assert ck.read_bytes() == saved
    train(run, digits_store, tmp_path / "a", checkpoint=ck, progress=False)
    assert not ck.exists()
