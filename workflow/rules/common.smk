# Shared helpers: validate the config (before any job), expand it into runs, and name every path.
#
# Quoting rule: every {field} in a shell command is written {field:q} (shell-quoted; a list is quoted
# element by element, so optional flags are lists such as ["--centres", path] or []). Config values
# (results, data_dir, experiment, ...) then reach the command as single words whatever they contain;
# tests/test_faults.py checks every rule file for it.
import json
import os
import shutil
import time

from snakemake.exceptions import WorkflowError

from mcfl.cluster.spec import centre_key, centre_spec
from mcfl.config import ConfigError, expand_runs, read_yaml, validate
from mcfl.data.repartition import is_identity
from mcfl.data.store import FORMAT as STORE_FORMAT   # a param of the rules that write stores
from mcfl.io import canonical_json

try:
    for _f in workflow.configfiles:     # Snakemake's YAML loader keeps a duplicated key's last value
        read_yaml(_f)
    validate(config, " + ".join(map(str, workflow.configfiles)) or "config")
except ConfigError as e:
    raise WorkflowError(f"invalid configuration: {e}")

DATA = config["data_dir"]
RES = config["results"]
RUNS = {(r["dataset"], r["run_id"], str(r["seed"])): r for r in expand_runs(config)}
RUN_DIR = RES + "/runs/{dataset}/{run}/seed{seed}"
# Job logs of the results (training, reports): logs/ for the default results directory, inside its
# own results directory for any other (a config overlay's runs must not overwrite the default
# runs' logs); data jobs, shared by all, always log to logs/.
LOGS = "logs" if os.path.normpath(RES) == "results" else RES + "/logs"
# Initial centres, one file per distinct centre spec (runs that would compute the same centres, e.g.
# FeSEM(3), FeSEM-MA(3) and Robust(3), share it): {centres} is `K<K>-<hash>` (mcfl.cluster.spec.centre_key).
INIT = RES + "/init/{dataset}/{centres}/seed{seed}.pt"
INITS = {}
for (_d, _r, _s), _run in RUNS.items():
    if _run["needs_centres"]:
        INITS.setdefault((_d, centre_key(_run), _s), _run)
# Feature rule files append their final outputs (tables, figures) here; `rule all` requests them.
EXTRA_TARGETS = []

# GPU: one `gpu` unit per training job when CUDA may be used; cap concurrency with
# `--resources gpu=<number of GPUs>` (Snakemake does not assign device ids itself).
GPU = 0 if config["device"] == "cpu" or not shutil.which("nvidia-smi") else 1


wildcard_constraints:
    dataset="|".join(config["datasets"]),
    run="[A-Za-z0-9_+.()-]+",
    centres="[A-Za-z0-9_+.()-]+",
    seed=r"\d+",


def run_of(w):
    return RUNS[(w.dataset, w.run, w.seed)]


def run_json(w):
    return canonical_json(run_of(w))


def init_run(w):
    return INITS[(w.dataset, w.centres, w.seed)]


def init_json(w):
    """What the centre initialisation depends on (not the method, the rounds, nor evaluation)."""
    return canonical_json(centre_spec(init_run(w)))


def init_path(run):
    return INIT.format(dataset=run["dataset"], centres=centre_key(run), seed=run["seed"])


def raw_store(dataset):
    """The prepared store; datasets with identical `prepare` blocks share one (prepared once)."""
    prep = canonical_json(config["datasets"][dataset]["prepare"])
    return f"{DATA}/" + next(d for d, ds in config["datasets"].items()
                             if canonical_json(ds["prepare"]) == prep)


def store(dataset):
    """The store a dataset's runs train on: the prepared one, or its re-partitioned copy
    (workflow/rules/partition.smk) when its `partition` block changes the clients or the split."""
    if is_identity(config["datasets"][dataset].get("partition")):
        return raw_store(dataset)
    return f"{DATA}/partitioned/{dataset}"


SELECT_K = RES + "/select_k/{dataset}/{run}/seed{seed}.json"


def k_input(w, run=None):
    """The select_k result a `K: auto` run takes its K from (nothing for other runs)."""
    run = run or run_of(w)
    if not run["select_k"]:
        return {}
    return {"k": SELECT_K.format(dataset=run["dataset"], run=run["run_id"], seed=run["seed"])}


def k_flag(w, input):
    return ["--k-from", input.k] if "k" in input.keys() else []


def run_dirs():
    return [RUN_DIR.format(dataset=d, run=r, seed=s) for d, r, s in RUNS]


# MLflow: create the store, the experiment and one parent "sweep" run before any job starts;
# training jobs nest their runs under it (they read its id from the environment).
SWEEP = {}

onstart:
    if config["tracking"]:
        from mcfl.track import SWEEP_ENV, init_sweep

        SWEEP["id"] = init_sweep(config["experiment"], "snakemake " + time.strftime("%Y-%m-%d %H:%M:%S"))
        os.environ[SWEEP_ENV] = SWEEP["id"]

onsuccess:
    if SWEEP:
        from mcfl.track import end_sweep

        end_sweep(SWEEP["id"], "FINISHED")

onerror:
    if SWEEP:
        from mcfl.track import end_sweep

        end_sweep(SWEEP["id"], "FAILED")
