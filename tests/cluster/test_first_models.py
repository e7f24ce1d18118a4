"""Centre files that cluster the same first local models share them (mcfl.cluster.init,
``mcfl first-models``, the DAG's ``first_models`` rule): the centres are bit for bit those each
centre job makes by training the clients itself, and the workflow plans the shared job only where it
pays (FeSEM(2), (3), (4), Robust(3) ... of the authors' code study share one per seed; the default
config's tiny digits models do not)."""

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import ROOT, make_run
from mcfl import cli
from mcfl.cluster.init import all_first_models, init_centres, load_first_models, save_first_models
from mcfl.cluster.spec import centre_key, first_models_key
from mcfl.config import read_configs, validate
from mcfl.data import load
from mcfl.federation import build_federation
from mcfl.plan import Plan
from mcfl.plan.train import FIRST_MODELS_MIN_WORK


@pytest.fixture(scope="module")
def fed(digits_store):
    return build_federation(load(digits_store), {"name": "digits_cnn"},
                            {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 1}, seed=0)


@pytest.mark.parametrize("K, options", [
    (3, {"restarts": 3}),                                   # k-means on all weights
    (2, {"method": "random", "distance": "last_layer"}),    # the authors' random partition
    (4, {"restarts": 2, "weighted": True, "keep_bytes": 0}),  # sample-weighted; the two-pass path
], ids=["kmeans", "random", "weighted-two-pass"])
def test_centres_from_shared_first_models_are_those_the_job_trains_itself(fed, K, options):
    models = all_first_models(fed)
    assert models.shape == (fed.n_clients, fed.model.size)
    own, shared = init_centres(fed, K, **options), init_centres(fed, K, models=models, **options)
    assert torch.equal(own.centres, shared.centres) and torch.equal(own.assign, shared.assign)
    assert own.inertia == shared.inertia
    with pytest.raises(ValueError, match=r"first local models \(15, \d+\) do not fit m=16"):
        init_centres(fed, K, models=models[:-1], **options)


def test_the_cli_pair_writes_the_same_centres_file_and_refuses_a_wrong_one(digits_store, tmp_path, capsys):
    run = make_run(method="FeSEM", params={"K": 3, "restarts": 2}, local_epochs=1)
    common = ["--run", json.dumps(run), "--store", str(digits_store), "--device", "cpu", "--threads", "1",
              "--no-progress"]
    assert cli.main(["first-models", *common, "--out", str(tmp_path / "first.pt")]) == 0
    assert cli.main(["init-centres", *common, "--out", str(tmp_path / "own.pt")]) == 0
    assert cli.main(["init-centres", *common, "--first-models", str(tmp_path / "first.pt"),
                     "--out", str(tmp_path / "shared.pt")]) == 0
    own, shared = (torch.load(tmp_path / f, weights_only=True) for f in ("own.pt", "shared.pt"))
    assert torch.equal(own["centres"], shared["centres"]) and torch.equal(own["assign"], shared["assign"])
    # a file of another federation's models: one line naming it, and no centres written
    save_first_models(torch.zeros(5, 7), tmp_path / "other.pt")
    capsys.readouterr()
    assert cli.main(["init-centres", *common, "--first-models", str(tmp_path / "other.pt"),
                     "--out", str(tmp_path / "bad.pt")]) != 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'other.pt'}: first local models (5, 7) do not fit m=16" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "bad.pt").exists()


def test_a_file_that_is_not_first_models_is_named(fed, tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=r"junk\.pt: not a first-models file"):
        load_first_models(tmp_path / "junk.pt", fed)


def _authors_plan() -> Plan:
    return Plan(validate(read_configs([ROOT / "config" / "femnist-sample.yaml",
                                       ROOT / "config" / "femnist-sample" / "authors.yaml"])))


def test_the_authors_study_trains_each_seeds_first_local_models_once():
    """FeSEM(2), (3), (4), FeSEM-MA(3), Robust(3) and HypoCluster(3) under the authors' settings cluster
    the same first local models (10 epochs at lr 0.003): one first_models job per seed, which each of
    their centre files reads; FedDist (FeSEM K=1 with 1 epoch) clusters other models, alone, and
    trains them itself."""
    p = _authors_plan()
    assert sorted(s for _, _, s in p.training.shared_first) == ["0", "1", "2"]
    for (d, c, s), run in p.inits.items():
        first = p.training.first_path(run)
        inputs = p.training.init_inputs(SimpleNamespace(dataset=d, centres=c, seed=s))
        if run["train"]["local_epochs"] == 10:
            assert first == f"results-femnist-sample-authors/first_models/{d}/{first_models_key(run)}/seed{s}.pt"
            assert inputs["first"] == first
        else:
            assert first is None and "first" not in inputs and run["params"]["K"] == 1
    users = [k for k, r in p.inits.items() if p.training.first_path(r) and k[2] == "0"]
    assert len(users) == 5      # K2, K3 (FeSEM and FeSEM-MA), K4, Robust(3), HypoCluster(3)
    d, first, s = next(k for k in p.training.shared_first if k[2] == "0")
    w = SimpleNamespace(dataset=d, first=first, seed=s)
    assert json.loads(p.training.first_json(w)) == {
        "dataset": "femnist_sample", "seed": 0, "model": {"hidden": 248, "name": "femnist_cnn"},
        "train": {"batch_size": 10, "executor": "batched", "executor_chunk": None, "local_epochs": 10,
                  "local_steps": None, "lr": 0.003}}
    assert p.training.first_priority(w) == 1 + max(
        p.training.init_priority(SimpleNamespace(dataset=a, centres=c, seed=b)) for a, c, b in users)


def test_no_shared_job_where_it_would_not_pay_or_not_fit():
    """The default config's digits CNNs train their first local models in a fraction of a second
    (below FIRST_MODELS_MIN_WORK): each centre job trains them itself, as before. The real-writer
    config's 2048-unit CNNs (105 x 6.6M weights, 2.8 GB) exceed FIRST_MODELS_BYTES."""
    default = Plan(validate(read_configs([ROOT / "config" / "config.yaml"])))
    assert len(default.inits) > 2 and default.training.shared_first == {}
    assert all(default.training._work[k][1] < FIRST_MODELS_MIN_WORK for k in default.runs)
    sample = Plan(validate(read_configs([ROOT / "config" / "femnist-sample.yaml"])))
    assert len({centre_key(r) for r in sample.inits.values()}) > 1 and sample.training.shared_first == {}


def test_the_estimate_charges_shared_first_local_models_once_a_seed():
    """`mcfl check-config`'s estimate: of the six centre files of a seed that share their first local
    models, one is charged a pass of every client (not two: the models fit the shared file), the
    others nothing."""
    from mcfl.cost import estimate
    from mcfl.plan import Plan
    from mcfl.cost.workload import run_cost

    cfg = validate(read_configs([ROOT / "config" / "femnist-sample.yaml",
                                 ROOT / "config" / "femnist-sample" / "authors.yaml"]))
    est = estimate(Plan(cfg), timer=lambda model, shape, classes, batch, device: (0.01 * batch, 0.001))
    shared = {"FeSEM(2)", "FeSEM(3)", "FeSEM(4)", "FeSEM-MA(3)", "Robust(TKM)", "HypoCluster(3)"}
    for seed in (0, 1, 2):
        charged = [r for r in est.runs if r.seed == seed and r.label in shared and r.init_s]
        assert len(charged) == 1
        run = next(r for r in Plan(cfg).runs.values() if r["label"] == charged[0].label and r["seed"] == seed)
        one_pass = run_cost(run, est.sizes["femnist_sample"], 0.1, 0.001, init_passes=1).init_s
        assert charged[0].init_s == pytest.approx(one_pass)


def test_the_dag_runs_one_first_models_job_a_seed_and_feeds_it_to_the_centre_jobs(tmp_path, cli_env):
    """The rule file as Snakemake reads it (a dry run of the authors' study): one `mcfl first-models`
    a seed, and every centre job of those seeds but FedDist's passes its file to `mcfl init-centres`."""
    import shlex

    from dag_helpers import job_counts, snakemake

    r = snakemake(tmp_path, cli_env, "-n", "-p", "--configfile", str(ROOT / "config" / "femnist-sample.yaml"),
                  str(ROOT / "config" / "femnist-sample" / "authors.yaml"))
    assert r.returncode == 0, r.stderr[-3000:]
    counts = job_counts(r.stdout)
    assert (counts["first_models"], counts["init_centres"]) == (3, 18)
    cmds = [shlex.split(x.split(": ", 1)[1]) for x in r.stdout.splitlines() if x.startswith("Shell command: mcfl ")]
    made = {c[c.index("--out") + 1] for c in cmds if c[1] == "first-models"}
    assert len(made) == 3 and all("/first_models/femnist_sample/first-" in f for f in made)
    fed = [c[c.index("--first-models") + 1] for c in cmds if c[1] == "init-centres" and "--first-models" in c]
    alone = [c for c in cmds if c[1] == "init-centres" and "--first-models" not in c]
    assert len(fed) == 15 and set(fed) == made
    assert len(alone) == 3 and all(json.loads(c[c.index("--run") + 1])["K"] == 1 for c in alone)
