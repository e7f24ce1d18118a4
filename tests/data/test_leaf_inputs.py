"""LEAF JSON inputs read in full or refused by name: a shard that is a dangling link, a FIFO, a
device or a directory stops the import (skipping it would write a store without its users), and
sample values float32 cannot hold name the file, the user and the sample, with no numpy warning."""

import gzip
import json
import os
import warnings

import pytest

from mcfl.cli import main
from mcfl.data.leaf import DataSourceError
from mcfl.data.leaf.leafjson import import_leaf

GOOD = {"users": ["u1", "u2"], "num_samples": [2, 1],
        "user_data": {"u1": {"x": [[0.0, 1.0], [0.5, 0.25]], "y": [0, 1]}, "u2": {"x": [[1, 0]], "y": [2]}}}
OTHER = {"users": ["u3"], "num_samples": [1], "user_data": {"u3": {"x": [[0.5, 0.5]], "y": [1]}}}


def _leaf_dir(tmp_path, train_doc=GOOD, test_doc=GOOD):
    for split, doc in (("train", train_doc), ("test", test_doc)):
        (tmp_path / "j" / split).mkdir(parents=True, exist_ok=True)
        (tmp_path / "j" / split / f"d_{split}.json").write_text(json.dumps(doc))
    return tmp_path / "j"


def _dangling(path):
    path.symlink_to(path.parent / "gone.json")


def _fifo(path):
    os.mkfifo(path)                              # no writer: reading it would block


def _directory(path):
    path.mkdir()


@pytest.mark.parametrize("make, what", [(_dangling, "a symbolic link to a missing file"),
                                        (_fifo, r"is a pipe \(FIFO\), not a LEAF JSON file"),
                                        (_directory, "is a directory, not a LEAF JSON file")])
def test_a_shard_that_is_not_a_regular_file_is_refused_by_name(make, what, tmp_path, capsys):
    src = _leaf_dir(tmp_path)
    make(src / "train" / "e_shard.json")
    with pytest.raises(DataSourceError, match=rf"train/e_shard\.json: {what}"):
        import_leaf(src, tmp_path / "s")
    assert not (tmp_path / "s").exists()
    assert main(["import-leaf", str(src), "--out", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "e_shard.json" in err
    assert not (tmp_path / "s").exists()


def test_a_device_named_as_a_shard_is_refused(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    src = _leaf_dir(tmp_path)
    (src / "train" / "e_shard.json").symlink_to("/dev/zero")
    with pytest.raises(DataSourceError, match=r"e_shard\.json: is a character device, not a LEAF JSON file"):
        import_leaf(src, tmp_path / "s")


def test_a_symbolic_link_to_a_shard_is_read(tmp_path):
    from mcfl.data import load

    src = _leaf_dir(tmp_path)
    (tmp_path / "elsewhere.json").write_text(json.dumps(OTHER))
    (src / "train" / "e_shard.json").symlink_to(tmp_path / "elsewhere.json")
    (src / "test" / "e_shard.json").symlink_to(tmp_path / "elsewhere.json")
    assert load(import_leaf(src, tmp_path / "s")).client_ids == ["u1", "u2", "u3"]


def test_config_validation_names_a_shard_that_is_not_a_regular_file(tmp_path):
    from mcfl.data.leaf.leafjson import check_leaf_dir

    src = _leaf_dir(tmp_path)
    _dangling(src / "test" / "e_shard.json")
    with pytest.raises(ValueError, match=r"test/e_shard\.json: a symbolic link to a missing file"):
        check_leaf_dir(dir=str(src))


def test_a_gzip_bomb_is_refused_at_the_limit(tmp_path, monkeypatch):
    from mcfl.data.leaf import leafjson

    monkeypatch.setattr(leafjson, "MAX_FILE_BYTES", 1000)
    src = _leaf_dir(tmp_path)
    (src / "train" / "d_train.json").unlink()
    (src / "train" / "d_train.json.gz").write_bytes(gzip.compress(b" " * 5000 + json.dumps(GOOD).encode()))
    with pytest.raises(DataSourceError, match=r"d_train\.json\.gz: more than 1000 bytes once decompressed"):
        import_leaf(src, tmp_path / "s")


@pytest.mark.parametrize("value, shown", [(1e308, r"1e\+308"), (-3.5e38, r"-3\.5e\+38"), (float("nan"), "nan"),
                                          (float("inf"), "inf")])
def test_a_value_float32_cannot_hold_names_file_user_and_sample(value, shown, tmp_path):
    doc = json.loads(json.dumps(GOOD))
    doc["user_data"]["u1"]["x"][1][1] = value
    src = _leaf_dir(tmp_path, doc, GOOD)
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # no overflow warning from numpy before the error
        with pytest.raises(DataSourceError, match=rf"train/d_train\.json: user 'u1': x of sample 1 holds "
                                                  rf"{shown} \(value 1\): not a finite float32"):
            import_leaf(src, tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_the_largest_float32_is_kept(tmp_path):
    from mcfl.data import load

    doc = json.loads(json.dumps(GOOD))
    doc["user_data"]["u1"]["x"][1][1] = 3.4e38
    d = load(import_leaf(_leaf_dir(tmp_path, doc, GOOD), tmp_path / "s"))
    assert d.train(0)[0][1][1] == pytest.approx(3.4e38, rel=1e-6)
