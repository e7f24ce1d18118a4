"""Configs that compose: a file names its base (``extends:``), a paper's method table is named
once (``{set: fesem-table2}``) and one overlay takes a setting as a parameter (``vars:``)."""

import pytest
import yaml

from mcfl.cli import main
from mcfl.config import ConfigError, load_config, read_configs
from mcfl.config.compose import METHOD_SETS, compose

BASE = {"experiment": "base", "seeds": [0],
        "datasets": {"d": {"prepare": {"source": "digits", "clients": 10, "clusters": 2},
                           "model": {"name": "digits_cnn"}, "train": {"rounds": 3, "lr": 0.1}}},
        "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2}],
        "publish": {"out": "docs/x"}}


def write(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_file_that_extends_its_base_equals_the_two_files_given_in_order(tmp_path):
    base = write(tmp_path / "base.yaml", BASE)
    overlay = {"replace": ["publish"], "datasets": {"d": {"train": {"lr": 0.05}}},
               "methods": [{"method": "FedAvg"}]}
    plain = write(tmp_path / "over" / "plain.yaml", overlay)
    extending = write(tmp_path / "over" / "ext.yaml", {"extends": "../base.yaml", **overlay})
    assert read_configs([extending]) == read_configs([base, plain])
    cfg = read_configs([extending])
    # merged key by key (rounds kept from the base), lists replaced, replace: keys dropped
    assert cfg["datasets"]["d"]["train"] == {"rounds": 3, "lr": 0.05}
    assert cfg["methods"] == [{"method": "FedAvg"}] and "publish" not in cfg
    # and it validates alone, named after its own file
    assert load_config(extending)["data_dir"] == "data-ext"


def test_a_base_may_extend_another(tmp_path):
    write(tmp_path / "a.yaml", BASE)
    write(tmp_path / "b.yaml", {"extends": "a.yaml", "seeds": [0, 1]})
    c = write(tmp_path / "c.yaml", {"extends": "b.yaml", "experiment": "c"})
    cfg = read_configs([c])
    assert (cfg["seeds"], cfg["experiment"], cfg["methods"]) == ([0, 1], "c", BASE["methods"])


def test_a_missing_base_and_a_cycle_are_one_line_naming_the_file(tmp_path):
    lone = write(tmp_path / "lone.yaml", {"extends": "nowhere.yaml", "seeds": [0]})
    with pytest.raises(ConfigError, match=r"lone.yaml: extends: nowhere.yaml: no such config file"):
        read_configs([lone])
    write(tmp_path / "x.yaml", {"extends": "y.yaml"})
    y = write(tmp_path / "y.yaml", {"extends": "x.yaml"})
    with pytest.raises(ConfigError, match=r"x.yaml: extends: y.yaml makes a cycle \(y.yaml -> x.yaml -> y.yaml\)"):
        read_configs([y])
    me = write(tmp_path / "me.yaml", {"extends": "me.yaml"})
    with pytest.raises(ConfigError, match="cycle"):
        read_configs([me])


def test_a_file_that_extends_is_given_alone_or_after_its_base(tmp_path):
    base = write(tmp_path / "base.yaml", BASE)
    other = write(tmp_path / "other.yaml", BASE)
    ext = write(tmp_path / "ext.yaml", {"extends": "base.yaml", "replace": ["publish"], "seeds": [1]})
    alone = read_configs([ext])
    assert "publish" not in alone and alone["seeds"] == [1]
    assert read_configs([base, ext]) == alone           # the two-file form: a plain overlay
    with pytest.raises(ConfigError, match=r"ext.yaml: extends: base.yaml, which the config files before it do not include"):
        read_configs([other, ext])


def test_vars_are_substituted_with_their_type_and_removed():
    cfg = {"vars": {"p": "bf16", "lr": 0.05},
           "results": "results-${p}", "train": {"precision": "${p}", "lr": "${lr}"}, "l": ["a-${p}-${lr}"]}
    assert compose(cfg) == {"results": "results-bf16", "train": {"precision": "bf16", "lr": 0.05},
                            "l": ["a-bf16-0.05"]}
    with pytest.raises(ConfigError, match=r"train.lr: \$\{rate\} names no key of vars: \(given: p\)"):
        compose({"vars": {"p": "x"}, "train": {"lr": "${rate}"}})
    with pytest.raises(ConfigError, match="vars: must map names to single values"):
        compose({"vars": {"p": [1, 2]}})
    with pytest.raises(ConfigError, match="extends: base.yaml: a file's base is read with the file"):
        compose({"extends": "base.yaml"})           # a raw file handed to validate() unread


def test_a_method_set_stands_for_its_rows_with_the_rows_named_changed():
    cfg = compose({"methods": [{"set": "fesem-table2", "with": {"FeSEM": {"train": {"local_steps": 1}}}},
                               {"method": "PACFL"}]})
    rows = METHOD_SETS["fesem-table2"]
    assert len(cfg["methods"]) == len(rows) + 1 == 13 and cfg["methods"][-1] == {"method": "PACFL"}
    fesem = next(m for m in cfg["methods"] if m.get("name", m["method"]) == "FeSEM")
    assert fesem == {"method": "FeSEM", "K": [2, 3, 4], "restarts": 20, "train": {"local_steps": 1}}
    assert "train" not in next(r for r in rows if r["method"] == "FeSEM")      # the set is unchanged
    # rows are named by `name` where they have one
    assert [m.get("name", m["method"]) for m in cfg["methods"]][3:5] == ["FedDist", "FedDist+WS"]
    with pytest.raises(ConfigError, match=r"methods\[0\].set: 'table9' is not a method set; known: fesem-table2"):
        compose({"methods": [{"set": "table9"}]})
    with pytest.raises(ConfigError, match=r"methods\[0\].with: 'FedFoo' is not a row of fesem-table2"):
        compose({"methods": [{"set": "fesem-table2", "with": {"FedFoo": {"mu": 1}}}]})


def test_check_config_says_what_is_wrong_in_one_line(tmp_path, capsys):
    bad = write(tmp_path / "bad.yaml", {"extends": "gone.yaml"})
    assert main(["check-config", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "bad.yaml: extends: gone.yaml: no such config file" in err


def test_each_shipped_config_says_on_its_first_line_what_it_is_for():
    from conftest import ROOT

    for path in sorted((ROOT / "config").rglob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# ") and len(first) > 40, path
