"""Papers behind one registry (mcfl.papers): the built-in papers' parts resolve, a paper registered
through the ``mcfl.papers`` entry-point group reaches the config's schema, the plan, the command line
and the DAG, and a paper that cannot be used is one line. The Toy paper of ``tests/paper_plugin/``
shows that a new paper's table takes three files, none of them mcfl's."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from conftest import ROOT
from mcfl import papers
from mcfl.config import ConfigError, validate
from mcfl.plan import Plan

PLUGIN = ROOT / "tests" / "paper_plugin"


@pytest.fixture
def toy(monkeypatch):
    """The Toy paper registered as an installed package's entry point would register it."""
    monkeypatch.syspath_prepend(str(PLUGIN))
    import toypaper

    ep = SimpleNamespace(name="toy", value="toypaper:PAPER", load=lambda: toypaper.PAPER)
    monkeypatch.setattr(papers, "_entry_points", lambda: {"toy": ep})
    papers.papers.cache_clear()
    yield toypaper
    papers.papers.cache_clear()


def _config() -> dict:
    return yaml.safe_load((PLUGIN / "toy.yaml").read_text())


def test_the_built_in_papers_parts_resolve():
    for name, paper in papers.papers().items():
        assert paper.name == name
        assert callable(paper.load("planner")) and paper.commands().write
        assert paper.docs is None or (ROOT / paper.docs).is_file()
    assert list(papers.sections()) == ["figures", "fedgsp"]


def test_the_new_papers_files_are_three_and_none_is_mcfls():
    assert sorted(p.name for p in PLUGIN.iterdir() if p.name != "__pycache__") == [
        "pyproject.toml", "toy.yaml", "toypaper.py"]
    assert 'toy = "toypaper:PAPER"' in (PLUGIN / "pyproject.toml").read_text()


def test_a_registered_paper_reaches_the_schema_the_plan_and_the_command_line(toy, tmp_path):
    cfg = validate(_config())
    plan = Plan(cfg)
    job = next(j for j in plan.paper_jobs() if j.rule == "toy_table1")
    assert job.command == ["paper", "toy", "table1"]
    assert job.outputs == {"table": "results/toy/table1.csv"} and "results/toy/table1.csv" in plan.targets()
    assert job.args[2:] == plan.run_dirs() and job.benchmark == "results/benchmarks/toy_table1.tsv"
    # the command: two runs' metrics.json in, the table out
    from mcfl.cli import main

    dirs = []
    for label, acc in (("FedAvg", 0.75), ("FedAvg", 0.25), ("NoFed", 0.5)):
        d = tmp_path / f"{label}{len(dirs)}"
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({"label": label, "final": {"micro_acc": acc}}))
        dirs.append(str(d))
    assert main(["paper", "toy", "table1", "--out", str(tmp_path / "t.csv"), *dirs]) == 0
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert [(r["method"], r["seeds"], float(r["micro_acc"]), r["paper"]) for r in rows] == [
        ("FedAvg", "2", 0.5, "0.9"), ("NoFed", "1", 0.5, "0.5")]


def test_a_registered_papers_section_is_validated_by_its_schema_and_its_check(toy):
    with pytest.raises(ConfigError, match="toy"):
        validate({**_config(), "toy": {"dataset": "digits", "extra": 1}})
    with pytest.raises(ConfigError, match="toy.dataset: unknown dataset 'nope'"):
        validate({**_config(), "toy": {"dataset": "nope"}})


def test_without_the_plugin_its_section_is_refused():
    with pytest.raises(ConfigError, match="toy"):
        validate(_config())


@pytest.mark.parametrize("ep, message", [
    (SimpleNamespace(name="fedgsp", value="x:PAPER", load=lambda: None), "is a built-in paper's"),
    (SimpleNamespace(name="bad", value="x:PAPER", load=lambda: 42), "is not an mcfl.papers.Paper"),
    (SimpleNamespace(name="bad", value="x:PAPER", load=lambda: 1 / 0), "cannot be loaded (ZeroDivisionError"),
])
def test_a_paper_that_cannot_be_used_is_one_line(monkeypatch, ep, message):
    monkeypatch.setattr(papers, "_entry_points", lambda: {ep.name: ep})
    papers.papers.cache_clear()
    try:
        with pytest.raises(papers.PaperError) as e:
            papers.papers()
        assert message in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(ConfigError, match="mcfl.papers"):        # before any job of the DAG
            validate(_config())
    finally:
        papers.papers.cache_clear()


def test_an_unknown_paper_names_the_known_ones():
    with pytest.raises(papers.PaperError, match="unknown paper 'nope'; known: fesem, fedcg, fedgsp"):
        papers.get("nope")


@pytest.mark.slow
def test_the_dag_builds_the_new_papers_table_on_the_tiny_digits_data(tmp_path, cli_env):
    site, source = tmp_path / "site", tmp_path / "toypaper"
    shutil.copytree(PLUGIN, source)                   # the build writes beside the sources
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True, env=cli_env, timeout=600,
                   capture_output=True)
    env = {**cli_env, "PYTHONPATH": str(site)}
    shutil.copy(PLUGIN / "toy.yaml", tmp_path / "toy.yaml")
    r = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                        str(tmp_path), "--cores", "2", "--configfile", str(tmp_path / "toy.yaml"),
                        "--config", "tracking=false"],
                       env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    results = tmp_path / "results-toy"                  # named after the config file
    rows = list(csv.DictReader(open(results / "toy" / "table1.csv")))
    assert [(x["method"], x["seeds"], x["paper"]) for x in rows] == [("FedAvg", "2", "0.9"), ("NoFed", "2", "0.5")]
    for x in rows:          # the mean of its runs' final accuracy
        accs = [json.loads((results / "runs" / "digits" / x["method"] / f"seed{s}" / "metrics.json")
                           .read_text())["final"]["micro_acc"] for s in (0, 1)]
        assert float(x["micro_acc"]) == pytest.approx(sum(accs) / 2, abs=1e-6)


def test_mcfl_paper_with_a_paper_that_cannot_be_used_is_one_line(monkeypatch, capsys):
    from mcfl.cli import main

    ep = SimpleNamespace(name="bad", value="x:PAPER", load=lambda: 42)
    monkeypatch.setattr(papers, "_entry_points", lambda: {"bad": ep})
    papers.papers.cache_clear()
    try:
        with pytest.raises(SystemExit) as e:
            main(["paper", "fedcg", "tables", "--out", "o", "r"])
        assert str(e.value) == "mcfl paper: error: entry point x:PAPER (mcfl.papers): 42 is not an mcfl.papers.Paper"
        assert main(["methods"]) == 0              # other commands do not load the papers
    finally:
        papers.papers.cache_clear()
