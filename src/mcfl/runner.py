"""The round loop, written once for every algorithm.

``train(run, store, out_dir)`` builds the federation, initialises the algorithm (or resumes it from
its checkpoint), and for r = 1..R: draws round r's clients (from (seed, r) alone), calls
``algorithm.round``, evaluates every ``eval_every`` rounds and at the end, logs to the tracker, and
checkpoints every ``checkpoint_every`` rounds. Outputs (each written atomically, ``metrics.json``
last, so a killed job leaves nothing the report could take for a result):

* ``history.csv``      one row per round: train loss, the algorithm's diagnostics (with
  ``clients_per_cluster``, ``sampled/<k>``: the round's clients drawn from cluster k), test metrics
  on evaluation rounds (:mod:`mcfl.evaluation`; a named protocol's as ``NAME/micro_acc`` ...), and
  the round's seconds of local training, of the rest of the round and of evaluation
  (:mod:`mcfl.timing`; ``metrics.json`` has their totals under ``time_s``); on a round whose loss
  jumped far above its best so far (:mod:`mcfl.divergence`), a ``diverged`` column with the reason,
  and ``metrics.json`` gets ``diverged: {round, reason, rounds}`` (both absent if no round jumped);
* ``assignments.csv``  client id, true cluster, final cluster (blank for unclustered methods), and
  any further per-client columns the method has (FedCG: ``domain_share_<k>``);
* ``predictions.csv``  the final evaluation's prediction for every test sample, in the store's test
  order (client id, label ``y``, prediction ``pred``, and ``domain`` on stores with per-sample
  domains): runs on the same store can be compared image by image (a paired test);
* ``state.pt``         a clustered method's final state (FeSEM: centres and assignments), for the
  clustering figure (:mod:`mcfl.report.figures`); an empty dict for other methods;
* ``metrics.json``     the run's identity (config, git revision, data hash), the machine (device,
  CPU kernels, threads, torch, ``precision``: what local training computed in,
  :func:`mcfl.precision.precision_ran`; ``conv_form``: the form of the batched executor's stacked
  convolutions, :mod:`mcfl.executors.forms`) and final metrics.

Crash safety. A checkpoint (``checkpoint=PATH``, every ``checkpoint_every`` rounds, a large one less
often: :class:`CheckpointClock`; written then renamed) holds everything the run carries between
rounds: the algorithm's ``State`` (the contract of :mod:`mcfl.algorithms.base` keeps nothing else),
the round, the history so far and the MLflow run id. There is no RNG state to save: every random
draw is derived from (seed, round, client, purpose). A rerun of the same job resumes from it,
continues the same MLflow run, and ends with outputs bitwise equal to an uninterrupted run's (on the
CPU). A checkpoint of another configuration or data set is ignored with a warning; it is deleted
once the run has finished. Outputs of an earlier run in ``out_dir`` (``state.pt`` included) are
removed first, so a failed run never leaves a result behind. The store is verified in full
(:func:`mcfl.data.store.verify_store`: metadata and file hashes) before training or resuming, so the
data hash recorded is that of the data trained on.
"""

from __future__ import annotations

import io
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mcfl import algorithms
from mcfl.cost.memory import check_run
from mcfl.checkpoints import checkpoint_owner, refuse_foreign_checkpoint
from mcfl.data.store import StoreError, load, warn_untested
from mcfl.divergence import COLUMN as DIVERGED, DivergenceWatch, summary as divergence_summary
from mcfl.errors import REMEDY, DivergenceError
from mcfl.evaluation import RoundCache, evaluate, evaluate_protocol, protocols
from mcfl.federation import (CUBLAS_WORKSPACE, build_federation, configure_torch, keep_freed_memory,  # noqa: F401
                             resolve_device)
from mcfl.io import (OUTPUTS, config_hash, csv_text, git_revision, remove_stale_temps, rows_csv, state_on,
                     write_bytes, write_json)
from mcfl.precision import precision_ran
from mcfl.timing import COLUMNS as TIME_COLUMNS, LocalClock
from mcfl.track import NullTracker
from mcfl.trainspec import TrainSpec

log = logging.getLogger("mcfl")


# ---------------------------------------------------------------------------------- checkpointing
def _save_checkpoint(path: Path, algo, state, rnd: int, rows: list[dict], identity: dict,
                     tracking_id: str | None, segments: list[dict]) -> None:
    _torch_save(path, {"round": rnd, "state": algo.state_dict(state), "history": rows,
                       "tracking_id": tracking_id or "", "segments": segments, **identity})


class CheckpointClock:
    """Whether a checkpoint that is due (every ``checkpoint_every`` rounds) is written: always while
    writing one takes under ``FREE_S`` seconds; after a slower write, the next is skipped until the
    run has trained ``1 / SHARE - 1`` times that long since, so that checkpoints take at most
    ``SHARE`` of a run's time (NoFed's 105 LEAF CNNs of 6.6M weights are 2.8 GB a checkpoint: nine
    of them were about half of its job's time on a GPU)."""

    FREE_S = 1.0
    SHARE = 0.05

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.write_s, self.since = 0.0, clock()

    def due(self) -> bool:
        return self.write_s < self.FREE_S or self.clock() - self.since >= self.write_s * (1 / self.SHARE - 1)

    def wrote(self, started: float) -> None:
        """A checkpoint was written from ``started`` (a reading of the clock) until now."""
        self.since = self.clock()
        self.write_s = self.since - started


#: what a segment of a run records of the machine that trained it
SEGMENT_KEYS = ("device", "device_name", "cpu", "threads", "torch", "git", "precision", "conv_form")


def _segments(ck: dict | None, machine: dict, start: int, end: int) -> list[dict]:
    """The rounds each machine trained, ``[{"from", "to", device, cpu, ...}]``: those of the
    checkpoint resumed from, then this process's ``start..end``. A checkpoint written before
    segments were recorded gives one earlier segment from its own identity (no device: "?")."""
    if ck is None:
        done = []
    elif ck.get("segments"):
        done = [dict(s) for s in ck["segments"]]
    else:
        done = [{"from": 1, "to": int(ck["round"]), "device": "?",
                 **{k: ck[k] for k in SEGMENT_KEYS if k in ck}}]
    return done + [{"from": start, "to": end, **{k: machine[k] for k in SEGMENT_KEYS if k in machine}}]


def _torch_save(path: Path, obj) -> None:
    """torch.save through memory: the archive's internal name is then fixed ("archive"), not the
    temporary file's, so equal states give byte-equal files."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    write_bytes(path, buf.getvalue())


def _load_checkpoint(path: Path | None, algo, identity: dict, device, rounds: int) -> dict | None:
    """The checkpoint at ``path`` if it belongs to this run (same config and data), else None.
    A file that is no checkpoint, or one of another configuration, is ignored with a warning; one
    of this run whose round, history or types are inconsistent is an error (:func:`check_checkpoint`)."""
    if path is None or not path.is_file():
        return None
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(ck, dict):
            raise ValueError(f"holds a {type(ck).__name__}, not a checkpoint")
        mine = all(ck.get(k) == identity[k] for k in ("run_hash", "data_hash"))
    except Exception as e:  # noqa: BLE001 - unreadable, or written by an incompatible version
        log.warning("%s: cannot resume from it (%s); starting afresh", path, e)
        return None
    if not mine:
        log.warning("%s belongs to another configuration or data set; starting afresh", path)
        return None
    check_checkpoint(path, ck, rounds)
    try:
        ck["state"] = algo.load_state(state_on(ck["state"], device))
    except Exception as e:  # noqa: BLE001 - written by an incompatible version of the method
        log.warning("%s: cannot resume from it (%s); starting afresh", path, e)
        return None
    for key in ("git", "threads", "torch", "cpu"):   # allowed, but the result may not repeat bitwise
        if ck.get(key) != identity[key]:
            log.warning("%s was written with %s %s, resuming with %s", path, key, ck.get(key), identity[key])
    return ck


def check_checkpoint(path: Path, ck: dict, rounds: int) -> None:
    """A checkpoint of this run is consistent before anything of it is used: ``round`` an integer
    in ``[1, rounds)`` (one is written only before the last round), ``history`` one row per round
    done, numbered 1..round, ``state`` a mapping, ``tracking_id`` a string, ``segments`` a list.
    Otherwise a one-line ValueError naming the file and the key (the checkpoint is left in place)."""
    def bad(key: str, why: str) -> None:
        raise ValueError(f"{path}: {key} {why}; the checkpoint is damaged: delete it to train the run "
                         f"from the start")

    r = ck.get("round")
    if type(r) is not int:
        bad("round", f"is {r!r:.40}, not an integer")
    if not 1 <= r < rounds:
        bad("round", f"is {r}, outside 1..{rounds - 1}")
    h = ck.get("history")
    if not isinstance(h, list) or not all(isinstance(row, dict) for row in h):
        bad("history", f"is {type(h).__name__}, not a list of rows")
    if len(h) != r:
        bad("history", f"has {len(h)} rows for {r} rounds done")
    if [row.get("round") for row in h] != list(range(1, r + 1)):
        bad("history", f"rows are not rounds 1..{r}")
    if not isinstance(ck.get("state"), dict):
        bad("state", f"is {type(ck.get('state')).__name__}, not a mapping of tensors")
    if not isinstance(ck.get("tracking_id", ""), str):
        bad("tracking_id", "is not a string")
    if not isinstance(ck.get("segments", []), list) or not all(isinstance(x, dict) for x in ck.get("segments", [])):
        bad("segments", "is not a list of mappings")


# ------------------------------------------------------------------------------------------- train
#: every file a run writes to out_dir; all are removed when a run starts
RESULTS = ("state.pt",) + OUTPUTS


def train(run: dict[str, Any], store: str | Path, out_dir: str | Path, *,
          inputs: dict[str, str] | None = None, tracker=None, device: str = "auto", threads: int = 1,
          checkpoint: str | Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Train one run (one dataset, method, K, seed) and write its outputs to ``out_dir``."""
    tracker = tracker or NullTracker()
    out_dir = Path(out_dir)
    ckpt_path = Path(checkpoint) if checkpoint else None
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir}: --out must be a directory, not a file")
    run_hash = config_hash({k: run[k] for k in ("dataset", "method", "params", "model", "train", "seed")})
    if ckpt_path:
        if ckpt_path.resolve() in {(out_dir / name).resolve() for name in RESULTS}:
            raise ValueError(f"{ckpt_path}: --checkpoint is one of the run's outputs in --out; give the "
                             f"checkpoint a path of its own")
        refuse_foreign_checkpoint(ckpt_path, run, run_hash)
    for name in RESULTS:                    # a stale result must not outlive a failed rerun
        (out_dir / name).unlink(missing_ok=True)
        remove_stale_temps(out_dir / name)
    dev = resolve_device(device)
    configure_torch(dev, threads)
    t0 = time.time()
    data = load(store, verify=True)         # file hashes too: the data hash logged is the data used
    if int(data.meta["n_test"]) == 0:
        raise StoreError(f"{store}: no client has test samples, so nothing could be evaluated; "
                         f"re-split it (a lower train fraction or the partition stage)")
    warn_untested(data.path, data.client_ids, data.n_test())
    cls = algorithms.get(run["method"])
    params = cls.Params(**run["params"])
    tcfg = TrainSpec.of(run["train"])
    check_run(tcfg, run["model"], data, K=run["params"].get("K"), device=dev)   # before allocating
    fed = build_federation(data, run["model"], tcfg, run["seed"], dev, inputs)
    algo = cls(fed, params)
    identity = {"git": git_revision(), "data_hash": data.content_hash, "run_hash": run_hash,
                "threads": torch.get_num_threads(), "torch": str(torch.__version__),
                # the CPU kernels PyTorch picked (AVX2, AVX512...): they round differently, so a CPU
                # run repeats bitwise only on a machine with the same capability
                "cpu": torch.backends.cpu.get_cpu_capability()}
    ck = _load_checkpoint(ckpt_path, algo, identity, dev, int(tcfg.rounds))
    here = {"device": str(dev), **identity}
    if dev.type == "cuda":                                         # which accelerator made it
        here["device_name"] = torch.cuda.get_device_name(dev)
    here["precision"] = precision_ran(tcfg.precision, dev)        # what local training computed in
    # the form the batched executor's stacked convolutions took (mcfl.executors.forms)
    here["conv_form"] = getattr(algo.fed.trainer, "conv_form", "grouped")
    if ck:
        state, start, rows = ck["state"], ck["round"] + 1, list(ck["history"])
        log.info("resuming %s from round %d (%s)", run["label"], ck["round"], ckpt_path)
    else:
        state, start, rows = algo.init(), 1, []
    tracking_id = tracker.start(run, identity, resume_id=(ck or {}).get("tracking_id") or None,
                                history=rows)
    rounds, every = int(tcfg.rounds), int(tcfg.eval_every)
    evaluation_protocols = protocols(tcfg.eval_protocols)
    ck_every = int(tcfg.checkpoint_every or 0) if ckpt_path else 0
    ck_clock = CheckpointClock()
    ck_identity = {**identity, "owner": checkpoint_owner(run)}     # whose checkpoint it is
    bar = _progress(range(start, rounds + 1), run, progress)
    # the trainer the algorithm trains with: FedCG and FedFusion build one for their own network
    clock = LocalClock(algo.fed.trainer, fed.device)
    watch = DivergenceWatch()           # a loss far above its best so far marks the round
    watch.replay(rows)
    status = "FAILED"
    try:
        for r in bar:
            clock.reset()
            t_round = time.perf_counter()
            start_assign = algo.assignments(state) if fed.per_cluster else None
            clients = fed.clients(r, start_assign)
            state, diag = algo.round(state, clients, r)
            clock.sync()
            round_s, local_s = time.perf_counter() - t_round, clock.seconds
            row = {"round": r, **diag, **sampled_columns(start_assign, clients)}
            t_eval = time.perf_counter()
            if r % every == 0 or r == rounds:
                cache = RoundCache(algo, state, fed, r, active=clients)   # the protocols share predictions
                scores, pred = evaluate(algo, state, fed, finetune_epochs=int(tcfg.finetune_epochs),
                                        rnd=r, cache=cache)
                row.update(scores)
                for name, proto in evaluation_protocols.items():     # the same model, scored again
                    row.update({f"{name}/{k}": v for k, v in evaluate_protocol(proto, algo, state, fed, r, cache).items()})
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(acc=f"{row['micro_acc']:.3f}", loss=f"{row['train_loss']:.3f}")
            clock.sync()
            eval_s = time.perf_counter() - t_eval
            row.update(zip(TIME_COLUMNS, (round(local_s, 4), round(round_s - local_s, 4), round(eval_s, 4))))
            _check_finite(row, r)
            why = watch.check(row)
            if why:
                _warn_diverged(run, r, why, rows)
                row[DIVERGED] = why
            rows.append(row)
            tracker.log({k: v for k, v in row.items() if k != "round"}, step=r)
            if ck_every and r % ck_every == 0 and r < rounds and ck_clock.due():
                t_ck = ck_clock.clock()
                _save_checkpoint(ckpt_path, algo, state, r, rows, ck_identity, tracking_id,
                                 _segments(ck, here, start, r))
                ck_clock.wrote(t_ck)
                tracker.flush()
        final = {k: v for k, v in rows[-1].items() if k not in ("round", DIVERGED) and k not in TIME_COLUMNS
                 and not k.startswith(SAMPLED)}
        result = _write_outputs(out_dir, run, here, algo, state, fed, rows, final, pred,
                                time.time() - t0, _segments(ck, here, start, rounds) if ck else None)
        tracker.artifacts([out_dir / f for f in OUTPUTS])
        status = "FINISHED"
    except (KeyboardInterrupt, SystemExit):     # Ctrl-C, or SIGTERM (the CLI turns it into SystemExit)
        status = "KILLED"
        raise
    finally:
        if status != "FINISHED":            # stopped or failed while writing: no complete result
            _remove_results(out_dir)
        tracker.end(status)
    if ckpt_path:
        ckpt_path.unlink(missing_ok=True)       # only now: a kill before this point resumes cleanly
    return result


#: history.csv's columns ``sampled/<k>`` (per-cluster sampling only): the clients of the round
#: drawn from cluster k of the clustering the round started from
SAMPLED = "sampled/"


def sampled_columns(assign: np.ndarray | None, clients: np.ndarray) -> dict[str, int]:
    """``{sampled/<k>: clients drawn from cluster k}`` for every cluster id up to the largest in
    ``assign`` (0 for an empty one); none without per-cluster sampling (``assign`` None)."""
    if assign is None:
        return {}
    counts = np.bincount(np.asarray(assign)[clients], minlength=int(np.max(assign)) + 1)
    return {f"{SAMPLED}{k}": int(n) for k, n in enumerate(counts)}


def _remove_results(out_dir: Path) -> None:
    """Delete what a run wrote to ``out_dir``, ``metrics.json`` (the mark of a finished run) first."""
    for name in reversed(RESULTS):
        (out_dir / name).unlink(missing_ok=True)


def _check_finite(row: dict, rnd: int) -> None:
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise DivergenceError(f"round {rnd}: non-finite {', '.join(bad)}; {REMEDY}")


def _warn_diverged(run: dict, rnd: int, why: str, rows: list[dict]) -> None:
    """The log's line for a flagged round: the first in full, later ones briefly."""
    who = f"{run['dataset']} {run['label']} seed {run['seed']}"
    if any(r.get(DIVERGED) for r in rows):
        log.warning("%s: round %d: loss still far above its best (%s)", who, rnd, why)
    else:
        log.warning("%s diverged in round %d: %s; the run goes on, marked as diverged in history.csv, "
                    "metrics.json and the tables; %s", who, rnd, why, REMEDY)


def _progress(it, run, enabled):
    if not enabled:
        return it
    from tqdm import tqdm

    return tqdm(it, desc=f"{run['dataset']} {run['label']} seed {run['seed']}", unit="round",
                mininterval=1.0, dynamic_ncols=True)


def _write_outputs(out_dir: Path, run, machine, algo, state, fed, rows, final, pred, wall,
                   segments: list[dict] | None = None) -> dict:
    # the CSVs pandas.DataFrame(...).to_csv(index=False) would write, without importing pandas
    out_dir.mkdir(parents=True, exist_ok=True)
    write_bytes(out_dir / "history.csv", rows_csv(rows).encode())
    assign = algo.assignments(state)
    write_bytes(out_dir / "assignments.csv", csv_text({"client": fed.data.client_ids,
                                                        "true_cluster": fed.data.true_clusters,
                                                        "cluster": assign,             # None: empty
                                                        **algo.client_columns(state)}).encode())
    test = {"client": np.repeat(np.asarray(fed.data.client_ids), fed.dev.n_test),
            "y": fed.dev.y["test"].cpu().numpy(), "pred": pred}
    if fed.data.domain_test is not None:
        test["domain"] = np.asarray(fed.data.domain_test)
    write_bytes(out_dir / "predictions.csv", csv_text(test).encode())
    _write_state(out_dir / "state.pt", algo, state)
    result = {"dataset": run["dataset"], "method": run["method"], "label": run["label"],
              "run_id": run["run_id"], "seed": run["seed"], "params": run["params"],
              "rounds": int(run["train"]["rounds"]), "final": final, "wall_s": round(wall, 2),
              "time_s": {c[:-2]: round(float(sum(r.get(c, 0.0) for r in rows)), 2) for c in TIME_COLUMNS},
              **machine}              # device (and GPU name), CPU kernels, torch, git, precision
    result["partition"] = run.get("partition", "natural")          # which partition made the data
    if "draw" in run:                          # which draw of the clients (mcfl.replication)
        result["draw"] = run["draw"]
    if segments:                 # a resumed run: which machine trained which rounds (report.format)
        result["segments"] = segments
    diverged = divergence_summary(rows)
    if diverged:                 # a loss jump (mcfl.divergence): the tables mark the run
        result[DIVERGED] = diverged
    if fed.data.domain_test is not None:        # which ``domain`` ids of predictions.csv are unseen
        result["unseen_domains"] = fed.data.unseen_domains
    result["config"] = run                                         # the resolved run, for `mcfl track`
    write_json(out_dir / "metrics.json", result)
    return result


def _write_state(path: Path, algo, state) -> None:
    """A clustered run's final state (tensors only: loads with ``weights_only=True``) for the
    clustering figure; an empty dict for unclustered methods, whose state can be m models."""
    _torch_save(path, algo.state_dict(state) if algo.clustered else {})
