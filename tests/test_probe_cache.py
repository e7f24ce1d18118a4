"""The per-machine cache of the estimate's probe timings (mcfl.cost.probe_cache): a hit probes nothing,
a changed key probes again, a broken or foreign file is named in one line and probed over, and the
cache folder follows the environment."""

import json

import pytest

from mcfl.cost import probe_cache
from mcfl.cost.probe import MethodCost, method_key
from mcfl.cost.probe_cache import FORMAT, ProbeCache
from mcfl.cost.workload import DataSize

from conftest import make_run

MODEL = {"name": "logreg"}
SIZE = DataSize((60,), 5, n_clients=10, n_train=600, n_test=100, origin="test")


class CountingTimer:
    """A step timer that says 0.01 s a step and 0.001 s a test sample, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, model, x_shape, n_classes, batch_size, device):
        self.calls += 1
        return 0.01 * batch_size / 10, 0.001


def test_a_step_is_probed_once_then_read_back_from_the_file_by_a_new_process(tmp_path):
    timer = CountingTimer()
    first = ProbeCache(tmp_path).step(timer)
    assert first(MODEL, (60,), 5, 10, "cpu") == (0.01, 0.001)
    assert first(MODEL, (60,), 5, 20, "cpu") == (0.02, 0.001)     # another batch: another probe
    assert timer.calls == 2
    again = ProbeCache(tmp_path).step(timer)                      # as a later invocation reads it
    assert again(MODEL, (60,), 5, 10, "cpu") == (0.01, 0.001)
    assert again(MODEL, (60,), 5, 20, "cpu") == (0.02, 0.001)
    assert timer.calls == 2
    data = json.loads((tmp_path / "probe.json").read_text())
    assert data["format"] == FORMAT and len(data["entries"]) == 2


@pytest.mark.parametrize("changed", [{"capability": "AVX2"}, {"cpu": "another CPU"},
                                     {"torch": "9.9.9"}, {"code": "0123456789abcdef"}])
def test_a_changed_machine_or_code_is_a_miss_and_probes_again(tmp_path, monkeypatch, changed):
    timer = CountingTimer()
    ProbeCache(tmp_path).step(timer)(MODEL, (60,), 5, 10, "cpu")
    real = probe_cache.machine
    monkeypatch.setattr(probe_cache, "machine", lambda device: {**real(device), **changed})
    ProbeCache(tmp_path).step(timer)(MODEL, (60,), 5, 10, "cpu")
    assert timer.calls == 2
    ProbeCache(tmp_path).step(timer)(MODEL, (60,), 5, 10, "cpu")   # the new key is kept beside
    assert timer.calls == 2
    assert len(json.loads((tmp_path / "probe.json").read_text())["entries"]) == 2


def test_the_machine_key_names_cpu_capability_torch_threads_device_and_code():
    key = probe_cache.machine("cpu")
    assert {"cpu", "capability", "torch", "threads", "device", "code"} <= set(key)
    assert key["threads"] == 1 and key["device"] == "cpu" and len(key["code"]) == 16


@pytest.mark.parametrize("content", ["{not json", "\udcff", json.dumps([1, 2]),
                                     json.dumps({"format": "someone-else/1", "entries": {}}),
                                     json.dumps({"format": FORMAT, "entries": "x"})])
def test_a_broken_or_foreign_file_is_named_in_one_line_and_probed_over(tmp_path, capsys, content):
    path = tmp_path / "probe.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    timer = CountingTimer()
    cache = ProbeCache(tmp_path)
    assert cache.step(timer)(MODEL, (60,), 5, 10, "cpu") == (0.01, 0.001)
    assert cache.step(timer)(MODEL, (60,), 5, 20, "cpu") == (0.02, 0.001)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"ignoring the probe cache {path}" in err and "Traceback" not in err
    assert json.loads(path.read_text())["format"] == FORMAT       # written over, whole
    ProbeCache(tmp_path).step(timer)(MODEL, (60,), 5, 10, "cpu")
    assert timer.calls == 2


def test_an_entry_of_the_wrong_shape_is_a_miss(tmp_path):
    timer = CountingTimer()
    cache = ProbeCache(tmp_path)
    cache.step(timer)(MODEL, (60,), 5, 10, "cpu")
    data = json.loads((tmp_path / "probe.json").read_text())
    for entry in data["entries"].values():
        entry["value"] = ["fast", -1]
    (tmp_path / "probe.json").write_text(json.dumps(data))
    assert ProbeCache(tmp_path).step(timer)(MODEL, (60,), 5, 10, "cpu") == (0.01, 0.001)
    assert timer.calls == 2


def test_a_folder_that_cannot_be_written_is_named_once_and_the_timing_still_returned(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    timer = CountingTimer()
    cache = ProbeCache(blocker / "cache")                         # a folder inside a file
    step = cache.step(timer)
    assert step(MODEL, (60,), 5, 10, "cpu") == (0.01, 0.001)
    assert step(MODEL, (60,), 5, 20, "cpu") == (0.02, 0.001)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"note: ignoring the probe cache {blocker / 'cache' / 'probe.json'}: cannot")


def test_only_the_runs_without_an_entry_are_probed_for_their_method(tmp_path, monkeypatch):
    probed = []

    def fake_method_costs(runs, size, device, timer):
        probed.append([r["method"] for r in runs])
        return {method_key(r): MethodCost(2.0 if r["method"] == "FedAvg" else 3.0, 0.01, 0.02) for r in runs}

    monkeypatch.setattr(probe_cache, "method_costs", fake_method_costs)
    fedavg, fesem = make_run(method="FedAvg"), make_run(method="FeSEM", params={"K": 2})
    first = ProbeCache(tmp_path).method_costs([fedavg], SIZE, "cpu", CountingTimer())
    both = ProbeCache(tmp_path).method_costs([fedavg, fesem], SIZE, "cpu", CountingTimer())
    assert probed == [["FedAvg"], ["FeSEM"]]
    assert both == {**first, method_key(fesem): MethodCost(3.0, 0.01, 0.02)}
    other_size = DataSize((60,), 5, n_clients=20, n_train=600, n_test=100, origin="test")
    ProbeCache(tmp_path).method_costs([fedavg], other_size, "cpu", CountingTimer())
    assert probed[-1] == ["FedAvg"]                               # the dataset's sizes are in the key


def test_a_start_up_is_cached_unless_it_could_not_be_measured(tmp_path):
    seconds = iter([0.0, 2.5, 9.0])
    measure = lambda imports: next(seconds)          # noqa: E731
    assert ProbeCache(tmp_path).startup("import torch", measure) == 0.0
    assert ProbeCache(tmp_path).startup("import torch", measure) == 2.5
    assert ProbeCache(tmp_path).startup("import torch", measure) == 2.5


def test_the_folder_is_the_user_cache_unless_the_environment_names_another_or_none(tmp_path, monkeypatch):
    monkeypatch.delenv(probe_cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.delenv(probe_cache.NO_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert probe_cache.cache_dir() == tmp_path / "xdg" / "mcfl"
    monkeypatch.setenv(probe_cache.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert probe_cache.cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(probe_cache.NO_CACHE_ENV, "0")
    assert probe_cache.cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(probe_cache.NO_CACHE_ENV, "1")
    assert probe_cache.cache_dir() is None
    timer = CountingTimer()
    off = ProbeCache.of_user().step(timer)
    off(MODEL, (60,), 5, 10, "cpu")
    off(MODEL, (60,), 5, 10, "cpu")
    assert timer.calls == 2 and not (tmp_path / "mine").exists()


def test_the_test_run_points_the_cache_at_a_temporary_folder():
    folder = probe_cache.cache_dir()
    assert folder is not None and folder.name == "probe-cache" and "pytest" in str(folder)


def test_a_second_estimate_probes_nothing_and_prints_the_same(tmp_path, monkeypatch):
    """The estimate through the cache, end to end on a small config: the second probes no step, no
    method and no start-up, and says the same."""
    from mcfl import cost
    from mcfl.config import validate
    from mcfl.plan import Plan

    monkeypatch.setenv(probe_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    calls = {"step": 0, "method": 0, "startup": 0}

    def counted(name, value):
        def fn(*a, **k):
            calls[name] += 1
            return value(*a, **k) if callable(value) else value
        return fn

    monkeypatch.setattr(probe_cache, "measure_step", counted("step", (0.01, 0.001)))
    monkeypatch.setattr(probe_cache, "method_costs", counted(
        "method", lambda runs, *a: {method_key(r): MethodCost(2.0, 0.001, 0.002) for r in runs}))
    monkeypatch.setattr(cost, "measure_startup", counted("startup", 1.5))
    cfg = validate({"seeds": [0], "results": str(tmp_path / "res"), "data_dir": str(tmp_path / "data"),
                    "datasets": {"mine": {"prepare": {"source": "digits", "clients": 10, "clusters": 2},
                                          "model": {"name": "digits_cnn"}, "train": {"rounds": 3}}},
                    "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2}]})
    first = cost.estimate(Plan(cfg)).summary(cores=2)
    assert calls == {"step": 1, "method": 1, "startup": 1}
    assert cost.estimate(Plan(cfg)).summary(cores=2) == first
    assert calls == {"step": 1, "method": 1, "startup": 1}
