"""The round loop, written once for every algorithm.

``train(run, store, out_dir)`` builds the federation, initialises the algorithm (or resumes it from
its checkpoint), and for r = 1..R: takes round r's clients from the pre-sampled stream, calls
``algorithm.round``, evaluates every ``eval_every`` rounds and at the end, logs to the tracker, and
checkpoints every ``checkpoint_every`` rounds. Outputs (each written atomically, ``metrics.json``
last, so a killed job leaves nothing the report could take for a result):

* ``history.csv``      one row per round: train loss, the algorithm's diagnostics, and test metrics
  on evaluation rounds;
* ``assignments.csv``  client id, true cluster, final cluster (blank for unclustered methods);
* ``metrics.json``     the run's identity (config, git revision, data hash) and final metrics.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from mcfl import algorithms
from mcfl.data.store import load
from mcfl.engine import LocalSpec, Task
from mcfl.federation import Federation, build_federation, resolve_device
from mcfl.io import atomic_path, config_hash, git_revision, write_json
from mcfl.metrics import clustering_scores, domain_scores, per_client_scores, summarize

log = logging.getLogger("mcfl")
FINETUNE = 7


# ------------------------------------------------------------------------------------- evaluation
def evaluate(algo: algorithms.Algorithm, state, fed: Federation, *, finetune_epochs: int = 0,
             rnd: int = 0) -> dict[str, float]:
    """Test every client with the model ``algo.eval_models`` gives it; metrics per :mod:`mcfl.metrics`."""
    off = fed.dev.offsets["test"]
    owners, truths, preds, losses, all_rows = [], [], [], [], []
    ft_spec = LocalSpec(fed.trainer.spec.lr, fed.trainer.spec.batch_size, finetune_epochs) \
        if finetune_epochs else None
    for w, members in algo.eval_models(state):
        members = np.asarray(members)
        members = members[fed.dev.n_test[members] > 0]
        if not len(members):
            continue
        if ft_spec is None:
            groups = [(w, members)]
        else:   # optional local fine-tuning before test: each client adapts the model on its train data
            trainer = algo.fed.trainer      # the algorithm's own model (FedCG wraps the network)
            groups = [(trainer.train(Task(int(c), w), rnd, FINETUNE, ft_spec).weights, np.array([c]))
                      for c in members]
        for wg, mg in groups:
            rows = np.concatenate([np.arange(off[c], off[c + 1]) for c in mg])
            rows_t = torch.from_numpy(rows).to(fed.device)
            p, l = algo.predict(wg, rows_t)
            all_rows.append(rows)
            owners.append(np.repeat(mg, fed.dev.n_test[mg]))
            truths.append(fed.dev.y["test"][rows_t].cpu().numpy())
            preds.append(p.cpu().numpy())
            losses.append(l.cpu().numpy())
    scores = per_client_scores(np.concatenate(owners), np.concatenate(truths), np.concatenate(preds),
                               fed.n_clients, fed.dev.n_classes)
    out = summarize(scores)
    out["test_loss"] = float(np.concatenate(losses).mean())
    out.update(clustering_scores(algo.assignments(state), fed.data.true_clusters))
    if fed.data.domain_test is not None:     # stores that label each test sample with its domain
        hit = np.concatenate(truths) == np.concatenate(preds)
        out.update(domain_scores(np.asarray(fed.data.domain_test)[np.concatenate(all_rows)], hit,
                                 fed.data.unseen_domains))
    out.update(algo.extra_metrics(state))
    return out


# ---------------------------------------------------------------------------------- checkpointing
def _save_checkpoint(path: Path, algo, state, rnd: int, rows: list[dict], run_hash: str,
                     tracking_id: str | None) -> None:
    with atomic_path(path) as tmp:
        torch.save({"round": rnd, "state": algo.state_dict(state), "history": rows,
                    "run_hash": run_hash, "tracking_id": tracking_id or ""}, tmp)


def _load_checkpoint(path: Path, algo, run_hash: str, device) -> dict | None:
    if not path.is_file():
        return None
    ck = torch.load(path, map_location=device, weights_only=True)
    if ck.get("run_hash") != run_hash:
        log.warning("%s belongs to a different configuration; starting afresh", path)
        return None
    ck["state"] = algo.load_state(ck["state"])
    return ck


# ------------------------------------------------------------------------------------------- train
def configure_torch(device: torch.device, threads: int) -> None:
    """Seeded runs are bitwise repeatable on the CPU; on CUDA, deterministic kernels are requested
    (cuBLAS needs CUBLAS_WORKSPACE_CONFIG set before CUDA initialises) and cuDNN autotuning is off."""
    torch.set_num_threads(max(1, int(threads)))
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)


def train(run: dict[str, Any], store: str | Path, out_dir: str | Path, *,
          inputs: dict[str, str] | None = None, tracker=None, device: str = "auto", threads: int = 1,
          checkpoint: str | Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Train one run (one dataset, method, K, seed) and write its outputs to ``out_dir``."""
    from mcfl.track import NullTracker

    tracker = tracker or NullTracker()
    out_dir = Path(out_dir)
    dev = resolve_device(device)
    configure_torch(dev, threads)
    t0 = time.time()
    data = load(store)
    cls = algorithms.get(run["method"])
    params = cls.Params(**run["params"])
    tcfg = run["train"]
    fed = build_federation(data, run["model"], tcfg, run["seed"], dev, inputs)
    algo = cls(fed, params)
    run_hash = config_hash({k: run[k] for k in ("dataset", "method", "params", "model", "train", "seed")})
    ckpt_path = Path(checkpoint) if checkpoint else None
    ck = _load_checkpoint(ckpt_path, algo, run_hash, dev) if ckpt_path else None
    identity = {"git": git_revision(), "data_hash": data.content_hash, "run_hash": run_hash}
    tracking_id = tracker.start(run, identity, resume_id=(ck or {}).get("tracking_id") or None)
    if ck:
        state, start, rows = ck["state"], ck["round"] + 1, list(ck["history"])
        log.info("resuming %s from round %d (%s)", run["label"], ck["round"], ckpt_path)
    else:
        state, start, rows = algo.init(), 1, []
    rounds, every = int(tcfg["rounds"]), int(tcfg["eval_every"])
    ck_every = int(tcfg.get("checkpoint_every") or 0)
    bar = _progress(range(start, rounds + 1), run, progress)
    status = "FAILED"
    try:
        for r in bar:
            state, diag = algo.round(state, fed.clients(r), r)
            row = {"round": r, **diag}
            if r % every == 0 or r == rounds:
                row.update(evaluate(algo, state, fed, finetune_epochs=int(tcfg.get("finetune_epochs", 0)), rnd=r))
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(acc=f"{row['micro_acc']:.3f}", loss=f"{row['train_loss']:.3f}")
            _check_finite(row, r)
            rows.append(row)
            tracker.log({k: v for k, v in row.items() if k != "round"}, step=r)
            if ckpt_path and ck_every and (r % ck_every == 0) and r < rounds:
                tracker.flush()
                _save_checkpoint(ckpt_path, algo, state, r, rows, run_hash, tracking_id)
        final = {k: v for k, v in rows[-1].items() if k != "round"}
        result = _write_outputs(out_dir, run, identity, algo, state, fed, rows, final, time.time() - t0)
        tracker.artifacts([out_dir / f for f in ("history.csv", "assignments.csv", "metrics.json")])
        status = "FINISHED"
        if ckpt_path:
            ckpt_path.unlink(missing_ok=True)
        return result
    finally:
        tracker.end(status)


def _check_finite(row: dict, rnd: int) -> None:
    from mcfl.engine import DivergenceError

    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise DivergenceError(f"round {rnd}: non-finite {', '.join(bad)}; lower the learning rate")


def _progress(it, run, enabled):
    if not enabled:
        return it
    from tqdm import tqdm

    return tqdm(it, desc=f"{run['dataset']} {run['label']} seed {run['seed']}", unit="round",
                mininterval=1.0, dynamic_ncols=True)


def _write_outputs(out_dir: Path, run, identity, algo, state, fed, rows, final, wall) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / "history.csv") as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)
    assign = algo.assignments(state)
    truth = fed.data.true_clusters
    with atomic_path(out_dir / "assignments.csv") as tmp:
        pd.DataFrame({"client": fed.data.client_ids,
                      "true_cluster": truth if truth is not None else pd.NA,
                      "cluster": assign if assign is not None else pd.NA}).to_csv(tmp, index=False)
    result = {"dataset": run["dataset"], "method": run["method"], "label": run["label"],
              "run_id": run["run_id"], "seed": run["seed"], "params": run["params"],
              "rounds": int(run["train"]["rounds"]), "final": final, "wall_s": round(wall, 2),
              "device": str(fed.device), **identity}
    write_json(out_dir / "metrics.json", result)
    return result
