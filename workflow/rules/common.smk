# Validate the config (before any job) and plan the DAG: mcfl.plan.Plan answers what runs, stores,
# centre files, sweeps and paths the config yields, with one planner per stage (P.prepare, P.training,
# P.publishing) and per registered paper (P.papers; workflow/rules/papers.smk declares their jobs);
# the rule files only declare rules over it (P).
#
# Quoting rule: every {field} in a shell command is written {field:q} (shell-quoted; a list is quoted
# element by element, so an optional flag is a list: the flag and its value, or nothing). Config values
# (results, data_dir, experiment, ...) then reach the command as single words whatever they contain;
# tests/workflow/test_workflow_faults.py checks every rule file for it.
import os
import sys
import time

from snakemake.exceptions import WorkflowError

from mcfl.config import ConfigError, name_defaults, read_configs, validate_with_overrides
from mcfl.data.store import FORMAT as STORE_FORMAT  # a param of the rules that write stores
from mcfl.plan import Plan, dag_jobs

try:
    # The config files are read and merged by mcfl's loader, the one `mcfl check-config A B` uses (a
    # file's `extends:` base, an overlay's `replace:` keys; duplicated keys, deep nesting, alias bombs and files over 1 MB
    # refused), and that reading replaces Snakemake's, with `--config KEY=VALUE` on top (an error
    # only those values make names them, not the files); `results`/`experiment` left out are named
    # after the last config file.
    _merged = read_configs(workflow.configfiles)
    if workflow.configfiles:
        name_defaults(_merged, workflow.configfiles[-1])
    _merged = validate_with_overrides(
        _merged,
        workflow.config_settings.config or {},
        " + ".join(map(str, workflow.configfiles)) or "config",
    )
    config.clear()
    config.update(_merged)
    # the config file a paper's published page names (the first given, as `make` runs the studies)
    P = Plan(
        config,
        config_file=(
            os.path.relpath(workflow.overwrite_configfiles[0])
            if workflow.overwrite_configfiles
            else "config/config.yaml"
        ),
    )
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
    first=P.wildcard_constraints()["first"],
    seed=P.wildcard_constraints()["seed"],


# MLflow: create the store and the experiment (with the runs table's view) before any job starts;
# every run is tagged with this invocation (`sweep`: config file and start time). A store that
# cannot be used stops here with one line. The last line of a successful invocation says what to
# open (mcfl.record.ui_hint).
MLFLOW = {}


onstart:
    # what the jobs Snakemake is about to run cost on this machine (mcfl.cost: its DAG's training
    # runs, centre files and first local models, packed on the cores in the order they wait for each
    # other; `mcfl check-config` shows every run): timed on a few local steps of each model, seconds
    try:
        from mcfl.cost import estimate

        print(estimate(P, dag=dag_jobs(workflow.dag)).summary(cores=workflow._cores, detail=False), flush=True)
    except Exception as e:  # noqa: BLE001 - an estimate never stops the workflow
        print(f"(no cost estimate: {e})")
    if config["tracking"]:
        from mcfl.track import SWEEP_ENV, UNREACHABLE_ENV, TrackingError
        from mcfl.record import init_sweep

        _names = [os.path.basename(str(f)) for f in workflow.configfiles]
        os.environ[SWEEP_ENV] = " + ".join(_names or ["snakemake"]) + time.strftime(" %Y-%m-%d %H:%M:%S")
        try:
            MLFLOW["experiment_id"] = init_sweep(config["experiment"], P.runs.values())
        except TrackingError as e:
            if os.environ.get(UNREACHABLE_ENV) == "defer":  # jobs train untracked
                print(f"warning: {e}", file=sys.stderr)
            else:
                print(f"error: {e}", file=sys.stderr)
                os._exit(1)  # before any job; Snakemake would print a traceback


onerror:
    # a job that could not write its log (a full disk under logs/: exit status 74) leaves an empty
    # log; say why here, where the user reads Snakemake's error
    from mcfl.paths import disk_full_note

    _note = disk_full_note(P.log_dir)
    if _note:
        print(f"error: {_note}", file=sys.stderr)


onsuccess:
    import atexit
    import glob

    # at exit, after Snakemake's own last line ("Complete log(s): ..."): where the tables are, then
    # the command that opens the runs (the project's mlflow by its path: nothing to activate)
    _tables = [P.res("table.md"), P.res("paper_comparison.md"), P.res("fedcg/tables.md")]
    _tables += sorted(glob.glob(os.path.join(glob.escape(P.res("fedgsp")), "*", "table.md")))
    _tables = [t for t in _tables if os.path.isfile(t)]
    _tail = [f"Tables: {', '.join(_tables)}"] if _tables else []
    if MLFLOW:
        from mcfl.record import ui_hint

        _tail.append(f"MLflow: {ui_hint(MLFLOW['experiment_id'], runs=len(P.runs))}")
    if _tail:
        atexit.register(print, "\n".join(_tail), file=sys.stderr)
