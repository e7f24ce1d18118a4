"""The prepared store and the embedded sources."""

import json

import numpy as np
import pytest

from mcfl.data import ClientData, StoreError, load, prepare, write_store
from mcfl.data.partition import dirichlet_partition, split_train_test


def _client(i, n=4, shape=(2,), label=0):
    x = np.full((n, *shape), i, dtype=np.float32)
    return ClientData(f"c{i}", x, np.full(n, label), x[:1], np.full(1, label), cluster=i % 2)


def test_store_round_trip_and_hash(tmp_path):
    out = write_store(tmp_path / "s", [_client(0), _client(1, n=3, label=2)], n_classes=3,
                      source="unit", params={"a": 1})
    d = load(out, verify=True)
    assert d.client_ids == ["c0", "c1"] and d.n_classes == 3
    assert d.n_train().tolist() == [4, 3] and d.n_test().tolist() == [1, 1]
    x, y = d.train(1)
    assert x.dtype == np.float32 and (x == 1).all() and (y == 2).all()
    assert d.true_clusters.tolist() == [0, 1]
    again = write_store(tmp_path / "t", [_client(0), _client(1, n=3, label=2)], n_classes=3,
                        source="unit", params={"a": 1})
    assert load(again).content_hash == d.content_hash


@pytest.mark.parametrize("bad, message", [
    (lambda c: setattr(c, "y_train", np.full(4, 7)), "labels outside"),
    (lambda c: setattr(c, "x_train", np.zeros((4, 3), np.float32)), "shape"),
    (lambda c: setattr(c, "y_train", np.zeros(3, int)), "rows but y_train has"),
    (lambda c: (setattr(c, "x_train", np.zeros((0, 2), np.float32)), setattr(c, "y_train", np.zeros(0, int))),
     "no training samples"),
])
def test_bad_clients_are_rejected_with_a_message_and_no_output(tmp_path, bad, message):
    c = _client(1)
    bad(c)
    with pytest.raises(StoreError, match=message):
        write_store(tmp_path / "s", [_client(0), c], n_classes=3, source="unit", params={})
    assert not (tmp_path / "s").exists() and not list(tmp_path.iterdir())


def test_corrupt_store_is_named(tmp_path):
    out = write_store(tmp_path / "s", [_client(0)], n_classes=3, source="unit", params={})
    np.save(out / "y_train.npy", np.zeros(2, dtype=np.int64))
    with pytest.raises(StoreError, match="y_train.npy"):
        load(out)
    with pytest.raises(StoreError, match="meta.json: missing"):
        load(tmp_path)


def test_digits_has_rotated_clusters_and_label_skew(digits_store):
    from sklearn.datasets import load_digits

    d = load(digits_store)
    assert d.n_clients == 16 and d.n_classes == 10
    assert np.bincount(d.true_clusters).tolist() == [4, 4, 4, 4]
    originals = {img.tobytes(): lab for img, lab in zip(load_digits().images.astype(np.uint8),
                                                       load_digits().target)}
    for i in range(d.n_clients):
        k = d.true_clusters[i]
        x = np.asarray(d.x_train[d.offsets_train[i]:d.offsets_train[i + 1]])[:, 0]
        unrotated = np.rot90(x, k=-k, axes=(1, 2))
        assert all(img.tobytes() in originals for img in unrotated)   # rotated by 90·k exactly
    n = d.n_train() + d.n_test()
    assert n.sum() == 1797                                           # every image used once
    assert ((d.n_test() / n) < 0.35).all()
    classes_per_client = [len(np.unique(d.train(i)[1])) for i in range(d.n_clients)]
    assert np.mean(classes_per_client) < 8                           # Dir(0.5): skewed


def test_leaf_synthetic_reproduces_leafs_sample_counts():
    from mcfl.data.synthetic import leaf_synthetic_tasks

    # LEAF's site: 1,000 users, 107,553 samples with the default seed 931231 (one cluster)
    rs = np.random.RandomState(931231)
    assert sum(min(s + 5, 1000) for s in rs.lognormal(3, 2, 1000).astype(int)) == 107553
    tasks = list(leaf_synthetic_tasks(20, 5, 60, 1, 931231))
    assert sum(len(y) for _, y, _ in tasks) == sum(
        min(s + 5, 1000) for s in np.random.RandomState(931231).lognormal(3, 2, 20).astype(int))


def test_synthetic_clusters_are_stored(synthetic_store):
    d = load(synthetic_store)
    assert set(d.true_clusters) == {0, 1} and d.x_shape == (60,)
    assert json.loads((synthetic_store / "meta.json").read_text())["params"]["clusters"] == 2


def test_dirichlet_partition_is_seeded_and_complete():
    labels = np.repeat(np.arange(5), 40)
    a = dirichlet_partition(labels, 10, 0.5, np.random.default_rng(1), min_size=3)
    b = dirichlet_partition(labels, 10, 0.5, np.random.default_rng(1), min_size=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert np.array_equal(np.sort(np.concatenate(a)), np.arange(200))
    assert min(len(p) for p in a) >= 3


def test_leaf_split_rule():
    rng = np.random.default_rng(0)
    assert [len(p) for p in split_train_test(2, 0.2, rng)] == [1, 1]
    assert [len(p) for p in split_train_test(10, 0.2, rng)] == [8, 2]
    tr, te = split_train_test(7, 0.2, rng)
    assert len(tr) == 5 and sorted(np.concatenate([tr, te]).tolist()) == list(range(7))


def test_classes_partition_gives_at_most_k_classes(tmp_path):
    from mcfl.data.partition import classes_partition

    labels = np.repeat(np.arange(10), 30)
    parts = classes_partition(labels, 20, 2, np.random.default_rng(0))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(300))
    assert max(len(np.unique(labels[p])) for p in parts) <= 2
    d = load(prepare("digits", tmp_path / "d", clients=20, partition="classes", classes_per_client=2))
    assert max(len(np.unique(np.concatenate([d.train(i)[1], d.test(i)[1]]))) for i in range(20)) <= 2
