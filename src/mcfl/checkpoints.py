"""Whose checkpoint a file is. ``mcfl train --checkpoint PATH`` overwrites the file every few rounds
and deletes it when the run finishes, so it must never be anything but this run's own checkpoint:
a checkpoint records its owner (:func:`checkpoint_owner`), and any other file at the path is
refused before anything is written (:func:`refuse_foreign_checkpoint`)."""

from __future__ import annotations

from pathlib import Path

import torch


def checkpoint_owner(run: dict) -> dict:
    """What a checkpoint records of the run that wrote it (its ``owner``): the run's dataset, run
    id and seed, which stay when the run's settings change. A file at ``--checkpoint`` that is not
    a checkpoint of this owner is never overwritten (:func:`refuse_foreign_checkpoint`)."""
    return {"dataset": str(run["dataset"]), "run_id": str(run["run_id"]), "seed": int(run["seed"])}


def refuse_foreign_checkpoint(path: Path | None, run: dict, run_hash: str) -> None:
    """A one-line ValueError, before anything is written, if ``path`` holds anything but a
    checkpoint of this run (:func:`checkpoint_owner`; a checkpoint written before owners were
    recorded: one of the same configuration): a note, another run's ``state.pt`` or checkpoint,
    which training would overwrite and then delete. A missing file is fine; this run's own
    checkpoint of other settings is replaced (:func:`_load_checkpoint` warns)."""
    if path is None or not (path.exists() or path.is_symlink()):
        return
    if not path.is_file():
        raise ValueError(f"{path}: --checkpoint must be a file path, not a directory or special file")
    try:                                # the tensors stay on disk: only the small keys are read
        ck = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - no torch archive, or objects other than tensors
        ck = None
    owner = ck.get("owner") if isinstance(ck, dict) else None
    if owner == checkpoint_owner(run) or (isinstance(ck, dict) and owner is None
                                          and ck.get("run_hash") == run_hash):
        return
    what = (f"the checkpoint of {owner.get('dataset')} {owner.get('run_id')} seed {owner.get('seed')}"
            if isinstance(owner, dict) else "a file that is no checkpoint of this run"
            if not isinstance(ck, dict) or "run_hash" not in ck else "another run's checkpoint")
    raise ValueError(f"{path}: --checkpoint holds {what}; refusing to overwrite it: give this run "
                     f"its own checkpoint path, or delete the file")

