"""The partition stage (mcfl.data.repartition): IID, Dirichlet, k-classes and natural re-partitions."""

import numpy as np
import pytest

from mcfl.data import ClientData, load, write_store
from mcfl.data.repartition import is_identity, label, partition_store

N_CLASSES = 10


@pytest.fixture(scope="module")
def tagged_store(tmp_path_factory):
    """20 clients, 2,000 samples; every sample's single feature is its unique id, so where each
    sample went can be traced. Label-skewed clients (each has 2 classes) with 2 true clusters."""
    rng = np.random.default_rng(0)
    ids = np.arange(2000)
    labels = rng.integers(0, N_CLASSES, size=2000)
    order = np.argsort(labels, kind="stable")                       # sorted by class: skewed clients
    clients = []
    for i, part in enumerate(np.array_split(order, 20)):
        part = rng.permutation(part)
        n_test = len(part) // 5
        x = ids[part].astype(np.float32)[:, None]
        clients.append(ClientData(f"w{i:02d}", x[n_test:], labels[part][n_test:], x[:n_test],
                                  labels[part][:n_test], cluster=i % 2))
    return write_store(tmp_path_factory.mktemp("tagged") / "s", clients, n_classes=N_CLASSES,
                       source="unit", params={"kind": "tagged"})


def samples(d, i, split):
    return np.asarray(getattr(d, f"x_{split}")[d.__dict__[f"offsets_{split}"][i]:
                                                 d.__dict__[f"offsets_{split}"][i + 1]])[:, 0].astype(int)


def histograms(d) -> np.ndarray:
    """(m, classes) label counts of each client's train + test samples."""
    return np.stack([np.bincount(np.concatenate([d.train(i)[1], d.test(i)[1]]), minlength=N_CLASSES)
                     for i in range(d.n_clients)])


def owners(d) -> np.ndarray:
    """Sample id -> the client holding it (asserts every id is held exactly once)."""
    ids = np.concatenate([np.concatenate([samples(d, i, "train"), samples(d, i, "test")])
                          for i in range(d.n_clients)])
    assert np.array_equal(np.sort(ids), np.arange(2000)), "a sample is lost or duplicated"
    who = np.empty(2000, dtype=int)
    for i in range(d.n_clients):
        who[np.concatenate([samples(d, i, "train"), samples(d, i, "test")])] = i
    return who


@pytest.mark.parametrize("kw", [dict(scheme="iid"), dict(scheme="iid", clients=7, sizes="natural"),
                                dict(scheme="dirichlet", alpha=0.3, clients=15),
                                dict(scheme="classes", classes_per_client=3), dict(scheme="natural", split="redo")])
def test_every_sample_lands_in_exactly_one_client_with_its_label(tagged_store, tmp_path, kw):
    src = load(tagged_store)
    y = np.empty(2000, dtype=int)
    y[np.asarray(src.x_train)[:, 0].astype(int)] = src.y_train
    y[np.asarray(src.x_test)[:, 0].astype(int)] = src.y_test
    d = load(partition_store(tagged_store, tmp_path / "p", **kw), verify=True)
    owners(d)
    assert np.array_equal(y[np.asarray(d.x_train)[:, 0].astype(int)], d.y_train)   # labels travel along
    assert d.n_clients == kw.get("clients", 20)
    assert d.meta["partition"]["label"] == label(kw) and d.meta["partition"]["parent"] == src.content_hash


def test_iid_histograms_are_close_to_the_global_one(tagged_store, tmp_path):
    d = load(partition_store(tagged_store, tmp_path / "iid", scheme="iid", seed=3))
    h = histograms(d)
    n = h.sum(1, keepdims=True)
    assert (n.ravel() == 100).all()                                  # LEAF iid: equal sizes
    p = h.sum(0) / h.sum()
    # hypergeometric sampling: every class share within 4 standard deviations of the global share
    assert (np.abs(h / n - p) <= 4 * np.sqrt(p * (1 - p) / n)).all()
    tv = 0.5 * np.abs(h / n - p).sum(1)
    assert tv.max() < 0.2
    src_tv = 0.5 * np.abs(histograms(load(tagged_store)) / 100 - p).sum(1)
    assert src_tv.min() > 0.6                                        # the source clients were skewed
    assert (d.cluster == -1).all() and d.true_clusters is None       # pooled: true clusters unknown


def test_dirichlet_alpha_controls_label_skew(tagged_store, tmp_path):
    def classes_and_tv(alpha):
        d = load(partition_store(tagged_store, tmp_path / f"a{alpha}", scheme="dirichlet", alpha=alpha,
                                 clients=20, min_samples=5, seed=1))
        h = histograms(d)
        p = h.sum(0) / h.sum()
        share = h / h.sum(1, keepdims=True)
        big = (share >= 0.05).sum(1)                                  # classes holding >= 5 % of a client
        return big, 0.5 * np.abs(share - p).sum(1), h.sum(1)

    few, tv_small, sizes = classes_and_tv(0.05)
    assert np.mean(few <= 3) >= 0.7 and np.median(tv_small) > 0.5    # most clients: few classes
    assert sizes.min() >= 5
    many, tv_large, _ = classes_and_tv(1000.0)
    assert (many == N_CLASSES).all() and tv_large.max() < 0.2         # large alpha: close to IID


def test_classes_scheme_gives_k_classes(tagged_store, tmp_path):
    d = load(partition_store(tagged_store, tmp_path / "c", scheme="classes", classes_per_client=2, seed=0))
    assert ((histograms(d) > 0).sum(1) == 2).all()


def test_same_seed_same_partition(tagged_store, tmp_path):
    kw = dict(scheme="dirichlet", alpha=0.5, clients=12)
    a = load(partition_store(tagged_store, tmp_path / "a", seed=7, **kw))
    b = load(partition_store(tagged_store, tmp_path / "b", seed=7, **kw))
    c = load(partition_store(tagged_store, tmp_path / "c", seed=8, **kw))
    assert a.content_hash == b.content_hash
    assert c.content_hash != a.content_hash


def test_natural_keeps_clients_and_clusters(tagged_store, tmp_path):
    src = load(tagged_store)
    same = load(partition_store(tagged_store, tmp_path / "keep"))
    assert same.content_hash == src.content_hash                     # natural + keep: an exact copy
    assert is_identity(None) and is_identity({"scheme": "natural"})
    assert not is_identity({"scheme": "natural", "split": "redo"})
    re = load(partition_store(tagged_store, tmp_path / "redo", split="redo", test_fraction=0.5, seed=2))
    assert re.client_ids == src.client_ids and np.array_equal(re.cluster, src.cluster)
    for i in range(src.n_clients):                                     # same samples, new split
        before = np.concatenate([samples(src, i, "train"), samples(src, i, "test")])
        after = np.concatenate([samples(re, i, "train"), samples(re, i, "test")])
        assert np.array_equal(np.sort(before), np.sort(after))
        assert re.n_test()[i] == len(after) - int(0.5 * len(after))   # LEAF rule at 0.5


def test_keep_split_keeps_every_samples_role(tagged_store, tmp_path):
    src = load(tagged_store)
    test_ids = set(np.asarray(src.x_test)[:, 0].astype(int))
    d = load(partition_store(tagged_store, tmp_path / "k", scheme="iid", clients=10, split="keep"))
    assert set(np.asarray(d.x_test)[:, 0].astype(int)) == test_ids


def test_bad_parameters_are_named(tagged_store, tmp_path):
    with pytest.raises(ValueError, match="scheme must be one of"):
        partition_store(tagged_store, tmp_path / "x", scheme="shards")
    with pytest.raises(ValueError, match="natural' keeps the dataset's clients"):
        partition_store(tagged_store, tmp_path / "x", clients=5)
    with pytest.raises(ValueError, match="cannot give 1000 clients 5 samples"):
        partition_store(tagged_store, tmp_path / "x", scheme="iid", clients=1000)
    assert not (tmp_path / "x").exists()


def test_cli_partition(digits_store, tmp_path, capsys):
    from mcfl.cli import main

    assert main(["partition", str(digits_store), "--out", str(tmp_path / "p"), "--scheme", "dirichlet",
                 "--alpha", "0.5", "--clients", "8", "--seed", "1"]) == 0
    d = load(tmp_path / "p")
    assert d.n_clients == 8 and d.x_shape == (1, 8, 8) and d.meta["x_scale"] == load(digits_store).x_scale
    assert "dir(0.5), 8 clients" in capsys.readouterr().out
    assert main(["partition", str(digits_store), "--out", str(tmp_path / "q"), "--scheme", "iid",
                 "--clients", "1000"]) == 1


def test_config_partition_block(tmp_path):
    from mcfl.config import ConfigError, expand_runs, validate

    def cfg(part):
        return {"datasets": {"d": {"prepare": {"source": "digits", "clients": 10}, "partition": part,
                                   "model": {"name": "digits_cnn"}}},
                "methods": [{"method": "FeSEM", "K": [6]}]}

    runs = expand_runs(validate(cfg({"scheme": "dirichlet", "alpha": 0.1, "clients": 30})))
    assert {r["partition"] for r in runs} == {"dir(0.1)"}
    with pytest.raises(ConfigError, match=r"datasets\.d\.partition\.scheme"):
        validate(cfg({"scheme": "shards"}))
    with pytest.raises(ConfigError, match=r"methods\[0\]\.K: K=6 is larger .* \(5 clients\)"):
        validate(cfg({"scheme": "iid", "clients": 5}))
    with pytest.raises(ConfigError, match=r"datasets\.d\.partition\.clients: scheme natural"):
        validate(cfg({"clients": 30}))
