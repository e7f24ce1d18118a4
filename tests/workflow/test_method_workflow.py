"""A method outside the package through the whole workflow: the page "Write your own method" shows
the example package's files as they are, and its steps (install, `mcfl methods`, `mcfl
check-method`, the DAG with the paired sign test) run end to end on a small scale."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from conftest import ROOT

EXAMPLE = ROOT / "examples" / "fedavgm"
PAGE = ROOT / "docs" / "methods" / "own-method.md"


def blocks(language: str) -> list[str]:
    """The page's fenced code blocks in ``language``."""
    return [b.strip() + "\n" for b in re.findall(rf"^```{language}\n(.*?)^```", PAGE.read_text(), re.S | re.M)]


def test_the_page_shows_the_example_packages_files_as_they_are():
    python = blocks("python")
    assert python[0] == (EXAMPLE / "fedavgm.py").read_text()
    assert python[1] in (EXAMPLE / "test_fedavgm.py").read_text()
    assert blocks("toml") == [(EXAMPLE / "pyproject.toml").read_text()]


def test_the_page_runs_the_examples_config_and_the_kits_checks():
    from mcfl.check import CHECKS

    commands = "".join(blocks("bash"))
    assert "examples/fedavgm/femnist-sample.yaml" in commands and "mcfl check-method FedAvgM" in commands
    assert re.findall(r"^\| `([a-z-]+)` \|", PAGE.read_text(), re.M) == list(CHECKS)
    cfg = yaml.safe_load((EXAMPLE / "femnist-sample.yaml").read_text())
    assert [m["method"] for m in cfg["methods"]] == ["FedAvg", "FeSEM", "FedAvgM"]
    assert cfg["protocols"]["reference"] == "FedAvg"


def snakemake(workdir, env, *args):
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--cores", "2", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)


def install_example(tmp_path, env) -> dict:
    """``pip install`` the example package into a folder of its own, on PYTHONPATH: its module and
    its entry point, as in mcfl's environment after `pip install -e examples/fedavgm`."""
    site, source = tmp_path / "site", tmp_path / "fedavgm"
    shutil.copytree(EXAMPLE, source)                  # the build writes beside the sources
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True, env=env, timeout=600,
                   capture_output=True)
    return {**env, "PYTHONPATH": str(site)}


@pytest.mark.slow
def test_the_pages_steps_run_end_to_end_on_a_small_scale(tmp_path, cli_env):
    env = install_example(tmp_path, cli_env)
    methods = subprocess.run(["mcfl", "methods"], env=env, capture_output=True, text=True, check=True).stdout
    assert "[entry point fedavgm:FedAvgM of mcfl-fedavgm 0.1.0]" in " ".join(methods.split())
    kit = subprocess.run(["mcfl", "check-method", "FedAvgM"], env=env, capture_output=True, text=True)
    assert kit.returncode == 0 and kit.stdout.splitlines()[-1] == "FedAvgM: all 8 checks passed", kit.stdout
    # the example's config, small: two seeds (pairs for the sign test), two short rounds, a narrow CNN
    small = {"results": "results-fedavgm", "seeds": [0, 1], "tracking": True,
             "datasets": {"femnist_sample": {"model": {"name": "femnist_cnn", "hidden": 64},
                                             "train": {"rounds": 2, "clients_per_round": 4, "local_steps": 2,
                                                       "eval_every": 1, "checkpoint_every": 1}}}}
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    r = snakemake(tmp_path, env, "--configfile", str(EXAMPLE / "femnist-sample.yaml"), str(tmp_path / "small.yaml"))
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(tmp_path / "results-fedavgm" / "docs" / "results" / "fedavgm.csv")
    assert table["method"].tolist() == ["FedAvg", "FeSEM(2)", "FedAvgM"]
    assert table.loc[2, "sign_p"] == table.loc[2, "sign_p"] and table.loc[2, "seeds"] == 2   # not NaN
    metrics = json.loads((tmp_path / "results-fedavgm" / "runs" / "femnist_sample" / "FedAvgM" / "seed0"
                          / "metrics.json").read_text())
    assert metrics["config"]["method"] == "FedAvgM" and metrics["config"]["params"] == {"beta": 0.9, "server_lr": 1.0}
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["fedavgm-femnist-sample"])
    origin = dict(zip(runs["tags.label"], runs["tags.method_origin"]))
    assert origin == {"FedAvg": "built-in", "FeSEM(2)": "built-in",
                      "FedAvgM": "entry point fedavgm:FedAvgM of mcfl-fedavgm 0.1.0"}


TINY = {"experiment": "plugin-test", "seeds": [0], "tracking": True,
        "datasets": {"digits": {"prepare": {"source": "digits", "clients": 8, "clusters": 2, "seed": 0},
                                "model": {"name": "digits_cnn"},
                                "train": {"rounds": 2, "clients_per_round": 4, "local_steps": 2,
                                          "executor": "batched"}}},
        "methods": [{"method": "FedAvg"}, {"method": "fedavgm:FedAvgM", "beta": 0.5}, {"method": "CFL"}]}


@pytest.mark.slow
def test_a_module_class_method_runs_through_the_dag(tmp_path, cli_env):
    env = {**cli_env, "PYTHONPATH": str(EXAMPLE)}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(TINY))
    dry = snakemake(tmp_path, env, "-n")
    assert dry.returncode == 0 and "runs/digits/FedAvgM/seed0" in dry.stdout, dry.stderr[-3000:]
    r = snakemake(tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(tmp_path / "results" / "table.csv")
    assert table["method"].tolist() == ["FedAvg", "FedAvgM", "FedCluster"]
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["plugin-test"])
    assert dict(zip(runs["tags.label"], runs["tags.method_origin"]))["FedAvgM"] == "fedavgm:FedAvgM"
    assert set(runs["params.params.beta"].dropna()) == {"0.5"}


def test_the_api_page_lists_every_registered_methods_module():
    """Adding a method to the registry adds its module to the API reference."""
    import importlib.util
    from types import SimpleNamespace

    from mcfl.algorithms import REGISTRY

    spec = importlib.util.spec_from_file_location("hooks", ROOT / "docs" / "tools" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = SimpleNamespace(file=SimpleNamespace(src_uri="api/algorithms.md"))
    md = hooks.on_page_markdown("# A\n\n<!-- registry-modules -->\n", page, {"docs_dir": str(ROOT / "docs")}, None)
    listed = [line.removeprefix("::: ") for line in md.splitlines() if line.startswith(":::")]
    assert listed == list(dict.fromkeys(f"mcfl.algorithms.{v.split(':')[0]}" for v in REGISTRY.values()))
    assert "<!-- registry-modules -->" in (ROOT / "docs" / "api" / "algorithms.md").read_text()
