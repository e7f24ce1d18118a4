"""What FedCG added to shared pieces: per-sample domains in the store, the digits_domains source,
the engine's custom-loss hook, per-domain test accuracy, and the method entries' dataset filter."""

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from conftest import ROOT
from mcfl.data import ClientData, StoreError, load, prepare, write_store
from mcfl.data.digits_domains import rotate_images
from mcfl.metrics import domain_scores


def _client(i, n=4, dom=True):
    x = np.full((n, 2), i, dtype=np.float32)
    d = np.arange(n) % 2 if dom else None
    return ClientData(f"c{i}", x, np.zeros(n, int), x[:2], np.zeros(2, int), domain_train=d,
                      domain_test=None if d is None else d[:2] + 2)


def test_per_sample_domains_round_trip_and_stay_optional(tmp_path):
    out = write_store(tmp_path / "s", [_client(0), _client(1, n=3)], n_classes=2, source="t",
                      params={}, domains={"names": ["a", "b", "c", "d"], "unseen": [2, 3]})
    d = load(out, verify=True)
    assert d.domain_train.tolist() == [0, 1, 0, 1, 0, 1, 0] and d.domain_test.tolist() == [2, 3, 2, 3]
    assert d.unseen_domains == [2, 3]
    plain = load(write_store(tmp_path / "p", [_client(0, dom=False)], n_classes=2, source="t", params={}))
    assert plain.domain_train is None and plain.unseen_domains == [] and "domain_train.npy" not in plain.meta["files"]
    with pytest.raises(StoreError, match="has no domain_train"):
        write_store(tmp_path / "m", [_client(0), _client(1, dom=False)], n_classes=2, source="t", params={})
    bad = _client(0)
    bad.domain_train = np.zeros(3, int)
    with pytest.raises(StoreError, match="one domain id per train sample"):
        write_store(tmp_path / "b", [bad], n_classes=2, source="t", params={})
    assert not (tmp_path / "b").exists()


def test_digits_domains_mixes_domains_inside_clients_and_holds_one_out(tmp_path):
    d = load(prepare("digits_domains", tmp_path / "dd", clients=10, angles=[0, 90, 180], unseen=[45],
                     unseen_fraction=0.3, seed=1))
    assert d.x_shape == (1, 12, 12) and d.meta["domains"]["names"] == ["rot0", "rot90", "rot180", "rot45"]
    assert set(np.unique(d.domain_train)) == {0, 1, 2}            # the unseen domain: test only
    assert d.unseen_domains == [3] and 3 in set(np.unique(d.domain_test))
    share = (np.asarray(d.domain_test) == 3).mean()
    assert 0.15 < share < 0.45
    mixed = [len(np.unique(d.domain_train[a:b])) > 1
             for a, b in zip(d.offsets_train[:-1], d.offsets_train[1:])]
    assert sum(mixed) >= 8                                          # domains mixed inside clients
    counts = [np.bincount(d.domain_train[a:b], minlength=3).argmax()
              for a, b in zip(d.offsets_train[:-1], d.offsets_train[1:])]
    assert d.cluster.tolist() == counts                             # cluster = majority domain
    img = np.zeros((1, 1, 12, 12), np.uint8)
    img[0, 0, 3, 2:9] = 16                                          # a horizontal bar ...
    assert np.array_equal(rotate_images(img, 90), np.rot90(img, 1, axes=(2, 3)))   # exact at 90
    r45 = rotate_images(img, 45)
    assert r45.sum() > 0 and np.ptp(r45[0, 0].nonzero()[0]) > 2     # ... is diagonal at 45 degrees
    with pytest.raises(ValueError, match="distinct"):
        prepare("digits_domains", tmp_path / "x", angles=[0, 90], unseen=[90])


def test_digits_domains_invert_makes_a_domain_of_the_inverted_images(tmp_path):
    kw = dict(clients=4, unseen_fraction=1.0, unseen_copies=True, seed=2)
    d = load(prepare("digits_domains", tmp_path / "inv", angles=[0, 0, 90], unseen=[90], invert=[1, 3], **kw))
    assert d.meta["domains"]["names"] == ["rot0", "inv-rot0", "rot90", "inv-rot90"]
    assert d.meta["params"]["invert"] == [1, 3]
    # the same draws as a store without inversion: only the pixels of the inverted domains differ
    plain = load(prepare("digits_domains", tmp_path / "plain", angles=[0, 30, 90], unseen=[45], **kw))
    assert np.array_equal(d.domain_test, plain.domain_test) and np.array_equal(d.y_train, plain.y_train)
    x, px, dom = np.asarray(d.x_train), np.asarray(plain.x_train), d.domain_train    # raw 0-16
    assert np.array_equal(x[dom != 1], px[dom != 1])
    assert (x[dom == 1][:, 0, 0, 0] == 16).all() and (x[dom == 0][:, 0, 0, 0] == 0).all()
    for a, b in zip(d.offsets_test[:-1], d.offsets_test[1:]):     # unseen copies: inv-rot90 of each
        half = (b - a) // 2
        seen, sd, copy = np.asarray(d.x_test[a:a + half]), d.domain_test[a:a + half], d.x_test[a + half:b]
        upright = np.where((sd == 1)[:, None, None, None], 16 - seen, seen)
        upright = np.where((sd == 2)[:, None, None, None], np.rot90(upright, -1, axes=(2, 3)), upright)
        assert np.array_equal(copy, 16 - np.rot90(upright, 1, axes=(2, 3)))
    with pytest.raises(ValueError, match="distinct"):
        prepare("digits_domains", tmp_path / "x", angles=[0, 0], unseen=[])
    with pytest.raises(ValueError, match="indices into angles"):
        prepare("digits_domains", tmp_path / "y", angles=[0, 0], unseen=[], invert=[2])


def test_engine_custom_loss_replaces_the_cross_entropy(tmp_path):
    from mcfl.engine import DeviceData, FlatModel, LocalSpec, LocalTrainer, Task

    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 6)
    write_store(tmp_path / "s", [ClientData("a", x, y, x[:2], y[:2])], n_classes=3, source="t", params={})
    torch.manual_seed(0)
    fm = FlatModel(nn.Linear(2, 3))
    tr = LocalTrainer(fm, DeviceData(load(tmp_path / "s")), LocalSpec(lr=0.5, batch_size=6, steps=1), 0)
    w0 = fm.get()
    plain = tr.train(Task(0, w0), 1).weights
    seen = []

    def twice(module, xb, yb, rows):
        seen.append(rows.clone())
        return 2 * nn.functional.cross_entropy(module(xb), yb)

    doubled = tr.train(Task(0, w0, loss=twice), 1).weights
    assert torch.allclose(doubled - w0, 2 * (plain - w0), atol=1e-6)    # twice the loss: twice the step
    assert sorted(seen[0].tolist()) == list(range(6))


def test_domain_scores_by_hand():
    dom = np.array([0, 0, 1, 2, 2, 2])
    hit = np.array([1, 0, 1, 1, 1, 0])
    s = domain_scores(dom, hit, unseen=[2])
    assert s == pytest.approx({"acc_dom0": 0.5, "acc_dom1": 1.0, "acc_dom2": 2 / 3,
                               "acc_unseen": 2 / 3, "acc_seen": 2 / 3})
    assert "acc_unseen" not in domain_scores(dom, hit)


def test_method_entries_can_be_restricted_to_datasets():
    from mcfl.config import ConfigError, expand_runs, validate

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["methods"] = [{"method": "FedAvg"}, {"method": "NoFed", "datasets": ["synthetic"]}]
    runs = expand_runs(validate(cfg))
    assert {(r["dataset"], r["method"]) for r in runs if r["seed"] == 0} == \
        {(d, "FedAvg") for d in cfg["datasets"]} | {("synthetic", "NoFed")}
    cfg["methods"][1]["datasets"] = ["digitz"]
    with pytest.raises(ConfigError, match=r"methods\[1\]\.datasets: unknown dataset 'digitz'"):
        validate(cfg)


def test_celeba_oracle_domains_are_the_five_attribute_bits():
    from mcfl.data.celeba_domains import ATTRIBUTES, attribute_columns, attribute_domains

    v = np.array([[-1, -1, -1, -1, -1], [1, -1, -1, -1, -1], [-1, 1, 1, -1, 1], [1, 1, 1, 1, 1]])
    assert attribute_domains(v).tolist() == [0, 1, 2 + 4 + 16, 31]
    assert attribute_domains((v == 1).astype(int)).tolist() == [0, 1, 22, 31]
    header = ["5_o_Clock_Shadow", *reversed(ATTRIBUTES), "Smiling"]
    assert attribute_columns(header) == [5, 4, 3, 2, 1]
    with pytest.raises(ValueError, match="shape"):
        attribute_domains(v[:, :4])


@pytest.mark.parametrize("name, clusterings", [
    ("fedcg-digits", {"oracle", "kmeans", "classifier"}),
    ("fedcg-digits-invert", {"oracle", "classifier"}),
    ("paper-fedcg-celeba", {"oracle", "kmeans", "classifier"}),
    ("paper-fedcg-femnist", {"classifier"})])
def test_the_fedcg_configs_are_valid(name, clusterings):
    # validation checks every prepare key against the source's parameters (no data needed)
    from mcfl.config import expand_runs, load_config

    runs = expand_runs(load_config(ROOT / "config" / f"{name}.yaml"))
    assert {r["params"]["clustering"] for r in runs if r["method"] == "FedCG"} == clusterings


def test_digits_domains_unseen_copies_score_every_test_image_on_both_domains(tmp_path):
    kw = dict(clients=5, angles=[0, 180], unseen=[90], seed=3)
    moved = load(prepare("digits_domains", tmp_path / "moved", unseen_fraction=0.3, **kw))
    both = load(prepare("digits_domains", tmp_path / "both", unseen_fraction=1.0, unseen_copies=True, **kw))
    assert np.array_equal(both.x_train, moved.x_train) and np.array_equal(both.domain_train, moved.domain_train)
    assert both.meta["n_test"] == 2 * moved.meta["n_test"]
    assert "unseen_copies" not in moved.meta["params"] and both.meta["params"]["unseen_copies"] is True
    for a, b in zip(both.offsets_test[:-1], both.offsets_test[1:]):
        half = (b - a) // 2
        seen, copy = slice(a, a + half), slice(a + half, b)
        dom, x = both.domain_test[seen], both.x_test[seen]
        assert set(dom) <= {0, 1} and set(both.domain_test[copy]) == {2}
        assert np.array_equal(both.y_test[seen], both.y_test[copy])
        original = np.where((dom == 1)[:, None, None, None], np.rot90(x, 2, axes=(2, 3)), x)
        assert np.array_equal(both.x_test[copy], np.rot90(original, 1, axes=(2, 3)))   # the same images at 90
    none = load(prepare("digits_domains", tmp_path / "none", clients=5, angles=[0, 180], unseen=[],
                        unseen_fraction=0.0, unseen_copies=True, seed=3))
    assert none.meta["n_test"] == moved.meta["n_test"] and none.domain_test.dtype.kind == "i"
