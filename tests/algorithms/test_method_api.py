"""The public method API: a config's method may be a built-in, an alias (CFL, IFCA), a class
outside the package (``module:Class``) or a method an installed package registers in the
``mcfl.methods`` entry-point group; unknown names get a "did you mean", unusable plugins one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT

from mcfl import algorithms
from mcfl.cli import main
from mcfl.config import ConfigError, expand_runs, validate
from mcfl.config.run_arg import parse_run

EXAMPLE = ROOT / "examples" / "fedavgm"


def config(*methods: dict) -> dict:
    """A config of one small digits dataset and the given method entries."""
    return {"experiment": "test", "seeds": [0, 1],
            "datasets": {"digits": {"prepare": {"source": "digits", "clients": 8, "clusters": 2, "seed": 0},
                                    "model": {"name": "digits_cnn"}, "train": {"rounds": 3}}},
            "methods": list(methods)}


@pytest.fixture
def example_on_path(monkeypatch):
    """The worked example's module importable (as after `pip install -e examples/fedavgm`)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    algorithms._resolve.cache_clear()
    yield
    algorithms._resolve.cache_clear()


def register(tmp_path, monkeypatch, entries: str, dist: str = "mcfl-fedavgm", version: str = "0.1.0"):
    """Install a distribution's metadata registering ``entries`` (lines ``name = module:Class``) in
    the mcfl.methods group, as pip would."""
    info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[mcfl.methods]\n{entries}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    algorithms._resolve.cache_clear()


def test_aliases_make_the_same_runs_as_their_built_ins():
    for alias, built_in in algorithms.ALIASES.items():
        entry = {"K": 2} if algorithms.get(built_in).clustered and built_in != "FedCluster" else {}
        ours, theirs = (expand_runs(validate(config({"method": m, **entry}))) for m in (alias, built_in))
        assert ours == theirs and ours[0]["method"] == built_in


@pytest.mark.parametrize("name, hint", [("fesem", "did you mean FeSEM or FeSEM-MA?"),
                                        ("FedAvgg", "did you mean FedAvg"), ("ifca", "did you mean IFCA?"),
                                        ("Zzz", "known: CFL, ")])
def test_an_unknown_method_gets_a_did_you_mean(name, hint):
    with pytest.raises(ConfigError, match=r"methods\[0\]\.method: unknown method") as e:
        validate(config({"method": name}))
    assert hint in str(e.value) and "\n" not in str(e.value)


def test_a_module_class_method_is_named_by_its_class_or_the_entry(example_on_path):
    runs = expand_runs(validate(config({"method": "fedavgm:FedAvgM", "beta": 0.5},
                                       {"method": "fedavgm:FedAvgM", "name": "FedAvgM-slow", "server_lr": 0.5})))
    assert [(r["method"], r["label"], r["run_id"]) for r in runs[::2]] == [
        ("fedavgm:FedAvgM", "FedAvgM", "FedAvgM"), ("fedavgm:FedAvgM", "FedAvgM-slow", "FedAvgM-slow")]
    assert runs[0]["params"] == {"beta": 0.5, "server_lr": 1.0}
    assert algorithms.origin("fedavgm:FedAvgM") == "fedavgm:FedAvgM"
    run = parse_run(__import__("json").dumps(runs[0]))          # what a training job is handed
    assert run["method"] == "fedavgm:FedAvgM"


def test_an_entry_point_method_runs_under_its_name_and_says_where_it_is_from(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    register(tmp_path, monkeypatch, "FedAvgM = fedavgm:FedAvgM")
    import fedavgm

    assert algorithms.get("FedAvgM") is fedavgm.FedAvgM
    assert algorithms.origin("FedAvgM") == "entry point fedavgm:FedAvgM of mcfl-fedavgm 0.1.0"
    (run, _) = expand_runs(validate(config({"method": "FedAvgM"})))
    assert (run["method"], run["label"]) == ("FedAvgM", "FedAvgM")
    assert main(["methods"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "FedAvgM beta=0.9, server_lr=1.0 [entry point fedavgm:FedAvgM of mcfl-fedavgm 0.1.0] FedAvgM:" in out
    assert "CFL alias of FedCluster (the same runs)" in out
    assert "FedCluster eps1=0.4" in out and "[built-in; also named CFL (the same runs)]" in out


def test_an_entry_point_cannot_replace_a_built_in(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    register(tmp_path, monkeypatch, "FedAvg = fedavgm:FedAvgM\nBroken = fedavgm:Nope")
    assert algorithms.origin("FedAvg") == "built-in"
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert ("FedAvg       unusable: FedAvg: entry point fedavgm:FedAvgM of mcfl-fedavgm 0.1.0 has the name "
            "of a built-in method, which it cannot replace") in out
    assert ("Broken       unusable: Broken: entry point fedavgm:Nope of mcfl-fedavgm 0.1.0 cannot be "
            "loaded (AttributeError: module 'fedavgm' has no attribute 'Nope')") in out


SHADOW = '''
from mcfl.algorithms.fedavg import FedAvg


class Shadow(FedAvg):
    name = "FedAvg"


class Unnamed(FedAvg):
    pass


class Spaced(FedAvg):
    name = "Fed Avg"
'''


@pytest.mark.parametrize("entry, message", [
    ({"method": "nosuchpkg.fedfoo:FedFoo"},
     "methods[0].method: nosuchpkg.fedfoo:FedFoo: module 'nosuchpkg.fedfoo' cannot be imported "
     "(ModuleNotFoundError: No module named 'nosuchpkg')"),
    ({"method": "fedavgm:FedAvgN"}, "methods[0].method: fedavgm:FedAvgN: module 'fedavgm' has no attribute 'FedAvgN'"),
    ({"method": "fedavgm:Params"}, "methods[0].method: fedavgm:Params: <class 'fedavgm.Params'> is not a "
                                   "subclass of mcfl.algorithms.base.Algorithm"),
    ({"method": "shadow:Shadow"}, "methods[0].method: shadow:Shadow: its name 'FedAvg' is the name of a "
                                  "built-in method; name it otherwise (the class's `name`)"),
    ({"method": "shadow:Spaced"}, "methods[0].method: shadow:Spaced: its name 'Fed Avg' is not a plain name"),
    ({"method": "fedavgm:FedAvgM", "beta": 1.5}, "methods[0].beta: 1.5 is not allowed: Input should be less than 1"),
    ({"method": "fedavgm:FedAvgM", "momentum": 0.5}, "methods[0].momentum: unknown parameter of FedAvgM; "
                                                     "allowed: beta, server_lr"),
    ({"method": "fedavgm:FedAvgM", "K": 2}, "methods[0].K: FedAvgM does not take K"),
    ({"method": "os.path"}, "methods[0].method: unknown method 'os.path'"),
    ({"method": "os:path:join"}, "methods[0].method: os:path:join: not of the form module:Class"),
])
def test_a_bad_plugin_gets_one_line_naming_the_entry(entry, message, tmp_path, example_on_path, monkeypatch, capsys):
    (tmp_path / "shadow.py").write_text(SHADOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config(entry)))
    assert main(["check-config", str(path), "--no-estimate"]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_a_plugin_subclassing_a_built_in_is_named_by_its_own_class(tmp_path, monkeypatch):
    (tmp_path / "shadow.py").write_text(SHADOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    algorithms._resolve.cache_clear()
    assert algorithms.plain_name("shadow:Unnamed") == "Unnamed"


def test_the_method_origin_is_what_mlflow_records(example_on_path):
    from mcfl.track import method_origin

    assert method_origin("FedAvg") == method_origin("CFL") == "built-in"
    assert method_origin("fedavgm:FedAvgM") == "fedavgm:FedAvgM"
    assert method_origin("gone.module:Gone").startswith("unresolved: gone.module:Gone: module 'gone.module'")


def test_fedavgm_without_momentum_is_fedavg(digits_store, example_on_path):
    """FedAvgM with beta = 0 and server_lr = 1 steps to w - (w - mean) = the FedAvg average (up to
    one rounding of the subtraction)."""
    from conftest import make_run

    from mcfl.data import load
    from mcfl.federation import build_federation

    states = []
    for method, params in (("FedAvg", {}), ("fedavgm:FedAvgM", {"beta": 0.0, "server_lr": 1.0})):
        cls = algorithms.get(method)
        fed = build_federation(load(digits_store), {"name": "digits_cnn"}, make_run(clients_per_round=4)["train"], 0)
        algo = cls(fed, cls.Params(**params))
        state = algo.init()
        for r in (1, 2):
            state, _ = algo.round(state, fed.clients(r), r)
        states.append(state.w)
    assert torch.allclose(states[0], states[1], rtol=0, atol=1e-6)
    assert not np.array_equal(states[0].numpy(), algorithms.get("FedAvg")(fed, None).init().w.numpy())
