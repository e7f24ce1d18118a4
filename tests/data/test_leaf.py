"""LEAF FEMNIST / FedCelebA: equality with LEAF's pipeline (tests/leaf_oracle.py), downloads and
their faults, archive safety, LEAF JSON import/export, and the CLI. All offline, on archives built
here in the NIST SD19 and CelebA layouts."""

import hashlib
import io
import json
import random
import zipfile

import numpy as np
import pytest
from PIL import Image

import leaf_helpers as H
import leaf_oracle as O
from mcfl.cli import main
from mcfl.data import load, prepare
from mcfl.data.leaf import DataSourceError
from mcfl.data.leaf import femnist as fem
from mcfl.data.leaf import images as leaf_images
from mcfl.data.leaf.leafjson import export_leaf, import_leaf
from mcfl.data.leaf.sampling import iid_divide, leaf_split, sample_niid

CELEBA_FILES = ["img_align_celeba.zip", "list_attr_celeba.txt", "identity_CelebA.txt"]


@pytest.fixture(scope="module")
def nist(tmp_path_factory):
    return H.make_nist(tmp_path_factory.mktemp("nist"), n_writers=23, sizes=(1, 9))


@pytest.fixture(scope="module")
def celeba_src(tmp_path_factory):
    folder = tmp_path_factory.mktemp("celeba")
    return folder, H.make_celeba(folder, n_celebs=9)


def femnist(nist, out, **kw):
    kw = {"origin": str(nist.by_class.parent), "md5": nist.md5(), "raw_dir": str(out) + ".raw",
          "workers": 1, **kw}
    return load(prepare("femnist", out, **kw))


def leaf_json(data_dir):
    return O.read_split(data_dir / "train"), O.read_split(data_dir / "test")


def assert_same_as_leaf(d, train, test):
    """Same users, per-user counts, labels and pixels (within 1/255) as LEAF's JSON."""
    assert d.client_ids == list(train) == list(test)
    for i, u in enumerate(d.client_ids):
        for (x, y), ref in ((d.train(i), train[u]), (d.test(i), test[u])):
            assert y.tolist() == [int(v) for v in ref["y"]], u
            if ref["x"] and isinstance(ref["x"][0], list):
                assert np.abs(x.reshape(len(x), -1) - np.asarray(ref["x"])).max(initial=0) <= 1 / 255 / 2


# ------------------------------------------------------------------------------- LEAF equality
@pytest.mark.parametrize("per_file, kw", [
    (100, dict(sf=1.0, k=0, tf=0.8, seed=3, split_seed=4)),              # the paper's full FEMNIST
    (2, dict(sf=0.55, k=3, tf=0.9, seed=1549786595, split_seed=1549786796)),  # 12 shards, cut users
    (5, dict(sampling="iid", sf=0.7, iu=0.5, k=2, tf=0.7, seed=7, split_seed=8)),
])
def test_femnist_compat_is_what_leafs_scripts_produce(nist, tmp_path, monkeypatch, per_file, kw):
    monkeypatch.setattr(fem, "WRITERS_PER_SHARD", per_file)
    d = femnist(nist, tmp_path / "store", leaf_compat=True, **kw)
    data = O.femnist_all_data(nist.by_class, nist.by_write, tmp_path / "leaf", per_file=per_file)
    O.leaf_preprocess(data, sf=kw["sf"], k=kw["k"], tf=kw["tf"], smplseed=kw["seed"],
                      spltseed=kw["split_seed"], iid=kw.get("sampling") == "iid", iu=kw.get("iu", 0.01))
    assert_same_as_leaf(d, *leaf_json(data))
    if kw["sf"] == 1.0:
        assert d.n_clients == 23 and d.meta["params"]["leaf_compat"] is True


def test_femnist_default_fixes_the_duplicate_first_image(nist, tmp_path):
    bug = femnist(nist, tmp_path / "bug", leaf_compat=True, tf=0.8)
    fixed = femnist(nist, tmp_path / "fixed", tf=0.8)
    first = min(nist.writers, key=lambda w: nist.writers[w][0][0].split("/")[1:3])   # in path order
    n = {w: len(v) for w, v in nist.writers.items()}
    # LEAF's bug gives every writer but the first one extra copy of its first image; users with
    # fewer than 2 images are dropped by the split, so one-image writers survive only with the bug
    want_bug = {w: n[w] + (w != first) for w in sorted(n) if n[w] + (w != first) >= 2}
    want_fixed = {w: n[w] for w in sorted(n) if n[w] >= 2}
    assert len(want_fixed) < len(want_bug)                       # the archive has one-image writers
    for d, want in ((bug, want_bug), (fixed, want_fixed)):
        assert dict(zip(d.client_ids, (d.n_train() + d.n_test()).tolist())) == want
    i = bug.client_ids.index(sorted(want_fixed)[1])               # the copy is the first image, twice
    j = fixed.client_ids.index(sorted(want_fixed)[1])
    x_bug = np.concatenate([bug.train(i)[0], bug.test(i)[0]])
    x_fixed = np.concatenate([fixed.train(j)[0], fixed.test(j)[0]])
    rows = {r.tobytes() for r in x_fixed}
    assert {r.tobytes() for r in x_bug} == rows and len(x_bug) == len(x_fixed) + 1


def test_femnist_labels_pixels_and_class_mapping(nist, tmp_path):
    assert [fem.class_label(c) for c in ("30", "39", "41", "5a", "61", "7a")] == [0, 9, 10, 35, 36, 61]
    with pytest.raises(DataSourceError, match="not the hex code"):
        fem.class_label("7b")
    d = femnist(nist, tmp_path / "s", sampling="none", tf=1.0)      # all in train, path order
    for i, u in enumerate(d.client_ids):
        truth = sorted(nist.writers[u])                       # (member, hex) in path order
        x, y = d.train(i)
        if len(truth) != 2:                                   # (LEAF: 1 train + 1 test when n = 2)
            assert y.tolist() == [fem.class_label(h) for _, h in truth]   # incl. the '30'/'4f' twin
        assert x.shape[1:] == (1, 28, 28) and 0 <= x.min() and x.max() <= 1
        assert x.mean() > 0.6                     # no inversion: white background ~1, ink ~0
    with zipfile.ZipFile(nist.by_write) as z:   # one image by hand: LEAF's thumbnail / 255
        member = sorted(nist.writers[d.client_ids[0]])[0][0]
        img = Image.open(io.BytesIO(z.read(member))).convert("L")
        img.thumbnail((28, 28), Image.LANCZOS)
        assert np.allclose(d.train(0)[0][0, 0], np.asarray(img) / 255, atol=1e-7)


def test_femnist_is_deterministic_and_parallel_equals_serial(nist, tmp_path, monkeypatch):
    a = femnist(nist, tmp_path / "a", tf=0.8, seed=1, split_seed=2)
    b = femnist(nist, tmp_path / "b", tf=0.8, seed=1, split_seed=2)
    c = femnist(nist, tmp_path / "c", tf=0.8, seed=1, split_seed=3)
    monkeypatch.setattr(leaf_images, "CHUNK", 16)               # several chunks through the pool
    p = femnist(nist, tmp_path / "p", tf=0.8, seed=1, split_seed=2, workers=2)
    assert a.content_hash == b.content_hash == p.content_hash != c.content_hash


# -------------------------------------------------------------------------------- LEAF sampling
def test_leaf_sampling_rules_by_hand():
    assert [len(g) for g in iid_divide(list(range(11)), 3)] == [3, 4, 4]     # short groups first
    shards = {"all_data_0.json": [("a", list(range(5))), ("b", list(range(10, 13)))]}
    out = sample_niid(shards, 0.5, random.Random(0))        # int(0.5 * 8) = 4 samples
    (name, users), = out.items()
    assert name == "all_data_0_niid_5.json" and sum(len(s) for _, s in users) == 4
    rows = leaf_split({"x.json": [("u", list(range(10))), ("v", [1, 2]), ("w", [7])]}, sampling="none",
                      sf=1.0, iu=0.01, k=0, tf=0.8, seed=0, split_seed=0)
    assert [(u, len(tr), len(te)) for u, tr, te in rows] == [("u", 8, 2), ("v", 1, 1)]   # w dropped
    assert all(tr == sorted(tr) and te == sorted(te) for _, tr, te in rows)     # order kept


def test_split_by_user_is_refused_with_a_reason(nist, tmp_path):
    with pytest.raises(ValueError, match="split='user'.*not supported"):
        femnist(nist, tmp_path / "s", split="user")
    assert not (tmp_path / "s").exists()


# ----------------------------------------------------------------------------------- CelebA
def celeba(src, out, **kw):
    if "md5" not in kw:
        kw["md5"] = H.md5_args(src, CELEBA_FILES)
    kw = {"origin": str(src), "raw_dir": str(out) + ".raw", "workers": 1, **kw}
    return load(prepare("celeba", out, **kw))


def test_celeba_is_what_leafs_scripts_and_loader_produce(celeba_src, tmp_path):
    src, truth = celeba_src
    d = celeba(src, tmp_path / "s", tf=0.8, seed=5, split_seed=6)
    data = O.celeba_all_data(src, tmp_path / "leaf")
    train, test = leaf_json(O.leaf_preprocess(data, sf=1.0, k=5, tf=0.8, smplseed=5, spltseed=6))
    assert_same_as_leaf(d, train, test)
    with zipfile.ZipFile(src / "img_align_celeba.zip") as z:
        z.extractall(tmp_path / "img")
    for i, u in enumerate(d.client_ids):
        want = np.stack([O.celeba_pixels(tmp_path / "img" / "img_align_celeba", n) for n in train[u]["x"]])
        assert np.array_equal(np.asarray(d.x_train[d.offsets_train[i]:d.offsets_train[i + 1]]),
                              want.transpose(0, 3, 1, 2))          # LEAF's loader, Pillow's default filter
    counts = {c: sum(v[0] == c for v in truth.values()) for c, _ in truth.values()}
    assert sorted(d.client_ids) == sorted(c for c, n in counts.items() if n >= 5)
    assert d.x_shape == (3, 84, 84) and d.meta["x_dtype"] == "uint8" and d.x_scale == 1.0


def test_celeba_from_a_folder_and_another_attribute(celeba_src, tmp_path):
    src, _ = celeba_src
    folder = tmp_path / "src"
    H.make_celeba(folder, n_celebs=9, as_dir=True)          # the same images, extracted
    d = celeba(folder, tmp_path / "s", md5=H.md5_args(folder, CELEBA_FILES[1:]), tf=0.8, normalize=True)
    z = celeba(src, tmp_path / "z", tf=0.8, normalize=True)
    assert d.content_hash == z.content_hash and d.x_scale == pytest.approx(1 / 255)
    male = celeba(src, tmp_path / "m", attribute="Male", sampling="none", tf=1.0)
    lines = (src / "list_attr_celeba.txt").read_text().splitlines()
    col = lines[1].split().index("Male") + 1
    truth = {p[0]: (int(p[col]) + 1) // 2 for p in (ln.split() for ln in lines[2:])}
    owners = {}
    for line in (src / "identity_CelebA.txt").read_text().splitlines():
        img, c = line.split()
        owners.setdefault(c, []).append(img)
    # FedCG's oracle domain per image: bit b = the b-th of Attractive, Heavy_Makeup,
    # High_Cheekbones, Mouth_Slightly_Open, Wavy_Hair (columns 3, 19, 20, 22, 34 of the file)
    names = lines[1].split()
    cols = [names.index(a) + 1 for a in ("Attractive", "Heavy_Makeup", "High_Cheekbones",
                                         "Mouth_Slightly_Open", "Wavy_Hair")]
    domain = {p[0]: sum(2 ** b for b, c in enumerate(cols) if p[c] == "1")
              for p in (ln.split() for ln in lines[2:])}
    dom = np.asarray(male.domain_train)
    for i, c in enumerate(male.client_ids):
        assert male.train(i)[1].tolist() == [truth[img] for img in owners[c]]
        rows = slice(male.offsets_train[i], male.offsets_train[i + 1])
        assert dom[rows].tolist() == [domain[img] for img in owners[c]]
    assert len(set(dom.tolist())) > 4
    assert male.meta["domains"]["names"][2 + 4] == "Heavy_Makeup+High_Cheekbones"
    with pytest.raises(DataSourceError, match="no attribute 'Smilling'"):
        celeba(src, tmp_path / "bad", attribute="Smilling")


def test_celeba_missing_file_says_which_and_where(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(DataSourceError, match=r"img_align_celeba.zip: not found.*mmlab.ie.cuhk.edu.hk"):
        prepare("celeba", tmp_path / "s", origin=str(tmp_path / "src"), raw_dir=str(tmp_path / "raw"))
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------- downloads and faults
def test_whole_pipeline_from_a_localhost_server_with_a_truncated_transfer(nist, tmp_path):
    local = femnist(nist, tmp_path / "local", tf=0.8)
    with H.RangeServer(nist.by_class.parent) as srv:
        srv.truncate["by_write.zip"] = 1000                  # first response stops after 1,000 bytes
        d = femnist(nist, tmp_path / "http", origin=srv.url, raw_dir=str(tmp_path / "raw"), tf=0.8)
        assert ("/sd19/by_write.zip", "bytes=1000-") in srv.requests     # resumed with Range
        assert d.content_hash == local.content_hash
        assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["by_class.zip", "by_write.zip"]
        n = len(srv.requests)
        femnist(nist, tmp_path / "again", origin=srv.url, raw_dir=str(tmp_path / "raw"), tf=0.8)
        assert len(srv.requests) == n                        # verified files are not fetched again


def test_an_interrupted_download_resumes_from_its_part_file(nist, tmp_path):
    from mcfl.data.leaf.fetch import download

    data = nist.by_class.read_bytes()
    (tmp_path / "by_class.zip.part").write_bytes(data[:len(data) // 3])
    with H.RangeServer(nist.by_class.parent) as srv:
        download(f"{srv.url}/by_class.zip", tmp_path / "by_class.zip", hashlib.md5(data).hexdigest())
        assert srv.requests == [("/sd19/by_class.zip", f"bytes={len(data) // 3}-")]
    assert (tmp_path / "by_class.zip").read_bytes() == data
    assert not (tmp_path / "by_class.zip.part").exists()


def test_wrong_md5_is_an_error_and_leaves_no_file(nist, tmp_path):
    bad = [f"by_class.zip={'0' * 32}", nist.md5()[1]]
    with H.RangeServer(nist.by_class.parent) as srv:
        with pytest.raises(DataSourceError, match=r"by_class.zip: MD5 [0-9a-f]{32} does not match.*deleted"):
            femnist(nist, tmp_path / "s", origin=srv.url, md5=bad, raw_dir=str(tmp_path / "raw"))
    assert not list((tmp_path / "raw").iterdir()) and not (tmp_path / "s").exists()
    with pytest.raises(DataSourceError, match="MD5 .* does not match"):       # a local source file:
        femnist(nist, tmp_path / "s", md5=bad)                                 # reported, kept
    assert nist.by_class.exists()
    with pytest.raises(DataSourceError, match="not a 32-digit"):
        femnist(nist, tmp_path / "s", md5=["by_class.zip=xyz"])


@pytest.mark.parametrize("status", [404, 500])
def test_http_errors_are_clear(nist, tmp_path, status):
    with H.RangeServer(nist.by_class.parent) as srv:
        srv.status["by_class.zip"] = status
        with pytest.raises(DataSourceError, match=rf"{srv.url}/by_class.zip: HTTP {status}"):
            femnist(nist, tmp_path / "s", origin=srv.url, raw_dir=str(tmp_path / "raw"))
    assert not (tmp_path / "raw").exists() or not list((tmp_path / "raw").iterdir())


@pytest.mark.parametrize("member", ["../evil.png", "/etc/evil.png", "by_write/../../evil.png", "C:/evil.png"])
def test_archive_members_escaping_the_target_are_rejected(nist, tmp_path, member):
    src = tmp_path / "src"
    src.mkdir()
    (src / "by_class.zip").write_bytes(nist.by_class.read_bytes())
    with zipfile.ZipFile(src / "by_write.zip", "w") as z, zipfile.ZipFile(nist.by_write) as orig:
        for name in orig.namelist():
            z.writestr(name, orig.read(name))
        z.writestr(zipfile.ZipInfo(member), b"x")
    md5 = H.md5_args(src, ["by_class.zip", "by_write.zip"])
    with pytest.raises(DataSourceError, match="would escape the target directory"):
        prepare("femnist", tmp_path / "s", origin=str(src), md5=md5, raw_dir=str(tmp_path / "raw"))
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------ LEAF JSON in/out
def test_export_import_round_trip_and_import_of_leaf_made_json(nist, tmp_path):
    d = femnist(nist, tmp_path / "s", leaf_compat=True, tf=0.8, seed=3, split_seed=4)
    export_leaf(d.path, tmp_path / "json")
    doc = json.loads((tmp_path / "json" / "train" / "all_data_0_train.json").read_text())
    assert set(doc) == {"users", "num_samples", "user_data"} and len(doc["users"]) == d.n_clients
    assert (tmp_path / "json" / "all_data" / "all_data_0.json").exists()
    back = load(import_leaf(tmp_path / "json", tmp_path / "back", n_classes=62))
    for name in ("x_train", "y_train", "offsets_train", "x_test", "y_test", "offsets_test"):
        assert np.array_equal(getattr(back, name), getattr(d, name)), name      # exact for uint8/255
    assert back.client_ids == d.client_ids and back.x_shape == (1, 28, 28)
    # JSON made by (our re-statement of) LEAF's scripts imports to the same arrays
    data = O.femnist_all_data(nist.by_class, nist.by_write, tmp_path / "leaf")
    O.leaf_preprocess(data, sf=1.0, k=0, tf=0.8, smplseed=3, spltseed=4)
    leaf = load(import_leaf(data, tmp_path / "from_leaf", n_classes=62))
    assert leaf.content_hash == back.content_hash


def test_import_of_celeba_json_decodes_the_named_images(celeba_src, tmp_path):
    src, _ = celeba_src
    d = celeba(src, tmp_path / "s", tf=0.8, seed=5, split_seed=6)
    data = O.leaf_preprocess(O.celeba_all_data(src, tmp_path / "leaf"), sf=1.0, k=5, tf=0.8,
                             smplseed=5, spltseed=6)
    with pytest.raises(DataSourceError, match="pass --images"):
        import_leaf(data, tmp_path / "no")
    got = load(import_leaf(data, tmp_path / "imp", images=str(src / "img_align_celeba.zip"), workers=1))
    for name in ("x_train", "y_train", "offsets_train", "x_test", "y_test", "offsets_test"):
        assert np.array_equal(getattr(got, name), getattr(d, name)), name
    # LEAF's JSON carries no attributes, so an imported store has no FedCG oracle domains
    assert got.domain_train is None and d.domain_train is not None


def _leaf_dir(tmp_path, train_doc, test_doc=None):
    for split, doc in (("train", train_doc), ("test", test_doc or train_doc)):
        (tmp_path / "j" / split).mkdir(parents=True, exist_ok=True)
        text = doc if isinstance(doc, str) else json.dumps(doc)
        (tmp_path / "j" / split / f"d_{split}.json").write_text(text)
    return tmp_path / "j"


GOOD = {"users": ["u1", "u2"], "num_samples": [2, 1],
        "user_data": {"u1": {"x": [[0.0, 1.0], [0.5, 0.25]], "y": [0, 1]}, "u2": {"x": [[1, 0]], "y": [2]}}}


@pytest.mark.parametrize("mutate, message", [
    (lambda d: "{not json", r"d_train.json: not valid JSON"),
    (lambda d: {k: v for k, v in d.items() if k != "user_data"}, r"d_train.json: missing key 'user_data'"),
    (lambda d: d["user_data"]["u2"].pop("y"), r"d_train.json: user 'u2': missing key 'y'"),
    (lambda d: d["user_data"]["u1"]["y"].append(1), r"d_train.json: user 'u1': x has 2 samples but y has 3"),
    (lambda d: d["user_data"]["u1"]["x"][1].__setitem__(0, "0.5"),
     r"d_train.json: user 'u1': x has a non-numeric value '0.5'"),
    (lambda d: d["user_data"]["u2"]["x"].__setitem__(0, [1, None]),
     r"d_train.json: user 'u2': x has a non-numeric value None"),
    (lambda d: d["user_data"]["u1"]["x"][0].append(1.0), r"user 'u1': x is ragged"),
    (lambda d: d["user_data"]["u2"]["y"].__setitem__(0, 1.5), r"user 'u2': y must be non-negative integers"),
    (lambda d: d["users"].append("u3") or d["num_samples"].append(0), r"user 'u3': missing from 'user_data'"),
])
def test_malformed_leaf_json_is_rejected_naming_file_and_user(tmp_path, mutate, message):
    doc = json.loads(json.dumps(GOOD))
    res = mutate(doc)
    bad = res if isinstance(res, (str, dict)) else doc
    with pytest.raises(DataSourceError, match=message):
        import_leaf(_leaf_dir(tmp_path, bad, GOOD), tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_import_reads_plain_vectors_and_rejects_test_only_users(tmp_path):
    d = load(import_leaf(_leaf_dir(tmp_path, GOOD), tmp_path / "s"))
    assert d.x_shape == (2,) and d.meta["x_dtype"] == "float32" and d.n_classes == 3
    assert np.allclose(d.train(0)[0], [[0, 1], [0.5, 0.25]]) and d.client_ids == ["u1", "u2"]
    only = {"users": ["zz"], "num_samples": [1], "user_data": {"zz": {"x": [[1, 1]], "y": [0]}}}
    with pytest.raises(DataSourceError, match="d_test.json: user 'zz' has test data but no training"):
        import_leaf(_leaf_dir(tmp_path / "t", GOOD, only), tmp_path / "t" / "s")


# ------------------------------------------------------------------------------------------- CLI
def test_cli_prepare_with_leafs_flags_download_and_json(nist, tmp_path, capsys):
    md5 = [a for m in nist.md5() for a in ("--md5", m)]
    src = str(nist.by_class.parent)
    assert main(["prepare", "femnist", "--out", str(tmp_path / "s"), "--source", src, *md5,
                 "-s", "niid", "--sf", "1.0", "-k", "0", "-t", "sample", "--tf", "0.8", "--seed", "3",
                 "--spltseed", "4", "--leaf-compat", "--raw-dir", str(tmp_path / "raw"),
                 "--workers", "1"]) == 0
    d = load(tmp_path / "s")
    assert d.meta["params"] | {"md5": None, "pillow": None} == {
        "sampling": "niid", "sf": 1.0, "k": 0, "split": "sample", "tf": 0.8, "seed": 3,
        "split_seed": 4, "leaf_compat": True, "md5": None, "pillow": None}
    assert main(["prepare", "femnist", "--out", str(tmp_path / "u"), "--source", src, *md5,
                 "-t", "user"]) == 1
    assert "split='user'" in capsys.readouterr().err
    assert main(["download", "femnist", "--source", src, "--out", str(tmp_path / "raw2"), *md5,
                 "--file", "by_write.zip"]) == 0
    assert [p.name for p in (tmp_path / "raw2").iterdir()] == ["by_write.zip"]
    assert main(["export-leaf", str(tmp_path / "s"), "--out", str(tmp_path / "j")]) == 0
    assert main(["import-leaf", str(tmp_path / "j"), "--out", str(tmp_path / "b"), "--n-classes", "62"]) == 0
    assert load(tmp_path / "b").content_hash == d.content_hash
    assert main(["download", "femnist", "--source", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r3")]) == 1
    assert "neither an existing directory nor an http(s) URL" in capsys.readouterr().err
