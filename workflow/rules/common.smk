# Validate the config (before any job) and plan the DAG: mcfl.plan.Plan answers what runs, stores,
# centre files, sweeps and paths the config yields; the rule files only declare rules over it (P).
#
# Quoting rule: every {field} in a shell command is written {field:q} (shell-quoted; a list is quoted
# element by element, so an optional flag is a list: the flag and its value, or nothing). Config values
# (results, data_dir, experiment, ...) then reach the command as single words whatever they contain;
# tests/test_faults.py checks every rule file for it.
import copy
import os
import time

from snakemake.exceptions import WorkflowError
from snakemake.utils import update_config

from mcfl.config import ConfigError, read_yaml, validate
from mcfl.data.store import FORMAT as STORE_FORMAT  # a param of the rules that write stores
from mcfl.plan import Plan

try:
    # Every config file is read again with mcfl's loader, the one `mcfl check-config` uses (it
    # refuses duplicated keys, which Snakemake's keeps the last of, deep nesting, alias bombs and
    # files over 1 MB), and that reading replaces Snakemake's, with --config KEY=VALUE on top.
    if workflow.configfiles:
        _loaded = {}
        for _f in workflow.configfiles:
            _doc = read_yaml(_f)
            if not isinstance(_doc, dict):
                raise ConfigError(f"{_f}: top level must be a mapping")
            update_config(_loaded, _doc)
        update_config(_loaded, copy.deepcopy(dict(workflow.config_settings.config or {})))
        config.clear()
        config.update(_loaded)
    validate(config, " + ".join(map(str, workflow.configfiles)) or "config")
    P = Plan(config)
except ConfigError as e:
    raise WorkflowError(f"invalid configuration: {e}")

# The names other rule files use (P's values, under the names they have always had).
DATA = config["data_dir"]
RES = config["results"]
RUNS = P.runs
RUN_DIR = P.run_dir
LOGS = P.log_dir
store = P.store
run_dirs = P.run_dirs
# GPU: one `gpu` unit per training job when CUDA may be used; cap concurrency with
# `--resources gpu=<number of GPUs>` (Snakemake does not assign device ids itself).
GPU = P.gpu()
# Final outputs beside the report (tables, figures of the optional stages); `rule all` requests them.
EXTRA_TARGETS = P.targets()


wildcard_constraints:
    dataset=P.wildcard_constraints()["dataset"],
    run=P.wildcard_constraints()["run"],
    centres=P.wildcard_constraints()["centres"],
    seed=P.wildcard_constraints()["seed"],


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
