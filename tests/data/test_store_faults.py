"""The fault suite, data (``pytest -m faults``): bad data refused when written and when loaded, a
store changed after `mcfl prepare` (or whose metadata lies) never trained on by any command, a
store killed mid-write leaving nothing, and malformed LEAF input named by file or flag."""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import make_run, small_params
from fault_helpers import METHODS, _DieAt, _cli_train, _one_line_error
from mcfl import cli
from mcfl.data import ClientData, StoreError, load, write_store
from mcfl.data.store import content_hash
from mcfl.data.write import write_arrays
from mcfl.io import sha256_file
from mcfl.runner import train

pytestmark = pytest.mark.faults


# ============================================================================================= data
def _clients(n=3, n_train=4, n_test=2):
    rng = np.random.default_rng(0)
    return [ClientData(f"c{i}", rng.random((n_train, 2, 3), dtype=np.float32), np.arange(n_train) % 3,
                       rng.random((n_test, 2, 3), dtype=np.float32), np.arange(n_test) % 3) for i in range(n)]


def _arrays(clients):
    cat = lambda a: np.concatenate([getattr(c, a) for c in clients])   # noqa: E731
    off = lambda a: np.concatenate([[0], np.cumsum([len(getattr(c, a)) for c in clients])])   # noqa: E731
    arrays = {"x_train": cat("x_train"), "y_train": cat("y_train"), "offsets_train": off("y_train"),
              "x_test": cat("x_test"), "y_test": cat("y_test"), "offsets_test": off("y_test"),
              "cluster": np.full(len(clients), -1)}
    meta = {"format": "mcfl-store/2", "n_classes": 3, "x_shape": [2, 3], "x_scale": 1.0,
            "client_ids": [c.id for c in clients]}
    return arrays, meta


def _empty_train(cs):
    cs[1].x_train, cs[1].y_train = cs[1].x_train[:0], cs[1].y_train[:0]


def _no_tests(cs):
    for c in cs:
        c.x_test, c.y_test = c.x_test[:0], c.y_test[:0]


def _bad_label(cs):
    cs[2].y_test = np.array([0, 3])


def _bad_shape(cs):
    cs[1].x_train = np.zeros((4, 3, 2), np.float32)


def _nan(cs):
    cs[0].x_train[1, 0, 0] = np.nan


def _dup(cs):
    cs[2].id = "c0"


DATA_FAULTS = [(_empty_train, "no training samples"),
               (_bad_label, r"labels outside \[0, 2\] \(first: 3, client 'c2'\)"),
               (_bad_shape, "shape"), (_nan, "NaN or inf"), (_dup, "duplicate client ids")]


@pytest.mark.parametrize("fault, message", DATA_FAULTS)
def test_bad_data_is_rejected_by_write_store_and_write_arrays(fault, message, tmp_path):
    cs = _clients()
    fault(cs)
    with pytest.raises(StoreError, match=message):
        write_store(tmp_path / "s", cs, n_classes=3, source="unit", params={})
    if fault is not _bad_shape:          # pre-concatenated arrays (LEAF import) cannot mix shapes
        with pytest.raises(StoreError, match=message):
            write_arrays(tmp_path / "a", *_arrays(cs))
    assert list(tmp_path.iterdir()) == []                     # nothing half-written


@pytest.mark.parametrize("fault, message", DATA_FAULTS)
def test_bad_data_in_an_existing_store_is_rejected_at_load(fault, message, tmp_path):
    good = write_store(tmp_path / "s", _clients(), n_classes=3, source="unit", params={})
    cs = _clients()
    if fault is not _bad_shape:
        fault(cs)
    arrays, meta = _arrays(cs)
    if fault is _bad_shape:
        arrays["x_train"] = np.zeros((12, 3, 2), np.float32)
    stored = json.loads((good / "meta.json").read_text())
    for name, a in arrays.items():                  # a hand-made store: bad content, right hashes
        np.save(good / f"{name}.npy", a)
        stored["files"][f"{name}.npy"] = sha256_file(good / f"{name}.npy")
    stored["client_ids"] = meta["client_ids"]
    stored["content_hash"] = content_hash(stored)
    (good / "meta.json").write_text(json.dumps(stored))
    with pytest.raises(StoreError, match=message):
        load(good, verify=fault is _nan)                      # NaN scan: at write, or with verify


def test_a_store_without_any_test_sample_is_written_but_not_trained_on(tmp_path, caplog):
    cs = _clients()
    _no_tests(cs)
    with caplog.at_level(logging.WARNING, "mcfl"):
        store = write_store(tmp_path / "s", cs, n_classes=3, source="unit", params={})
    assert "no client has test samples" in caplog.text
    run = make_run(dataset="unit", model={"name": "logreg"})
    with pytest.raises(StoreError, match="no client has test samples, so nothing could be evaluated"):
        train(run, store, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_partitioner_rejects_clients_too_small_to_split():
    from mcfl.data.partition import classes_partition

    with pytest.raises(ValueError, match=r"clients got fewer than 2 samples"):
        classes_partition(np.repeat(np.arange(10), 3), 40, 1, np.random.default_rng(0), min_size=2)


@pytest.mark.parametrize("method", METHODS)
def test_one_sample_and_untested_clients_train_and_are_reported(method, tmp_path, caplog):
    """Documented skips: a client with one training sample trains on it; a client without test
    samples trains, is left out of the test metrics, and is named in a warning."""
    if method in ("FedCG", "FedFusion"):
        pytest.skip(f"{method} needs a convolutional model (image inputs); this store has 2x3 features")
    cs = _clients(n=6, n_train=5, n_test=3)
    cs[0].x_train, cs[0].y_train = cs[0].x_train[:1], cs[0].y_train[:1]
    cs[1].x_test, cs[1].y_test = cs[1].x_test[:0], cs[1].y_test[:0]
    with caplog.at_level(logging.WARNING, "mcfl"):
        store = write_store(tmp_path / "s", cs, n_classes=3, source="unit", params={})
        run = make_run(dataset="unit", method=method, params=small_params(method), rounds=2,
                       model={"name": "logreg"})
        res = train(run, store, tmp_path / "out", progress=False)
    assert caplog.text.count("1 of 6 clients have no test samples (c1)") == 2    # at write and at train
    assert 0 <= res["final"]["micro_acc"] <= 1
    assert (tmp_path / "out" / "metrics.json").exists()


# ========================================================================================== outputs
@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_store_killed_mid_write_leaves_nothing(error, tmp_path, monkeypatch):
    import mcfl.data.store as store

    real, calls = np.save, []

    def failing_save(path, arr, **kw):
        calls.append(path)
        if len(calls) == 4:
            raise error
        real(path, arr, **kw)

    monkeypatch.setattr(store.np, "save", failing_save)
    with pytest.raises(type(error)):
        write_store(tmp_path / "s", _clients(), n_classes=3, source="unit", params={})
    assert list(tmp_path.iterdir()) == []


# stores: every way a prepared store can change after `mcfl prepare` (generated per array file)
def _flip_byte(f: Path) -> None:
    b = bytearray(f.read_bytes())
    b[-1] ^= 0xFF                                # the last data byte: header and size unchanged
    f.write_bytes(bytes(b))


def _edit_meta(**kv):
    def edit(store: Path) -> None:
        meta = json.loads((store / "meta.json").read_text())
        meta.update(kv)
        (store / "meta.json").write_text(json.dumps(meta))
    return edit


STORE_FILES = ("x_train", "y_train", "offsets_train", "x_test", "y_test", "offsets_test", "cluster")
STORE_FAULTS = [
    *[(f"flip-{a}", (lambda s, a=a: _flip_byte(s / f"{a}.npy")), rf"{a}\.npy: sha256 differs from meta\.json")
      for a in STORE_FILES],
    *[(f"truncate-{a}", (lambda s, a=a: (s / f"{a}.npy").write_bytes((s / f"{a}.npy").read_bytes()[:-1])),
       rf"{a}\.npy: \d+ bytes, its header implies \d+") for a in STORE_FILES],
    *[(f"delete-{a}", (lambda s, a=a: (s / f"{a}.npy").unlink()), rf"{a}\.npy: missing from the store")
      for a in STORE_FILES],
    *[(f"meta-{k}", _edit_meta(**{k: v}), r"meta\.json: content hash does not match")
      for k, v in (("x_scale", 1.0), ("n_classes", 11), ("content_hash", "0" * 64),
                   ("client_ids", [f"x{i}" for i in range(16)]), ("x_dtype", "int8"))],
    ("meta-n_classes-text", _edit_meta(n_classes="ten"), r"meta\.json: n_classes must be an integer >= 1, found 'ten'"),
    ("meta-x_scale-text", _edit_meta(x_scale="big"), r"meta\.json: x_scale must be a finite number > 0"),
    ("meta-x_scale-nan", _edit_meta(x_scale=float("nan")), r"meta\.json: x_scale must be a finite number > 0"),
    ("meta-x_shape", _edit_meta(x_shape="8x8"), r"meta\.json: x_shape must be a list of integers"),
    ("meta-files", _edit_meta(files=[]), r"meta\.json: files must be an object of file hashes"),
    ("meta-old-format", _edit_meta(format="mcfl-store/1"), r"meta\.json: format 'mcfl-store/1'.*older mcfl"),
    ("meta-no-client_ids", lambda s: _edit_meta()(s) or _drop_meta_key(s, "client_ids"),
     r"meta\.json: missing key 'client_ids'"),
    ("meta-not-json", lambda s: (s / "meta.json").write_text("{"), r"meta\.json: not valid JSON"),
    ("meta-not-utf8", lambda s: (s / "meta.json").write_bytes(b"\xff{}"), r"meta\.json: not valid JSON"),
    ("meta-missing", lambda s: (s / "meta.json").unlink(), r"meta\.json: missing; .* is not a prepared store"),
    ("npy-garbage", lambda s: (s / "y_test.npy").write_bytes(b"garbage"), r"y_test\.npy: not a readable \.npy file"),
]


def _drop_meta_key(store: Path, key: str) -> None:
    meta = json.loads((store / "meta.json").read_text())
    del meta[key]
    (store / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("damage, message", [c[1:] for c in STORE_FAULTS], ids=[c[0] for c in STORE_FAULTS])
def test_a_changed_store_is_never_trained_on(damage, message, digits_store, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(digits_store, store)
    damage(store)
    assert _cli_train(make_run(rounds=1), store, tmp_path / "out") == 1
    _one_line_error(capsys.readouterr().err, "train", message)
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_a_checkpoint_is_not_resumed_on_a_changed_store(digits_store, tmp_path, capsys):
    store, ck = tmp_path / "store", tmp_path / "ck.pt"
    shutil.copytree(digits_store, store)
    run = make_run(rounds=3, checkpoint_every=1)
    with pytest.raises(KeyboardInterrupt):
        train(run, store, tmp_path / "out", checkpoint=ck, progress=False, tracker=_DieAt(2))
    _flip_byte(store / "x_train.npy")
    assert _cli_train(run, store, tmp_path / "out", "--checkpoint", str(ck)) == 1
    _one_line_error(capsys.readouterr().err, "train", r"x_train\.npy: sha256 differs")
    assert ck.exists() and not (tmp_path / "out" / "metrics.json").exists()


def test_the_content_hash_covers_metadata_but_not_provenance(tmp_path):
    a = write_store(tmp_path / "a", _clients(), n_classes=3, source="unit", params={"x": 1})
    b = write_store(tmp_path / "b", _clients(), n_classes=3, source="other", params={"x": 2})
    c = write_store(tmp_path / "c", _clients(), n_classes=4, source="unit", params={"x": 1})
    d = write_store(tmp_path / "d", _clients(), n_classes=3, source="unit", params={"x": 1}, x_scale=0.5)
    hashes = [load(s).content_hash for s in (a, b, c, d)]
    assert hashes[0] == hashes[1] and len(set(hashes)) == 3


# ========================================================================= reliability: round three
# Faults of the data-aware bounds, the config loader's limits, stores whose metadata lies (hashes
# recomputed), every command that opens a store, LEAF input, OSErrors and checkpoints. Each table
# row is (case id, bad input, regex of the one-line error); every case checks stderr for a traceback.

def _rehash(store: Path, arrays: dict | None = None, **meta_changes) -> None:
    """Replace arrays and edit meta.json of ``store``, then recompute every hash: a store whose
    metadata lies but whose hashes are valid (what a careless hand-made store looks like)."""
    meta = json.loads((store / "meta.json").read_text())
    for name, a in (arrays or {}).items():
        np.save(store / f"{name}.npy", a)
        meta["files"][f"{name}.npy"] = sha256_file(store / f"{name}.npy")
    meta.update(meta_changes)
    meta["content_hash"] = content_hash(meta)
    (store / "meta.json").write_text(json.dumps(meta))


def _arr(store: Path, name: str) -> np.ndarray:
    return np.load(store / f"{name}.npy")


LYING_STORES = [
    ("float-labels", lambda s: _rehash(s, {"y_train": _arr(s, "y_train").astype(np.float64)}),
     r"y_train\.npy: labels of dtype float64; expected int64"),
    ("2d-labels", lambda s: _rehash(s, {"y_test": _arr(s, "y_test").reshape(-1, 1)}),
     r"y_test\.npy: 2-D array of shape \(\d+, 1\); expected one dimension"),
    ("5d-images", lambda s: _rehash(s, {"x_train": _arr(s, "x_train")[..., None], "x_test": _arr(s, "x_test")[..., None]},
                                    x_shape=json.loads((s / "meta.json").read_text())["x_shape"] + [1]),
     r"meta\.json: x_shape \[1, 8, 8, 1\] has 4 dimensions"),
    ("big-endian", lambda s: _rehash(s, {"x_train": _arr(s, "x_train").astype(">f4")}, x_dtype="float32"),
     r"x_train\.npy: stored big-endian \(>f4\)"),
    ("x_dtype-lies", lambda s: _rehash(s, x_dtype="float32"), r"x_train\.npy: dtype uint8 but meta\.json's x_dtype says 'float32'"),
    ("n_train-lies", lambda s: _rehash(s, n_train=5), r"meta\.json: n_train is 5 but offsets_train\.npy says \d+"),
    ("n_test-lies", lambda s: _rehash(s, n_test="many"), r"meta\.json: n_test is 'many' but offsets_test\.npy says \d+"),
    ("n_clients-lies", lambda s: _rehash(s, n_clients=3), r"meta\.json: n_clients is 3 but client_ids says 16"),
    ("huge-n_classes", lambda s: _rehash(s, n_classes=10**9 + 1), r"meta\.json: n_classes 1000000001 is larger than 100000"),
    ("float-offsets", lambda s: _rehash(s, {"offsets_test": _arr(s, "offsets_test").astype(np.float32)}),
     r"offsets_test\.npy: entries of dtype float32; expected int64"),
    ("int8-clusters", lambda s: _rehash(s, {"cluster": _arr(s, "cluster").astype(np.int8)}),
     r"cluster\.npy: entries of dtype int8; expected int64"),
    ("complex-x", lambda s: _rehash(s, {f"x_{t}": _arr(s, f"x_{t}").astype(np.complex64) for t in ("train", "test")},
                                    x_dtype="complex64"), r"x_train\.npy: dtype complex64; inputs are one of uint8"),
]


@pytest.mark.parametrize("damage, message", [c[1:] for c in LYING_STORES], ids=[c[0] for c in LYING_STORES])
def test_a_store_whose_metadata_lies_is_refused_in_one_line(damage, message, digits_store, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(digits_store, store)
    damage(store)
    assert _cli_train(make_run(rounds=1), store, tmp_path / "out") == 1
    _one_line_error(capsys.readouterr().err, "train", message)
    assert not (tmp_path / "out").exists()


# every command that reads a store verifies it in full before writing anything
def _store_commands(store: Path, tmp: Path) -> dict[str, list[str]]:
    fesem = make_run(method="FeSEM", params={"K": 2, "restarts": 2})
    (tmp / "assignments.csv").write_text("client,true_cluster,cluster\n" +
                                         "".join(f"c{i},0,{i % 2}\n" for i in range(16)))
    return {
        "partition": ["partition", str(store), "--out", str(tmp / "new"), "--scheme", "iid"],
        "export-leaf": ["export-leaf", str(store), "--out", str(tmp / "new")],
        "init-centres": ["init-centres", "--run", json.dumps(fesem), "--store", str(store),
                         "--out", str(tmp / "new"), "--threads", "1", "--device", "cpu"],
        "first-models": ["first-models", "--run", json.dumps(fesem), "--store", str(store),
                         "--out", str(tmp / "new"), "--threads", "1", "--device", "cpu"],
        "train": ["train", "--run", json.dumps(make_run(rounds=1)), "--store", str(store), "--out",
                  str(tmp / "new"), "--no-tracking", "--no-progress", "--threads", "1"],
        "figure": ["figure", "cases", "--store", str(store), "--assignments", str(tmp / "assignments.csv"),
                   "--out", str(tmp / "new")],
    }


STORE_COMMANDS = ("partition", "export-leaf", "init-centres", "first-models", "train", "figure")


@pytest.mark.parametrize("command", STORE_COMMANDS)
@pytest.mark.parametrize("damage, message", [
    (lambda s: _flip_byte(s / "x_train.npy"), r"x_train\.npy: sha256 differs from meta\.json"),
    (lambda s: _flip_byte(s / "y_test.npy"), r"y_test\.npy: sha256 differs from meta\.json"),
    (lambda s: _rehash(s, n_train=3), r"meta\.json: n_train is 3 but"),
], ids=["flip-x_train", "flip-y_test", "n_train-lies"])
def test_every_command_refuses_a_changed_store_before_writing(command, damage, message, digits_store,
                                                              tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(digits_store, store)
    damage(store)
    argv = _store_commands(store, tmp_path)[command]
    assert cli.main(argv) == 1
    _one_line_error(capsys.readouterr().err, command, message)
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".new.*"))


# LEAF input: each fault names the file (and user) or the flag, and leaves no store
def _leaf_dir(root: Path, train, test) -> Path:
    for split, users in (("train", train), ("test", test)):
        (root / split).mkdir(parents=True)
        text = users if isinstance(users, str) else json.dumps(
            {"users": list(users), "num_samples": [len(v["y"]) for v in users.values()], "user_data": users})
        (root / split / "d.json").write_text(text)
    return root


_PIX = [[(i + j) % 256 / 255 for j in range(784)] for i in range(3)]
_OK_TEST = {"u1": {"x": _PIX[:1], "y": [0]}}

LEAF_FAULTS = [
    ("label-1e9", {"u1": {"x": _PIX, "y": [0, 1, 10**9]}}, _OK_TEST, [],
     r"train/d\.json: user 'u1': y has the label 1000000000; labels must be below 100000"),
    ("label-30-digits", {"u1": {"x": _PIX, "y": [0, 1, 10**30]}}, _OK_TEST, [],
     r"train/d\.json: user 'u1': y has a value too large to store"),
    ("int-5000-digits", '{"users": ["u1"], "user_data": {"u1": {"x": [[0.5]], "y": [' + "7" * 5000 + "]}}}", _OK_TEST, [],
     r"train/d\.json: not valid LEAF JSON \(Exceeds the limit \(4300 digits\)"),
    ("nested-json", '{"users": ["u1"], "user_data": {"u1": {"x": ' + "[" * 50_000 + "]" * 50_000 + ', "y": [0]}}}',
     _OK_TEST, [], r"train/d\.json: not valid LEAF JSON \(nested too deeply\)"),
    ("empty-samples", {"u1": {"x": [[], []], "y": [0, 1]}}, {"u1": {"x": [[]], "y": [0]}}, [],
     r"train/d\.json: user 'u1': x holds samples of no values"),
    ("no-test-data", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, {"u1": {"x": [], "y": []}}, [],
     r"test: no user has test samples; a store needs test data"),
    ("n-classes-huge", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, _OK_TEST, ["--n-classes", "1000000000000"],
     r"n_classes \(--n-classes\): 1000000000000 is not allowed; give a number of classes from 1 to 100000"),
    ("n-classes-small", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, _OK_TEST, ["--n-classes", "2"],
     r"labels go up to 2 but n_classes is 2"),
    ("x-shape-negative", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, _OK_TEST, ["--x-shape", "-1", "--x-shape", "-1"],
     r"x_shape \(--x-shape\): \[-1, -1\] is not allowed"),
    ("x-shape-zero", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, _OK_TEST, ["--x-shape", "0"], r"x_shape \(--x-shape\): \[0\] is not allowed"),
]


@pytest.mark.parametrize("train_users, test_users, flags, message", [c[1:] for c in LEAF_FAULTS],
                         ids=[c[0] for c in LEAF_FAULTS])
def test_leaf_faults_are_one_line_naming_the_file_or_flag(train_users, test_users, flags, message, tmp_path, capsys):
    src = _leaf_dir(tmp_path / "leaf", train_users, test_users)
    assert cli.main(["prepare", "leaf_json", "--dir", str(src), "--out", str(tmp_path / "store"), *flags]) == 1
    _one_line_error(capsys.readouterr().err, "prepare", message)
    assert not (tmp_path / "store").exists()
