"""docs/tools/device/jobs.py: the job scripts a lent GPU machine runs without Snakemake must run
exactly the workflow's own commands (same outputs), make the folders Snakemake would make, and
make shared initial centres once when several jobs start at the same time."""

import shutil
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT
from test_workflow import TINY, snakemake, write_config

pytestmark = pytest.mark.slow

# test_workflow's tiny digits dataset; FeSEM(2) and FeSEM-MA(2) share one initial-centres file
CFG = {**TINY, "experiment": "device-jobs-test", "seeds": [0],
       "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": [2], "restarts": 2},
                   {"method": "FeSEM-MA", "K": 2, "restarts": 2}]}
RUNS = ["FedAvg", "FeSEM-K2", "FeSEM-MA-K2"]


def test_job_scripts_run_the_workflows_commands(tmp_path, cli_env):
    write_config(tmp_path, CFG)
    targets = [f"results/runs/digits/{r}/seed0/metrics.json" for r in RUNS]
    made = snakemake(tmp_path, cli_env, *targets)
    assert made.returncode == 0, made.stderr[-3000:]
    shutil.move(tmp_path / "results" / "runs", tmp_path / "reference")

    # the centres exist here, so the dry run has no command making them: jobs.py names the file
    # instead of writing jobs that would fail on a machine without it
    dry = snakemake(tmp_path, cli_env, *targets, "-n", "-p", "--rerun-triggers", "mtime")
    (tmp_path / "dry0.txt").write_text(dry.stdout)
    [centres] = [str(p.relative_to(tmp_path)) for p in (tmp_path / "results" / "init").rglob("seed0.pt")]
    tool = [sys.executable, str(ROOT / "docs/tools/device/jobs.py"), str(tmp_path / "dry0.txt"), "--out",
            str(tmp_path / "j0")]
    need = subprocess.run(tool + ["--centres-needed"], capture_output=True, text=True, env=cli_env)
    assert need.stdout.split() == [centres]
    refused = subprocess.run(tool, capture_output=True, text=True, env=cli_env)
    assert refused.returncode != 0 and centres in refused.stderr and not (tmp_path / "j0").exists()
    shutil.rmtree(tmp_path / "results" / "init")
    shutil.rmtree(tmp_path / "logs")

    dry = snakemake(tmp_path, cli_env, *targets, "-n", "-p", "--rerun-triggers", "mtime")
    assert dry.returncode == 0, dry.stderr[-3000:]
    (tmp_path / "dry.txt").write_text(dry.stdout)
    jobs = tmp_path / "jobs"
    made = subprocess.run([sys.executable, str(ROOT / "docs/tools/device/jobs.py"), str(tmp_path / "dry.txt"),
                           "--out", str(jobs), "--device", "cpu", "--first", "results-FeSEM-K2-s0"],
                          capture_output=True, text=True, env=cli_env)
    assert made.returncode == 0, made.stderr
    scripts = sorted(jobs.glob("*.sh"))
    assert [s.name for s in scripts] == ["00-results-FeSEM-K2-s0.sh", "01-results-FedAvg-s0.sh",
                                         "02-results-FeSEM-MA-K2-s0.sh"]
    assert all("--device cpu" in s.read_text() and "--device auto" not in s.read_text() for s in scripts)

    # all at once, as the queue starts them: the two FeSEM jobs race for the shared centres
    procs = [subprocess.Popen(["bash", str(s)], cwd=tmp_path, env=cli_env, stderr=subprocess.PIPE, text=True)
             for s in scripts]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()
    assert len(list((tmp_path / "results" / "init").rglob("seed0.pt"))) == 1
    for r in RUNS:
        ours = tmp_path / "results" / "runs" / "digits" / r / "seed0"
        ref = tmp_path / "reference" / "digits" / r / "seed0"
        for f in ("predictions.csv", "assignments.csv"):
            assert (ours / f).read_bytes() == (ref / f).read_bytes(), f"{r}/{f} differs from Snakemake's run"
        timings = ["local_s", "aggregate_s", "eval_s"]
        pd.testing.assert_frame_equal(pd.read_csv(ours / "history.csv").drop(columns=timings),
                                      pd.read_csv(ref / "history.csv").drop(columns=timings))
        assert (tmp_path / "logs" / "train" / "digits" / r / "seed0.log").exists()


def test_unknown_first_job_is_named(tmp_path):
    dry = tmp_path / "dry.txt"
    dry.write_text("")
    r = subprocess.run([sys.executable, str(ROOT / "docs/tools/device/jobs.py"), str(dry), "--out", str(tmp_path / "j"),
                        "--first", "nope"], capture_output=True, text=True)
    assert r.returncode != 0 and "no such job nope" in r.stderr


def test_archived_runs_get_no_job_and_name_order_is_priority_order_past_100(tmp_path):
    """A run kept by archive_runs.py (finished elsewhere) is not trained again, and with more than
    100 jobs the zero-padded numbers keep the queue's name order equal to the priority order."""
    lines = [f"Shell command: mcfl train --run '{{\"run_id\":\"R{i}\",\"seed\":0}}' --device auto "
             f"--out \"$(dirname res/runs/d/R{i}/seed0/metrics.json)\" > logs/R{i}.log 2>&1" for i in range(103)]
    dry = tmp_path / "dry.txt"
    dry.write_text("\n".join(lines) + "\n")
    kept = tmp_path / "kept" / "res" / "d" / "R5" / "seed0"
    kept.mkdir(parents=True)
    (kept / "metrics.json").write_text("{}")
    (tmp_path / "kept" / "res" / "d" / "R6" / "seed0").mkdir(parents=True)   # no metrics.json: not finished
    out = tmp_path / "jobs"
    r = subprocess.run([sys.executable, str(ROOT / "docs/tools/device/jobs.py"), str(dry), "--out", str(out),
                        "--archived", str(tmp_path / "kept"), "--first", "res-R102-s0",
                        "--last", "res-R3-s0", "res-R1-s0"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.glob("*.sh"))            # queue.sh's order
    expect = (["res-R102-s0"] + [f"res-R{i}-s0" for i in range(102) if i not in (1, 3, 5)]
              + ["res-R3-s0", "res-R1-s0"])
    assert [n.split("-", 1)[1][:-3] for n in names] == expect
    assert names[0] == "000-res-R102-s0.sh" and names[-1] == "101-res-R1-s0.sh"
    assert "--device cuda" in (out / names[0]).read_text()
