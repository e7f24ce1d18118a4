"""Every shipped study's config expands to the runs, data settings and outputs recorded in
``tests/config/expansions/`` (one JSON-lines file per study): rewriting a config (``extends:``,
named method sets, ``vars:``) must leave what it plans unchanged bit for bit, so that every table
built from it stays the same.

A study is the config files and ``--config`` values it is run with (the Makefile's study targets
and ``pipelines/dvc.yaml`` name the same). To record a new study's expansion, add it to
:data:`STUDIES` and run ``python tests/config/test_config_expansions.py NAME``."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPANSIONS = ROOT / "tests" / "config" / "expansions"

#: study -> (config files in order, Snakemake ``--config`` values)
STUDIES: dict[str, tuple[list[str], dict]] = {
    "default": (["config/config.yaml"], {}),
    "six-seeds": (["config/six-seeds.yaml"], {}),
    "fedcg-150": (["config/fedcg-150.yaml"], {}),
    "celeba-sample": (["config/celeba-sample.yaml"], {}),
    "fedcg-digits": (["config/fedcg-digits.yaml"], {}),
    "fedcg-digits-invert": (["config/fedcg-digits-invert.yaml"], {}),
    "fesem-digits-variants": (["config/fesem-digits-variants.yaml"], {}),
    "paper-femnist": (["config/paper-femnist.yaml"], {}),
    "paper-celeba": (["config/paper-celeba.yaml"], {}),
    "paper-fedcg-femnist": (["config/paper-fedcg-femnist.yaml"], {}),
    "paper-fedcg-celeba": (["config/paper-fedcg-celeba.yaml"], {}),
    "paper-fedgsp-femnist": (["config/paper-fedgsp-femnist.yaml"], {}),
    "femnist-sample": (["config/femnist-sample.yaml"], {}),
    **{f"femnist-sample-{o}": ([f"config/femnist-sample/{o}.yaml"], {})
       for o in ["paper", "authors", "authors-switches", "tune", "fedgsp", "fedcg", "variants",
                 "switches", "h248", "flic", "replication"]},
    **{f"femnist-sample-{p}": (["config/femnist-sample/precision.yaml"], {"vars": {"precision": p}})
       for p in ["bf16", "tf32"]},
}


def expansion(files: list[str], overrides: dict) -> list:
    """What the Snakefile plans from ``files`` and ``overrides`` (workflow/rules/common.smk's
    reading, then :class:`mcfl.plan.Plan`), as plain JSON values: the validated config's sections
    the files set (sections they leave to the schema's defaults are not the study's), the DAG's
    data stores and final outputs, then every training run, keyed by (dataset, run, seed), in the
    order the plan holds them (the configured runs in config order: the order of the tables' rows)."""
    from mcfl.config import name_defaults, read_configs, validate_with_overrides
    from mcfl.plan import Plan

    paths = [str(ROOT / f) for f in files]
    written = name_defaults(read_configs(paths), paths[-1])
    cfg = validate_with_overrides(copy.deepcopy(written), overrides, " + ".join(files))
    plan = Plan(cfg)
    head = {"config": {k: cfg[k] for k in written if k in cfg},
            "stores": sorted(plan.stores()), "targets": sorted(plan.targets())}
    return [head] + [{"/".join(map(str, key)): run} for key, run in plan.runs.items()]


def canonical(lines: list) -> str:
    """One sorted-JSON line per item (a changed run shows as one changed line)."""
    return "".join(json.dumps(item, sort_keys=True, default=str) + "\n" for item in lines)


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_each_study_plans_what_it_planned_before(study, monkeypatch):
    monkeypatch.chdir(ROOT)
    files, overrides = STUDIES[study]
    recorded = (EXPANSIONS / f"{study}.jsonl").read_text()
    assert canonical(expansion(files, overrides)) == recorded


def test_the_femnist_sample_replication_trains_the_base_studys_runs_on_the_original_writers(monkeypatch):
    """The femnist-sample replication's runs on the original dataset are the femnist-sample study's
    runs of the same label and seed, byte for byte (the same run folders, specs and MLflow runs),
    so its archived runs are reused; only the redrawn writers' runs carry a ``draw``."""
    from mcfl.io import canonical_json

    monkeypatch.chdir(ROOT)
    base_files, _ = STUDIES["femnist-sample"]
    base_head, *base_runs = expansion(base_files, {})
    head, *runs = expansion(*STUDIES["femnist-sample-replication"])
    base = {key: run for item in base_runs for key, run in item.items()}
    original = {tuple(key.split("/")): run for item in runs for key, run in item.items()
                if run["dataset"] == "femnist_sample"}
    redrawn = [run for item in runs for run in item.values() if run["dataset"] != "femnist_sample"]
    for key in ("results", "data_dir", "experiment"):              # the same folders, store and MLflow runs
        assert head["config"][key] == base_head["config"][key], key
    assert set(head["stores"]) >= set(base_head["stores"])
    assert len(original) == len(redrawn) == 11 * 3                 # 11 rows, 3 seeds, on each draw
    for key, run in original.items():
        assert canonical_json(run) == canonical_json(base["/".join(key)]), key
        assert (run["label"], run["seed"]) == (base["/".join(key)]["label"], base["/".join(key)]["seed"])
    assert {run["draw"] for run in redrawn} == {"flic"}
    plans = [_plan(STUDIES[study][0]) for study in ("femnist-sample", "femnist-sample-replication")]
    for dataset, run_id, seed in original:                          # the same jobs: the same inputs and spec
        w = SimpleNamespace(dataset=dataset, run=run_id, seed=str(seed))
        assert len({(p.training.run_json(w), repr(p.training.train_inputs(w))) for p in plans}) == 1, w


def _plan(files: list[str]):
    from mcfl.config import name_defaults, read_configs, validate_with_overrides
    from mcfl.plan import Plan

    paths = [str(ROOT / f) for f in files]
    return Plan(validate_with_overrides(name_defaults(read_configs(paths), paths[-1]), {}, " + ".join(files)))


def test_every_recorded_study_is_still_shipped():
    assert sorted(p.stem for p in EXPANSIONS.glob("*.jsonl")) == sorted(STUDIES)


if __name__ == "__main__":                      # record the expansions named (all without names)
    import os

    os.chdir(ROOT)
    EXPANSIONS.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[1:] or sorted(STUDIES):
        (EXPANSIONS / f"{name}.jsonl").write_text(canonical(expansion(*STUDIES[name])))
        print(f"recorded {name}")
