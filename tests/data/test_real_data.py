"""Real data as sources: ``leaf_json`` on LEAF's own output (plain and gzip, sharded), the embedded
``femnist_sample`` runs against the LEAF files they were packed from, CelebA on real faces, and the
workflow tracking LEAF files. Fixtures: the embedded sample and the real LEAF samples under
``$MCFL_REAL_DATA`` (tests that need one skip, saying so, where it is absent)."""

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, real_data
from mcfl.cli import main
from mcfl.config import ConfigError, validate
from mcfl.data import load, prepare
from mcfl.data.leaf import DataSourceError
from test_leaf import assert_same_as_leaf

FEMNIST_SAMPLE, needs_femnist = real_data("femnist-leaf-sample")
CELEBA_SAMPLE, needs_celeba = real_data("celeba-sample")
CELEBA_MD5 = ["list_attr_celeba.txt=529fe9c0dbe28fed46cdb09d0a41049d",
              "identity_CelebA.txt=6680ccb280aae94070f56fa3be7e1817"]
COUNTS = {"leaf-torch": (105, 14708, 1685), "flic": (110, 14697, 1695)}


def same_data(a, b) -> bool:
    """Two stores hold the same clients and samples (whatever their sources' metadata say)."""
    names = ("x_train", "y_train", "offsets_train", "x_test", "y_test", "offsets_test")
    return a.client_ids == b.client_ids and a.n_classes == b.n_classes and a.x_shape == b.x_shape \
        and a.x_scale == b.x_scale and all(np.array_equal(getattr(a, n), getattr(b, n)) for n in names)


def read_gz_split(folder):
    """An independent reader of LEAF's gzip JSON: every listed user of every file, sorted."""
    data = {}
    for f in sorted(folder.glob("*.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        data.update({u: doc["user_data"][u] for u in doc["users"]})
    return {u: data[u] for u in sorted(data)}


# ---------------------------------------------------------------------------- femnist_sample
@pytest.mark.parametrize("run", ["leaf-torch", "flic"])
def test_femnist_sample_keeps_leafs_samples(tmp_path, run):
    d = load(prepare("femnist_sample", tmp_path / "s", run=run))
    writers, n_train, n_test = COUNTS[run]
    assert (d.n_clients, d.meta["n_train"], d.meta["n_test"]) == (writers, n_train, n_test)
    assert len(d.client_ids) == writers and d.n_classes == 62 and d.x_shape == (1, 28, 28)
    assert d.meta["source"] == "femnist_sample" and d.meta["params"]["run"] == run
    assert "-s niid --sf 0.05 -k 0 -t sample" in d.meta["params"]["leaf"]
    x, _ = d.train(0)
    assert x.min() >= 0 and x.max() <= 1 and np.median(x) > 0.9       # paper ~1, ink ~0: not inverted


@needs_femnist
@pytest.mark.parametrize("run", ["leaf-torch", "flic"])
def test_femnist_sample_equals_leaf_json_of_the_shared_files(tmp_path, run):
    embedded = load(prepare("femnist_sample", tmp_path / "e", run=run))
    read = load(prepare("leaf_json", tmp_path / "j", dir=str(FEMNIST_SAMPLE / run), n_classes=62))
    assert same_data(embedded, read)
    # and against LEAF's JSON read independently: writers, per-writer counts, labels, pixels
    assert_same_as_leaf(embedded, read_gz_split(FEMNIST_SAMPLE / run / "train"),
                        read_gz_split(FEMNIST_SAMPLE / run / "test"))


# --------------------------------------------------------------------------------- leaf_json
def _shards(tmp_path, docs, gz):
    """A LEAF directory whose train/ and test/ hold ``docs`` as separate shard files."""
    for split in ("train", "test"):
        (tmp_path / split).mkdir(parents=True)
        for i, doc in enumerate(docs):
            text = json.dumps(doc).encode()
            name = f"all_data_{i}_{split}.json"
            if gz:
                (tmp_path / split / (name + ".gz")).write_bytes(gzip.compress(text))
            else:
                (tmp_path / split / name).write_bytes(text)
    return tmp_path


def _doc(users, dim=784, seed=0):
    rng = np.random.default_rng(seed)
    ud = {u: {"x": (rng.integers(0, 256, (n, dim)) / 255).tolist(), "y": rng.integers(0, 62, n).tolist()}
          for u, n in users.items()}
    return {"users": list(users), "num_samples": list(users.values()), "user_data": ud}


def test_leaf_json_reads_plain_and_gzip_shards_alike(tmp_path):
    docs = [_doc({"w2": 3, "w0": 2}, seed=1), _doc({"w1": 4}, seed=2)]
    plain = load(prepare("leaf_json", tmp_path / "p", dir=str(_shards(tmp_path / "a", docs, gz=False))))
    gz = load(prepare("leaf_json", tmp_path / "g", dir=str(_shards(tmp_path / "b", docs, gz=True))))
    assert same_data(plain, gz)
    assert plain.client_ids == ["w0", "w1", "w2"] and plain.x_shape == (1, 28, 28)
    assert plain.meta["x_dtype"] == "uint8" and plain.meta["source"] == "leaf_json"
    a, b = plain.offsets_train[1:3]                      # stored exactly: uint8 = 255 x
    assert np.array_equal(plain.x_train[a:b].reshape(4, -1),
                          np.round(255 * np.asarray(docs[1]["user_data"]["w1"]["x"])))
    assert sorted(plain.meta["params"]["files"]) == [f"{s}/all_data_{i}_{s}.json"
                                                     for s in ("test", "train") for i in (0, 1)]


def test_a_user_spanning_two_shards_is_refused_naming_both(tmp_path):
    docs = [_doc({"w0": 2}), _doc({"w0": 1})]
    with pytest.raises(DataSourceError, match=r"all_data_1_train.json.gz: user 'w0': also in .*all_data_0"):
        prepare("leaf_json", tmp_path / "s", dir=str(_shards(tmp_path / "a", docs, gz=True)))
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(num_samples=3), r"'users' and 'num_samples' must be lists of equal length"),
    (lambda d: d.update(users="w0", num_samples=[2]), r"'users' and 'num_samples' must be lists"),
    (lambda d: d.update(users=[["w0"]]), r"user id \['w0'\] is not a string"),
    (lambda d: d.update(users=[], num_samples=[]), r"'users' is empty"),
    (lambda d: d["user_data"].update(ghost={"x": [], "y": []}), r"user 'ghost' is in 'user_data' but not in 'users'"),
    (lambda d: d["user_data"]["w0"]["x"][1].__setitem__(5, True), r"user 'w0': x has a boolean value"),
    (lambda d: d["user_data"]["w0"]["y"].__setitem__(0, False), r"user 'w0': y has a boolean value"),
    (lambda d: d.update(user_data=[]), r"'user_data' must be an object"),
    (lambda d: [r.pop() for r in d["user_data"]["w0"]["x"]],
     r"hold 783 values, not one of LEAF's sizes 784 \(1x28x28\)"),
])
def test_malformed_leaf_files_are_refused_naming_the_file(tmp_path, mutate, message):
    doc = _doc({"w0": 2})
    mutate(doc)
    src = _shards(tmp_path / "a", [doc], gz=True)
    with pytest.raises(DataSourceError, match=message) as e:
        prepare("leaf_json", tmp_path / "s", dir=str(src))
    assert str(src) in str(e.value)                          # the file (or the folder) is named
    assert not (tmp_path / "s").exists()


def test_not_gzip_and_truncated_gzip_are_refused(tmp_path):
    src = _shards(tmp_path / "a", [_doc({"w0": 2})], gz=True)
    f = src / "train" / "all_data_0_train.json.gz"
    f.write_bytes(f.read_bytes()[:60])
    with pytest.raises(DataSourceError, match=r"all_data_0_train.json.gz: not a readable gzip file"):
        prepare("leaf_json", tmp_path / "s", dir=str(src))
    f.write_bytes(b"{}")
    with pytest.raises(DataSourceError, match=r"all_data_0_train.json.gz: not a readable gzip file"):
        prepare("leaf_json", tmp_path / "s", dir=str(src))


def test_x_shape_admits_pixel_data_of_another_size(tmp_path):
    src = _shards(tmp_path / "a", [_doc({"w0": 2, "w1": 1}, dim=12)], gz=False)
    d = load(prepare("leaf_json", tmp_path / "s", dir=str(src), x_shape=[1, 3, 4], n_classes=62))
    assert d.x_shape == (1, 3, 4) and d.n_classes == 62
    with pytest.raises(DataSourceError, match=r"x_shape \[2, 5\] holds 10 values but the samples have 12"):
        prepare("leaf_json", tmp_path / "t", dir=str(src), x_shape=[2, 5])


def test_cli_prepare_leaf_json_and_import_leaf_are_one_loader(tmp_path, capsys):
    src = _shards(tmp_path / "a", [_doc({"w0": 2, "w1": 3})], gz=True)
    assert main(["prepare", "leaf_json", "--dir", str(src), "--out", str(tmp_path / "p"),
                 "--n-classes", "62"]) == 0
    assert main(["import-leaf", str(src), "--out", str(tmp_path / "i"), "--n-classes", "62"]) == 0
    assert load(tmp_path / "p").content_hash == load(tmp_path / "i").content_hash
    assert load(tmp_path / "p").n_classes == 62
    with pytest.raises(SystemExit):                                   # --dir is required
        main(["prepare", "leaf_json", "--out", str(tmp_path / "q")])
    assert "--dir" in capsys.readouterr().err


def test_config_needs_a_leaf_directory_before_any_job(tmp_path):
    def cfg(prep):
        return {"experiment": "x", "seeds": [0], "methods": [{"method": "FedAvg"}],
                "datasets": {"mine": {"prepare": prep, "model": {"name": "femnist_cnn"}}}}

    with pytest.raises(ConfigError, match=r"datasets.mine.prepare.dir: required"):
        validate(cfg({"source": "leaf_json"}))
    with pytest.raises(ConfigError, match=r"datasets.mine.prepare: dir: .*nowhere/train is missing"):
        validate(cfg({"source": "leaf_json", "dir": str(tmp_path / "nowhere")}))
    src = _shards(tmp_path / "a", [_doc({"w0": 2})], gz=True)
    with pytest.raises(ConfigError, match=r"images: .*no.zip does not exist"):
        validate(cfg({"source": "leaf_json", "dir": str(src), "images": str(tmp_path / "no.zip")}))
    validate(cfg({"source": "leaf_json", "dir": str(src), "n_classes": 62}))


# ------------------------------------------------------------------------------------ CelebA
@needs_celeba
def test_celeba_prepares_from_the_real_faces(tmp_path, caplog):
    kw = {"origin": str(CELEBA_SAMPLE), "raw_dir": str(tmp_path / "raw"), "workers": 1}
    with pytest.raises(DataSourceError, match=r"list_attr_celeba.txt: MD5 529fe9c0.* does not match"):
        prepare("celeba", tmp_path / "s", **kw)           # not the official files: checked
    d = load(prepare("celeba", tmp_path / "s", md5=CELEBA_MD5, **kw))
    assert "has no checksum to verify" in caplog.text      # the extracted folder, said so
    assert (d.n_clients, d.meta["n_train"] + d.meta["n_test"]) == (104, 554)
    assert d.x_shape == (3, 84, 84) and d.meta["x_dtype"] == "uint8" and d.n_classes == 2
    share = float(np.mean(np.concatenate([d.y_train, d.y_test])))
    assert 0.3 < share < 0.7                               # Smiling: about half the faces
    x, _ = d.train(0)
    assert x.std() > 10                                    # real pixels (0-255), not a blank image


# ---------------------------------------------------------------------------------- workflow
def leaf_and_digits_config(tmp_path, run: str, shards: int, experiment: str) -> tuple[dict, Path]:
    """A config with two datasets: ``mine`` (leaf_json over a copy of ``shards`` real shards of
    the ``run`` LEAF folder) and a tiny digits one; FedAvg, one round. Returns (config, LEAF folder)."""
    leaf = tmp_path / "leaf"
    for split in ("train", "test"):
        (leaf / split).mkdir(parents=True)
        for f in sorted((FEMNIST_SAMPLE / run / split).glob("*.json.gz"))[:shards]:
            shutil.copy(f, leaf / split / f.name)
    train = {"rounds": 1, "lr": 0.05, "eval_every": 1, "clients_per_round": 3, "executor": "batched"}
    cfg = {"experiment": experiment, "seeds": [0], "tracking": False,
           "datasets": {
               "mine": {"prepare": {"source": "leaf_json", "dir": str(leaf), "n_classes": 62},
                        "model": {"name": "femnist_cnn", "hidden": 16}, "train": train},
               "digits": {"prepare": {"source": "digits", "clients": 6, "clusters": 2, "seed": 0},
                          "model": {"name": "digits_cnn"}, "train": train}},
           "methods": [{"method": "FedAvg"}]}
    return cfg, leaf


@needs_femnist
@pytest.mark.slow
def test_workflow_prepares_leaf_json_and_reruns_only_what_an_edited_file_affects(tmp_path, cli_env):
    from dag_helpers import job_counts, snakemake, write_config

    cfg, leaf = leaf_and_digits_config(tmp_path, "leaf-torch", 2, "leaf-json-wf")
    write_config(tmp_path, cfg)
    plan = job_counts(snakemake(tmp_path, cli_env, "-n").stdout)
    assert plan == {"prepare": 2, "train": 2, "report": 1, "all": 1}
    r = snakemake(tmp_path, cli_env)
    assert r.returncode == 0, r.stderr[-3000:]
    direct = load(prepare("leaf_json", tmp_path / "direct", dir=str(leaf), n_classes=62))
    assert load(tmp_path / "data" / "mine").content_hash == direct.content_hash
    assert "Nothing to be done" in snakemake(tmp_path, cli_env, "-n").stdout

    f = sorted((leaf / "train").glob("*.json.gz"))[1]          # relabel one image of one writer
    doc = json.loads(gzip.decompress(f.read_bytes()))
    user = doc["users"][0]
    doc["user_data"][user]["y"][0] = (doc["user_data"][user]["y"][0] + 1) % 62
    f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    dry = snakemake(tmp_path, cli_env, "-n")
    assert job_counts(dry.stdout) == {"prepare": 1, "train": 1, "report": 1, "all": 1}
    assert "data/mine" in dry.stdout and "data/digits" not in dry.stdout


@needs_celeba
@pytest.mark.slow
def test_celeba_sample_config_runs_end_to_end(tmp_path, cli_env):
    """config/celeba-sample.yaml on the real faces: FedAvg's 10 rounds learn to tell smiles (it is
    still at chance after 5); FeSEM(2), whose accuracy is not checked, trains 2 of them (its
    centres, training and row in the table are what it shows)."""
    import pandas as pd
    import yaml

    from dag_helpers import snakemake

    cfg = yaml.safe_load((ROOT / "config" / "celeba-sample.yaml").read_text())
    cfg["datasets"]["celeba_sample"]["prepare"]["origin"] = str(CELEBA_SAMPLE)
    fesem = next(m for m in cfg["methods"] if m["method"] == "FeSEM")
    fesem["train"] = {"rounds": 2, "eval_every": 2}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = snakemake(tmp_path, cli_env, "--configfile", str(tmp_path / "c.yaml"))
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(tmp_path / "results-celeba-sample" / "table.csv")
    assert table["method"].tolist() == ["FedAvg", "FeSEM(2)"]
    assert table.loc[0, "micro_acc_mean"] > 60           # learns the faces: 48% of them smile
    assert load(tmp_path / "data-celeba-sample" / "celeba_sample").n_clients == 104


@needs_femnist
@pytest.mark.slow
def test_dvc_repro_reruns_exactly_what_an_edited_leaf_file_affects(tmp_path, cli_env):
    """`dvc repro` in a copy of the project whose config/config.yaml has a leaf_json dataset: a
    second run starts nothing; a LEAF folder outside the project is no DVC dependency, so after
    editing one of its files `dvc repro --force` asks Snakemake (which has the LEAF files as
    inputs), and Snakemake reruns only the edited dataset's jobs."""
    import subprocess

    import yaml

    from dag_helpers import job_counts

    proj = tmp_path / "proj"
    for name in ("Snakefile", "dvc.yaml", "params.yaml", ".dvcignore", "workflow", "src/mcfl"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        (proj / name).parent.mkdir(parents=True, exist_ok=True)
        copy(ROOT / name, proj / name)
    cfg, leaf = leaf_and_digits_config(tmp_path, "flic", 1, "dvc-leaf")
    (proj / "config").mkdir()
    (proj / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))

    def dvc(*args):
        r = subprocess.run(["dvc", *args], cwd=proj, env=cli_env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=600)     # one stream, in order
        assert r.returncode == 0, r.stdout[-3000:]
        return r.stdout

    def jobs(out):
        """Snakemake's job counts per DVC stage that ran a command."""
        parts = out.split("Running stage '")[1:]
        return {p.split("'")[0]: job_counts(p) for p in parts}

    dvc("init", "--no-scm", "-q")
    first = jobs(dvc("repro"))
    assert first == {"data": {"prepare": 2, "data_all": 1},
                     "reproduce": {"train": 2, "report": 1, "all": 1}}
    assert jobs(dvc("repro")) == {}                   # nothing changed: Snakemake not even started

    def trained():
        """Each run folder's metrics.json (by its path's dataset) -> when it was written."""
        return {m.relative_to(proj).parts: m.stat().st_mtime_ns for m in proj.glob("result*/runs/*/*/*/metrics.json")}

    before = trained()
    assert {parts[2] for parts in before} == {"mine", "digits"}
    f = sorted((leaf / "test").glob("*.json.gz"))[0]
    doc = json.loads(gzip.decompress(f.read_bytes()))
    user = doc["users"][-1]
    doc["user_data"][user]["y"][-1] = (doc["user_data"][user]["y"][-1] + 1) % 62
    f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    out = dvc("repro", "--force")
    assert jobs(out) == {"data": {"prepare": 1, "data_all": 1},
                         "reproduce": {"train": 1, "report": 1, "all": 1}}
    after = trained()                                 # the edited dataset's run only
    assert {parts[2] for parts in before if after[parts] != before[parts]} == {"mine"}
