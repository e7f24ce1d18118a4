"""profiles/gpu: the Snakemake profile for one GPU machine parses into the options the docs promise
(a cap on training jobs sharing the GPU, one thread each, the greedy scheduler), and a dry run under it
plans a small study in which every job that puts a model on the device holds one `gpu` unit. The GPU
is faked by an `nvidia-smi` on PATH (all the workflow asks of it); nothing trains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import ROOT
from dag_helpers import job_counts

PROFILE = ROOT / "profiles" / "gpu"

TINY = {
    "experiment": "gpu-profile-test", "seeds": [0, 1], "tracking": False,
    "datasets": {
        "digits": {"prepare": {"source": "digits", "clients": 8, "clusters": 2, "seed": 0},
                   "model": {"name": "digits_cnn"}, "train": {"rounds": 2, "lr": 0.1}},
        "synthetic": {"prepare": {"source": "synthetic", "clients": 8, "clusters": 2, "seed": 1},
                      "model": {"name": "logreg"}, "train": {"rounds": 2, "lr": 0.05}},
    },
    "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": [2], "restarts": 2}],
}


def test_the_gpu_profile_parses_into_the_documented_options():
    from snakemake.cli import parse_args

    _, args = parse_args(["--workflow-profile", str(PROFILE), "-n"])
    assert {k: v.value for k, v in args.resources.items()} == {"gpu": 14}
    assert args.scheduler == "greedy"                    # no ILP solver needed
    assert {k: v.value for k, v in args.set_threads.items()} == {"train": 1, "train_seeds": 1}
    assert args.rerun_incomplete and args.keep_going


def test_a_dry_run_under_the_gpu_profile_gives_every_model_job_one_gpu_unit(tmp_path, cli_env):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {**cli_env, "PATH": f"{fake}{os.pathsep}{cli_env['PATH']}"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(TINY))
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-n", "-s", str(ROOT / "Snakefile"),
           "--workflow-profile", str(PROFILE), "--directory", str(tmp_path),
           "--configfile", str(tmp_path / "c.yaml")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "Using workflow specific profile" in out
    counts = job_counts(r.stdout)
    assert counts.get("train", 0) + counts.get("train_seeds", 0) >= 4      # 2 datasets x 2 methods
    # one block per job: its rule and its resources line
    gpu = {}
    for block in out.split("\nrule ")[1:] + out.split("\nlocalrule ")[1:]:
        rule = block.split(":", 1)[0].strip()
        res = [line for line in block.splitlines() if line.strip().startswith("resources:")]
        if res:
            gpu.setdefault(rule, set()).add("gpu=1" in res[0])
    for rule in ("train", "train_seeds", "init_centres"):
        assert gpu.get(rule, {True}) == {True}, (rule, gpu)
    assert gpu.get("prepare") == {False}
    assert any(rule in gpu for rule in ("train", "train_seeds"))
