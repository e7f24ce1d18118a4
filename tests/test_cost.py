"""The cost estimate (`mcfl.cost`): a bounded probe whatever the batch size, the jobs Snakemake will
run, and their packing on the cores in the order they wait for each other."""

import pytest
import yaml

from mcfl.config import validate


def _recording_build(monkeypatch):
    """Record the batch shapes every model built by `mcfl.models.build` is called on."""
    from mcfl import models

    shapes, build = [], models.build

    def recording(*args, **kwargs):
        net = build(*args, **kwargs)
        net.register_forward_pre_hook(lambda module, inputs: shapes.append(tuple(inputs[0].shape)))
        return net

    monkeypatch.setattr(models, "build", recording)
    return shapes


def test_a_huge_batch_is_timed_on_a_bounded_probe_and_scaled_linearly(monkeypatch):
    from mcfl.probe import PROBE_ROWS, measure_step, probe_rows

    shapes = _recording_build(monkeypatch)
    step_s, sample_s = measure_step({"name": "logreg"}, (60,), 5, 10**9, "cpu", repeats=1)
    assert shapes and max(s[0] for s in shapes) <= PROBE_ROWS
    assert probe_rows(10**9, (60,)) == PROBE_ROWS
    assert probe_rows(10**9, (3, 84, 84)) == 2_000_000 // (3 * 84 * 84) < PROBE_ROWS  # input values bound
    assert probe_rows(10, (1, 28, 28)) == 10                                          # small: as asked
    # the probe's step time, scaled to 10^9 rows: far more than the probe's own step
    probe_s, _ = measure_step({"name": "logreg"}, (60,), 5, PROBE_ROWS, "cpu", repeats=1)
    assert step_s > 1000 * probe_s and sample_s > 0


def _own(tmp_path, **train):
    return {"seeds": [0], "results": str(tmp_path / "res"), "data_dir": str(tmp_path / "data"),
            "datasets": {"mine": {"prepare": {"source": "digits", "clients": 10, "clusters": 2},
                                  "model": {"name": "digits_cnn"},
                                  "train": {"rounds": 3, "local_epochs": 1, **train}}},
            "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2}]}


@pytest.mark.slow
def test_check_config_with_a_batch_of_a_billion_prints_an_estimate_and_one_note(tmp_path, monkeypatch, capsys):
    """`batch_size: 1000000000` is a valid integer; the estimate times a step on at most a client's
    samples (the batch a step really has), says in one line that `mcfl train` will refuse it, and
    allocates nothing large (its method probes included: they once padded a batch plan to 10^9
    rows, 8 GB)."""
    from mcfl import cost
    from mcfl.cli import main

    shapes = _recording_build(monkeypatch)
    monkeypatch.setattr(cost, "measure_startup", lambda *a: 1.0)
    monkeypatch.setenv("MCFL_NO_CACHE", "1")          # probed here, not read from the tests' shared cache
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(_own(tmp_path, batch_size=1_000_000_000)))
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert "estimated cost on this machine" in out.out and "every run, as from an empty results folder" in out.out
    notes = [line for line in out.out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "train.batch_size 1000000000" in notes[0] and "refuse" in notes[0]
    # digits: 1,438 training samples over 10 clients: a step holds at most the mean client's 144
    assert shapes and max(s[0] for s in shapes) <= 144


def test_a_batch_that_does_not_fit_in_memory_is_named(tmp_path, monkeypatch):
    from mcfl import bounds
    from mcfl.cost import estimate
    from mcfl.workload import DataSize

    monkeypatch.setattr(bounds, "available_memory", lambda device="cpu": 1 << 20)      # 1 MB free
    size = DataSize((1, 8, 8), 10, n_clients=10, n_train=10**7, n_test=50, origin="test")
    est = estimate(validate(_own(tmp_path, batch_size=10**6)), sizes={"mine": size},
                   timer=lambda *a: (0.01, 0.001))
    assert any("needs at least" in n and "lower train.batch_size" in n for n in est.notes)
    assert est.notes[-1] in est.summary()


def test_jobs_are_packed_on_the_cores_after_the_jobs_they_wait_for():
    """By hand: a 10 s centre file that a 10 s run waits for, and four 2 s runs, on 2 cores. Total
    work 28 s (14 s a core), but the long chain starts first and ends at 20 s."""
    from mcfl.cost import Job, makespan

    jobs = [Job("centres", 10.0), Job("long", 10.0, ("centres",))] + [Job(f"r{i}", 2.0) for i in range(4)]
    assert makespan(jobs, 2) == pytest.approx(20.0)
    assert makespan(jobs, 1) == pytest.approx(28.0)
    assert makespan(jobs, 8) == pytest.approx(20.0)
    # a job waiting for one that is done already (not among the jobs) starts at once
    assert makespan([Job("run", 3.0, ("done before",))], 2) == pytest.approx(3.0)


def _timer(model, shape, classes, batch, device):
    return batch * 0.001, 0.001


def test_the_dag_s_jobs_are_what_is_costed(tmp_path):
    """With Snakemake's jobs (`dag`), only its training runs are costed, a centre file only when
    its job is among them, and its other jobs cost a start-up each, in the DAG's order."""
    from mcfl.cost import estimate
    from mcfl.plan import Plan
    from mcfl.workload import DataSize

    cfg = validate(_own(tmp_path, batch_size=10))
    size = {"mine": DataSize((1, 8, 8), 10, n_clients=10, n_train=200, n_test=50, origin="test")}
    plan = Plan(cfg)
    fesem = next(r for r in plan.runs.values() if r["method"] == "FeSEM")
    centres = plan.training.init_path(fesem).split("/")
    wc = {"dataset": "mine", "seed": "0"}
    init = ("init_centres", {**wc, "centres": centres[-2]}, (0,))
    dag = [("prepare", {"dataset": "mine"}, ()), init,
           ("train", {**wc, "run": fesem["run_id"]}, (0, 1)), ("report", {}, (2,))]
    every = estimate(cfg, timer=_timer, sizes=size)
    assert [r.label for r in every.runs] == ["FedAvg", "FeSEM(2)"] and every.runs[1].init_s > 0
    est = estimate(cfg, timer=_timer, sizes=size, dag=dag, start_s=1.0)
    assert [r.label for r in est.runs] == ["FeSEM(2)"] and est.runs[0].init_s == every.runs[1].init_s
    assert est.scope == "the jobs Snakemake will run" and len(est.jobs) == 4
    # one core: every job one after the other, a start-up each
    assert est.wall_s(1) == pytest.approx(est.total_s + 4 * 1.0)
    # the centre file up to date: its job is not in the DAG, and the run is charged no initialisation
    est = estimate(cfg, timer=_timer, sizes=size, dag=[dag[0], ("train", dag[2][1], (0,))], start_s=0.0)
    assert est.runs[0].init_s == 0 and est.wall_s(2) == pytest.approx(est.total_s)
    # nothing to run
    assert estimate(cfg, timer=_timer, sizes=size, dag=[]).summary() == "estimated cost: no training runs to do"


def test_the_method_probe_trains_batches_of_at_most_a_client_s_samples(tmp_path):
    from mcfl.probe import _probe_store, _probe_train
    from mcfl.workload import DataSize

    size = DataSize((1, 8, 8), 10, n_clients=10, n_train=1438, n_test=50, origin="test")
    data = _probe_store(tmp_path / "probe", size, n_clients=6, n_domains=2, rows=20)
    assert data.n_clients == 6 and set(data.n_train()) == {20} and data.domain_train.max() <= 1
    run = {"train": {"batch_size": 10**9, "clients_per_round": 3}}
    assert _probe_train(run, data) == {"batch_size": 20, "clients_per_round": None, "clients_per_cluster": None}


@pytest.mark.slow
def test_the_accuracy_benchmark_sets_the_dag_s_estimate_beside_its_time(tmp_path):
    """`benchmarks/estimate_accuracy.py` on a two-run config: the workflow's own estimate line and
    the measured time of its jobs, in a folder of its own (nothing written to the checkout)."""
    import re
    import subprocess
    import sys

    from conftest import ROOT

    cfg = _own(tmp_path, batch_size=10, rounds=2)
    for key in ("results", "data_dir"):
        del cfg[key]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**cfg, "tracking": False}))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "estimate_accuracy.py"), "--config", str(path),
                        "--cores", "2", "--workdir", str(tmp_path / "work")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "vector extensions:" in r.stdout
    row = re.search(r"^\| tiny \| 2 \| ([\d.]+) min \| ([\d.]+) min \| ([\d.]+) min \| ([\d.]+) \|$", r.stdout, re.M)
    assert row, r.stdout
    estimate, jobs, whole, ratio = map(float, row.groups())
    assert 0 < jobs <= whole and estimate > 0 and ratio > 0
    assert "of the jobs Snakemake will run: 2 training runs" in r.stdout
    assert (tmp_path / "work" / "tiny" / "results" / "runs").is_dir()


def test_a_method_s_probe_round_becomes_its_step_factor_server_and_evaluation(tmp_path, monkeypatch):
    """By hand, with the probe's timings given: 6 probe clients of 20 samples (two batches of 10),
    one local epoch: 12 local steps a round. FedAvg's local training 0.24 s over 12 bare steps of
    0.01 s is a factor 2 (what the engine adds); FeSEM's 0.36 s a factor 3, its server step 0.06 s
    is 0.01 s a client. A method that fails on the probe counts as FedAvg."""
    from mcfl import cost, probe
    from mcfl.plan import Plan
    from mcfl.workload import DataSize, RunCost

    size = DataSize((1, 8, 8), 10, n_clients=10, n_train=1440, n_test=50, origin="test")
    runs = list(Plan(validate(_own(tmp_path, batch_size=10))).runs.values())
    seconds = {"FedAvg": (0.24, 0.0, 0.06), "FeSEM": (0.36, 0.06, 0.12)}
    monkeypatch.setattr(probe, "_time_method", lambda run, data, device: seconds[run["method"]])
    costs = cost.method_costs(runs, size, "cpu", timer=lambda *a: (0.01, 0.001))
    fedavg, fesem = (costs[cost.method_key(r)] for r in runs)
    assert fedavg == cost.MethodCost(pytest.approx(2.0), 0.0, pytest.approx(0.01))
    assert fesem == cost.MethodCost(pytest.approx(3.0), pytest.approx(0.01), pytest.approx(0.02))
    # a round of 4 clients: 3 x the bare steps' 0.5 s + 4 x 0.01 s; evaluation: at least 10 x 0.02 s
    run = RunCost("mine", "FeSEM(2)", 0, rounds=3, round_s=0.5, evals=1, eval_s=0.1, init_s=0.0)
    priced = cost.with_method(run, fesem, clients=4, n_clients=10)
    assert priced.round_s == pytest.approx(1.54) and priced.eval_s == pytest.approx(0.2)

    def fails(run, data, device):
        if run["method"] == "FeSEM":
            raise RuntimeError("no")
        return seconds["FedAvg"]

    monkeypatch.setattr(probe, "_time_method", fails)
    costs = cost.method_costs(runs, size, "cpu", timer=lambda *a: (0.01, 0.001))
    assert costs[cost.method_key(runs[1])] == costs[cost.method_key(runs[0])]
