"""The DAG on a real (single-node) Slurm cluster, recorded by a real MLflow tracking server.

One sweep (tests/workflow/slurm/tiny.yaml: 2 datasets x 2 methods, one seed) goes through
`snakemake --profile profiles/slurm --workflow-profile profiles/slurm-test`, every job via `sbatch`,
with live tracking into `mlflow server`. During it, one training job is `scancel`ed mid-run (the
profile's retry resumes it from its checkpoint) and the tracking server is killed and restarted. The
results must equal a local run of the same config bitwise, and MLflow must hold each run exactly once.
A real Chromium then opens the experiment in the MLflow UI.

Needs root, Debian's `slurm-wlm` and `munge` (`.ci/run` installs them) and
`snakemake-executor-plugin-slurm` (`pip install -e '.[slurm]'`); skipped with the reason otherwise.
Timings and the cost of the cancelled job go to <results>/slurm_suite.json and the test's output.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import ROOT
from mcfl.timing import without_times

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLURM = ROOT / "tests" / "workflow" / "slurm"
TINY = SLURM / "tiny.yaml"
CANCEL = ("synthetic", "FedAvg", "0")          # the job scancel'ed mid-run
OUTPUT_FILES = ("history.csv", "assignments.csv", "predictions.csv", "state.pt")
FOUR = ("micro_acc", "macro_acc", "micro_f1", "macro_f1")


def _why_skip():
    missing = [b for b in ("slurmctld", "slurmd", "munged", "sbatch", "squeue") if not shutil.which(b)]
    if missing:
        return f"Slurm not installed ({', '.join(missing)} missing: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the test cluster runs its daemons and jobs as root"
    conf = Path("/etc/slurm/slurm.conf")
    if conf.exists() and "written by mcfl tests/slurm/start-cluster.sh" not in conf.read_text():
        return "/etc/slurm/slurm.conf belongs to a real cluster; not starting a test cluster over it"
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        return "snakemake-executor-plugin-slurm not installed (pip install -e '.[slurm]')"
    return None


if _why_skip():
    pytestmark.append(pytest.mark.skip(reason=_why_skip()))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mlflow server` on localhost: sqlite backend, local artifact root; killable and restartable."""

    def __init__(self, root: Path):
        self.root, self.port = root, _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.starts = []

    def start(self):
        t0 = time.time()
        cmd = [str(Path(sys.executable).parent / "mlflow"), "server",
               "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               "--artifacts-destination", str(self.root / "artifacts"),
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, process_group=0)
        from mcfl.track import check_server

        check_server(self.uri, wait=120)
        self.starts.append(round(time.time() - t0, 1))

    def kill(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm-state")
    t0 = time.time()
    r = subprocess.run(["bash", str(SLURM / "start-cluster.sh"), str(state)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    yield {"start_s": round(time.time() - t0, 1)}
    subprocess.run(["bash", str(SLURM / "stop-cluster.sh"), str(state)], capture_output=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("mlflow-server"))
    s.start()
    yield s
    s.kill()


def _env(**extra):
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("SLURM_CONF", None)
    env.update(extra)
    return env


def _snakemake(workdir, *args):
    return ["snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(TINY), *args]


def _cancel_when_checkpointed(workdir: Path, proc, timeout=400):
    """scancel the CANCEL job once its first checkpoint exists; return (slurm job id, round reached
    by then, from its log) after the job has left the node."""
    d, m, s = CANCEL
    ckpt = workdir / "results" / "checkpoints" / d / m / f"seed{s}.pt"
    logs = workdir / ".snakemake" / "slurm_logs" / "rule_train" / f"{d}_{m}_{s}"
    t0 = time.time()
    while not ckpt.exists():
        assert proc.poll() is None, "the Slurm run ended before the job to cancel checkpointed"
        assert time.time() - t0 < timeout, "no checkpoint"
        time.sleep(0.05)
    jobid = min(int(p.stem) for p in logs.glob("*.log"))
    subprocess.run(["scancel", str(jobid)], check=True)
    for _ in range(300):
        out = subprocess.run(["squeue", "-h", "-j", str(jobid), "-o", "%T", "--states=all"],
                             capture_output=True, text=True).stdout.strip()
        if out and out not in ("RUNNING", "COMPLETING", "PENDING"):
            break
        time.sleep(0.1)
    train_log = workdir / "logs" / "train" / d / m / f"seed{s}.log"
    text = train_log.read_text(errors="replace") if train_log.exists() else ""
    reached = max((int(x) for x in re.findall(r"(\d+)/30 ", text.replace("\r", "\n"))), default=None)
    return jobid, out, reached


def _metrics_sans_time(path):
    m = json.loads(Path(path).read_text())
    # a resumed run (the cancelled job's) also lists its segments: which process trained which rounds
    return {k: v for k, v in m.items() if k not in ("wall_s", "time_s", "git", "segments")}


@pytest.fixture(scope="module")
def sweep(cluster, server, tmp_path_factory):
    """The Slurm sweep (with one cancel and one server kill) beside a local run of the same config."""
    local, remote = tmp_path_factory.mktemp("local"), tmp_path_factory.mktemp("slurm")
    t0 = time.time()
    # the reference: same config, local executor, untracked (tracking does not change results)
    ref = subprocess.Popen(_snakemake(local, "--cores", "1", "--workflow-profile", "none",
                                      "--config", "tracking=False"),
                           env=_env(MLFLOW_TRACKING_URI=f"sqlite:///{local / 'mlflow.db'}"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    env = _env(MLFLOW_TRACKING_URI=server.uri, MCFL_TRACKING_WAIT="180")
    proc = subprocess.Popen(_snakemake(remote, "--profile", str(ROOT / "profiles" / "slurm"),
                                       "--workflow-profile", str(ROOT / "profiles" / "slurm-test")),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jobid, state, reached = _cancel_when_checkpointed(remote, proc)
    # kill the tracking server while jobs run, restart it a few seconds later
    time.sleep(2)
    server.kill()
    killed_at = time.time()
    time.sleep(5)
    server.start()
    down_s = round(time.time() - killed_at, 1)
    out, _ = proc.communicate(timeout=900)
    slurm_s = round(time.time() - t0, 1)
    ref_out, _ = ref.communicate(timeout=900)
    assert proc.returncode == 0, out[-5000:]
    assert ref.returncode == 0, ref_out[-5000:]
    resumed = (remote / "logs" / "train" / CANCEL[0] / CANCEL[1] / f"seed{CANCEL[2]}.log").read_text(errors="replace")
    m = re.search(r"resuming \S+ from round (\d+)", resumed)
    info = {"cluster_start_s": cluster["start_s"], "server_starts_s": server.starts,
            "sweep_s": slurm_s, "cancelled_job": jobid, "cancelled_state": state,
            "cancelled_at_round": reached, "resumed_from_round": int(m.group(1)) if m else None,
            "server_down_s": down_s, "sbatch_jobs": out.count("has been submitted with SLURM jobid")}
    if reached is not None and m:
        info["rounds_redone"] = reached - int(m.group(1))
    (remote / "results" / "slurm_suite.json").write_text(json.dumps(info, indent=1))
    print("slurm suite:", json.dumps(info))
    return {"local": local, "remote": remote, "out": out, "info": info}


def test_every_job_went_through_sbatch_and_results_equal_a_local_run_bitwise(sweep):
    local, remote = sweep["local"] / "results", sweep["remote"] / "results"
    cfg = yaml.safe_load(TINY.read_text())
    runs = sorted(p.parent.relative_to(local / "runs") for p in (local / "runs").glob("*/*/seed*/metrics.json"))
    assert len(runs) == len(cfg["datasets"]) * len(cfg["methods"]) * len(cfg["seeds"]) == 4
    for r in runs:
        for f in OUTPUT_FILES:
            a, b = (local / "runs" / r / f), (remote / "runs" / r / f)
            if f == "history.csv":                 # bitwise but for each round's seconds (mcfl.timing)
                a, b = (without_times(pd.read_csv(x)).to_csv(index=False).encode() for x in (a, b))
            else:
                a, b = a.read_bytes(), b.read_bytes()
            assert a == b, (r, f)
        assert _metrics_sans_time(local / "runs" / r / "metrics.json") == \
            _metrics_sans_time(remote / "runs" / r / "metrics.json"), r
    assert (local / "table.csv").read_bytes() == (remote / "table.csv").read_bytes()
    # every job of the DAG but the target rule `all` was an sbatch job, the cancelled one twice:
    # prepare 2, init_centres 2, train 4 (+1), figure_cases 2, report 1
    assert sweep["info"]["sbatch_jobs"] == 2 + 2 + 4 + 1 + 2 + 1
    assert re.findall(r"^localrule (\w+):", sweep["out"], re.M) == ["all"]


def test_cancelled_job_resumed_from_its_checkpoint(sweep):
    info = sweep["info"]
    assert info["cancelled_state"] == "CANCELLED"
    assert info["resumed_from_round"] is not None and info["resumed_from_round"] % 2 == 0
    assert f"SLURM-job '{info['cancelled_job']}' failed" in sweep["out"]
    assert not (sweep["remote"] / "results" / "checkpoints" / "synthetic" / "FedAvg" / "seed0.pt").exists()
    m = json.loads((sweep["remote"] / "results" / "runs" / "synthetic" / "FedAvg" / "seed0" / "metrics.json").read_text())
    k = info["resumed_from_round"]
    assert [(s["from"], s["to"]) for s in m["segments"]] == [(1, k), (k + 1, m["rounds"])]


def test_mlflow_server_holds_each_run_once(sweep, server):
    from mlflow import MlflowClient

    from mcfl.record import runs_link

    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name("mcfl-slurm-test")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    children = runs                                        # flat, tagged with the invocation
    assert len(children) == 4, [r.data.tags.get("mlflow.runName") for r in children]
    assert len({r.data.tags["sweep"] for r in children}) == 1
    assert f"MLflow: {runs_link(server.uri, exp.experiment_id)}" in sweep["out"]
    names = sorted(r.data.tags["mlflow.runName"] for r in children)
    assert len(set(names)) == 4 and {r.info.status for r in children} == {"FINISHED"}
    for r in children:
        t = r.data.tags
        d = sweep["remote"] / "results" / "runs" / t["dataset"] / json.loads(t["config_json"])["run_id"] / f"seed{t['seed']}"
        final = json.loads((d / "metrics.json").read_text())["final"]
        for k in FOUR:
            assert r.data.metrics[k] == final[k], (t["mlflow.runName"], k)
        hist = pd.read_csv(d / "history.csv")
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "train_loss")]
        assert steps == hist["round"].tolist(), t["mlflow.runName"]    # each round once, none lost


def test_mlflow_ui_shows_the_runs_and_compares_two(sweep, server, tmp_path):
    """The server's runs table at the printed link, in headless Chromium (tests/test_mlflow_ui.py)."""
    from test_mlflow_ui import CHROMIUM, chromium

    from mcfl.record import runs_link

    if not CHROMIUM:
        pytest.skip("no Chromium (apt-get install chromium)")
    from mlflow import MlflowClient

    exp = MlflowClient(server.uri).get_experiment_by_name("mcfl-slurm-test")
    dom = chromium(runs_link(server.uri, exp.experiment_id), tmp_path / "profile", "--dump-dom")
    assert "<strong>4</strong> matching runs" in dom and "FedAvg · " in dom