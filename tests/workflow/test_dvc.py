"""The `dvc repro` door: dvc.lock in step with the code, stages that run without an activated
environment on any config that params.yaml names, and a changed dataset parameter rerunning only
what depends on it, with `dvc status` clean after each run."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
import dvc_stage  # noqa: E402

DVC = Path(sys.executable).parent / "dvc"
TRAIN = {"rounds": 1, "lr": 0.1, "eval_every": 1, "clients_per_round": 3}
TINY = {
    "experiment": "dvc-test", "results": "results-tiny", "tracking": False, "seeds": [0],
    "datasets": {
        "digits": {"prepare": {"source": "digits", "clients": 6, "clusters": 2, "seed": 0},
                   "model": {"name": "digits_cnn"}, "train": TRAIN},
        "synthetic": {"prepare": {"source": "synthetic", "clients": 6, "clusters": 2, "classes": 5,
                                  "dim": 60, "seed": 1},
                      "model": {"name": "logreg"}, "train": {**TRAIN, "lr": 0.05}}},
    "methods": [{"method": "FedAvg"}],
}


def project_copy(dst: Path) -> Path:
    """The working tree's files as a fresh clone has them (tracked and new, not ignored), in a new
    git repository."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files of a fresh clone are unknown")
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, names):
        if (ROOT / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    return dst


def bare_env() -> dict:
    """No activated environment: the project's .venv is not on PATH (PYTHONPATH passes through, for
    checkouts whose environment points at another copy of the source)."""
    env = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def dvc(proj, *args, ok=True):
    r = subprocess.run([str(DVC), *args], cwd=proj, env=bare_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900)     # one stream, in order
    assert (r.returncode == 0) == ok, r.stdout[-3000:]
    return r.stdout


@pytest.mark.slow
def test_dvc_lock_is_in_step_with_the_code(tmp_path):
    """On a fresh clone `dvc status` may only miss the outputs (nothing ran yet): every dependency
    and parameter dvc.lock records matches the code and config/config.yaml. Fails after any change
    to the package, the workflow or the config until `make dvc-lock` records it."""
    proj = project_copy(tmp_path)
    out = dvc(proj, "status", "--json", "dvc.yaml")         # the default config's stages
    status = yaml.safe_load(out[out.index("{"):])
    params = yaml.safe_load((proj / "params.yaml").read_text())
    outputs = {params["data_dir"], params["results"]}     # absent before any run, as outputs and deps

    def stale(change):
        if isinstance(change, str):                        # "always changed"
            return change
        if "changed outs" in change:
            return None
        deps = {p: s for p, s in change.get("changed deps", {}).items() if p not in outputs}
        return {**change, "changed deps": deps} if deps or len(change) > 1 else None

    stale = {stage: [c for c in map(stale, changes) if c] for stage, changes in status.items()}
    assert not any(stale.values()), f"dvc.lock is out of step with the code ({stale}): run `make dvc-lock`"


def test_stage_refuses_a_params_file_that_disagrees_with_its_config(tmp_path, capsys):
    cfg = tmp_path / "study.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "data_dir": "data-study"}))
    assert dvc_stage.main([str(cfg), "data", "results"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("params.yaml: data_dir is 'data' but ")
    assert f"-S config={cfg} -S data_dir=data-study -S results=results-tiny" in err
    assert dvc_stage.main([str(tmp_path / "none.yaml"), "data", "results"]) == 1
    assert "none.yaml: no such config file" in capsys.readouterr().err


@pytest.mark.slow
def test_dvc_repro_without_activation_reruns_only_the_changed_dataset(tmp_path):
    """`.venv/bin/dvc repro` with nothing activated, on a config of its own named in params.yaml:
    the first run prepares and trains both datasets; `dvc status` is clean after it; a second run
    starts nothing; a changed prepare parameter of one dataset re-prepares and retrains that
    dataset alone, and `dvc status` is clean again."""
    from dag_helpers import job_counts

    if sys.prefix == sys.base_prefix:
        pytest.skip("the stages start Snakemake from the project's .venv; these tests run outside one")
    proj = project_copy(tmp_path / "proj")
    (proj / ".venv").symlink_to(sys.prefix)      # what `make setup` leaves in a fresh clone
    (proj / "config" / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    params = yaml.safe_load((proj / "params.yaml").read_text())
    (proj / "params.yaml").write_text(yaml.safe_dump({**params, "config": "config/tiny.yaml",
                                                      "data_dir": "data-tiny", "results": "results-tiny"}))

    def jobs(out):
        """Snakemake's job counts per DVC stage that ran a command."""
        return {p.split("'")[0]: job_counts(p) for p in out.split("Running stage '")[1:]}

    clean = "Data and pipelines are up to date."
    assert jobs(dvc(proj, "repro")) == {"data": {"prepare": 2, "data_all": 1},
                                        "reproduce": {"train": 2, "report": 1, "all": 1}}
    assert (proj / "results-tiny" / "table.md").is_file()
    assert clean in dvc(proj, "status", "dvc.yaml")
    again = dvc(proj, "repro")
    assert jobs(again) == {} and again.count("didn't change, skipping") == 2

    tiny = proj / "config" / "tiny.yaml"
    tiny.write_text(tiny.read_text().replace("clients: 6", "clients: 8", 1))  # digits comes first
    stamps = {d: (proj / "data-tiny" / d / "meta.json").stat().st_mtime_ns for d in ("digits", "synthetic")}
    out = dvc(proj, "repro")
    assert jobs(out) == {"data": {"prepare": 1, "data_all": 1},
                         "reproduce": {"train": 1, "report": 1, "all": 1}}
    assert max(map(len, out.splitlines())) < 400               # no job's details (--quiet rules)
    after = {d: (proj / "data-tiny" / d / "meta.json").stat().st_mtime_ns for d in stamps}
    assert after["digits"] != stamps["digits"] and after["synthetic"] == stamps["synthetic"]
    assert clean in dvc(proj, "status", "dvc.yaml")


def test_every_other_config_entry_names_its_own_folders():
    """pipelines/dvc.yaml: each entry's folders are the ones its config writes (else the stage
    stops before running), none is the default config's or another entry's, and every shipped
    stand-alone config with folders of its own has an entry."""
    from mcfl.config import load_config, read_yaml

    entries = yaml.safe_load((ROOT / "pipelines" / "dvc.yaml").read_text())["vars"][0]["configs"]
    for name, e in entries.items():
        cfg = load_config(ROOT / e["config"])
        assert (e["data_dir"], e["results"]) == (cfg["data_dir"], cfg["results"]), name
        assert name.endswith(Path(e["config"]).stem)
    folders = [f for e in entries.values() for f in (e["data_dir"], e["results"])]
    default = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert len(set(folders)) == len(folders) and not {default["data_dir"], default["results"]} & set(folders)
    own = {p.stem for p in (ROOT / "config").glob("*.yaml") if p.name != "config.yaml"
           and "methods" in (raw := read_yaml(p)) and raw.get("results", "results") != "results"}
    assert own <= set(entries)


@pytest.mark.slow
def test_another_config_runs_through_its_own_stage_and_leaves_the_default_alone(tmp_path):
    """`dvc repro pipelines/dvc.yaml:data@fedcg-digits` with nothing activated prepares that
    config's stores into its own folder, records its own lock entries, and leaves params.yaml,
    dvc.lock and the default config's status as they were."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the stages start Snakemake from the project's .venv; these tests run outside one")
    proj = project_copy(tmp_path / "proj")
    (proj / ".venv").symlink_to(sys.prefix)
    before = {f: (proj / f).read_text() for f in ("params.yaml", "dvc.lock")}
    status = dvc(proj, "status", "dvc.yaml")
    dvc(proj, "repro", "pipelines/dvc.yaml:data@fedcg-digits")
    assert (proj / "data-fedcg-digits" / "digits_domains").is_dir() and not (proj / "data").exists()
    assert "data@fedcg-digits" in yaml.safe_load((proj / "pipelines" / "dvc.lock").read_text())["stages"]
    assert {f: (proj / f).read_text() for f in before} == before
    assert dvc(proj, "status", "dvc.yaml") == status
    assert "up to date" in dvc(proj, "status", "pipelines/dvc.yaml:data@fedcg-digits")
