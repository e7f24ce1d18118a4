"""The ``mcfl`` sub-commands: each reads its parsed options, does its work through the package and
returns an exit code (:data:`COMMANDS`)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import textwrap
from pathlib import Path

from mcfl.cli import replication as replication_cli
from mcfl.cli.parser import _first_sentence, _plain, available_cores
from mcfl.data.leaf import cli as leaf_cli
from mcfl.replication import cost_line

def _cmd_prepare(a) -> int:
    from mcfl.data import prepare

    params = {k: v for k, v in vars(a).items() if k not in ("cmd", "source", "out", "verbose")
              and v is not None}
    _check_source_flags(a.source, params)
    out = prepare(a.source, a.out, **params)
    from mcfl.data import load

    d = load(out)
    print(f"{out}: {d.n_clients} clients, {d.meta['n_train']} train / {d.meta['n_test']} test samples, "
          f"{d.n_classes} classes, content hash {d.content_hash[:12]}")
    return 0


def _check_source_flags(source: str, params: dict) -> None:
    """The single-valued flags of ``mcfl prepare SOURCE`` checked against the source's annotated
    bounds, as a config's ``prepare`` block is (``--seed 1e20`` names ``--seed``, not numpy's seed
    range); repeatable flags arrive as text and are parsed and checked by the source."""
    import inspect as _inspect

    from mcfl.config.validate import _check_value, _hints, _param_hint
    from mcfl.data import source_fn

    fn = source_fn(source)
    sig, hints = _inspect.signature(fn), _hints(fn)
    for name, value in params.items():
        if name in sig.parameters and not isinstance(value, list):   # lists: text, the source parses them
            _check_value("--" + name.replace("_", "-"), value, _param_hint(sig.parameters[name], hints))


def _cmd_partition(a) -> int:
    from mcfl.data import load
    from mcfl.data.partition import check_alpha
    from mcfl.data.repartition import partition_store

    if a.scheme == "dirichlet":
        check_alpha(a.alpha, "--alpha")
    try:
        out = partition_store(a.store, a.out, scheme=a.scheme, clients=a.clients, alpha=a.alpha,
                              classes_per_client=a.classes_per_client, min_samples=a.min_samples,
                              sizes=a.sizes, split=a.split, test_fraction=a.test_fraction, seed=a.seed)
    except ValueError as e:                     # the draw's own check: name the flag
        raise (ValueError(f"--{e}") if str(e).startswith("alpha: ") else e) from None
    d = load(out)
    print(f"{out}: {d.meta['partition']['label']}, {d.n_clients} clients, {d.meta['n_train']} train / "
          f"{d.meta['n_test']} test samples, content hash {d.content_hash[:12]}")
    return 0


def _cmd_check_config(a) -> int:
    from mcfl.config import expand_runs, load_config

    cfg = load_config(*a.config)
    runs = expand_runs(cfg)
    print(f"{' + '.join(a.config)}: OK, {len(runs)} training runs")
    for r in runs:
        print(f"  {r['dataset']:<12} {r['label']:<14} seed {r['seed']}")
    if a.estimate:
        from mcfl.cost import duration, estimate
        from mcfl.plan import Plan

        try:
            plan = Plan(cfg)
            est = estimate(plan)
        except (ValueError, RuntimeError, OSError) as e:    # the config is valid: say why, go on
            print(f"(no cost estimate: {' '.join(str(e).split())})")
            return 0
        print(est.summary(cores=available_cores()))
        if "replication" in cfg:                           # what the other draws add (mcfl.replication)
            finished = {(r["dataset"], r["label"], r["seed"]) for r in plan.configured.values()
                        if (Path(plan.dir_of(r)) / "metrics.json").is_file()}
            print(cost_line(cfg, est.runs, duration, finished))
        print("  (snakemake prints the cost of the jobs it will actually run when it starts: "
              "`snakemake -n` lists them)")
    return 0


def _cmd_methods(a) -> int:
    """Built-in methods, their aliases and the methods installed packages register, each with its
    hyperparameters and where it comes from."""
    from mcfl import algorithms

    def show(name: str, cls, where: str) -> None:
        fields = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls.Params))
        doc = _first_sentence(_plain((inspect.getdoc(inspect.getmodule(cls)) or "").split("\n\n")[0]))
        text = textwrap.fill(f"[{where}] {doc}", 100, initial_indent=" " * 13, subsequent_indent=" " * 13)
        print(f"{name:<12} {fields or '(no hyperparameters)'}\n{text}")

    for name, cls in sorted(algorithms.ALGORITHMS.items()):
        aliases = [a for a, target in algorithms.ALIASES.items() if target == name]
        show(name, cls, "built-in" + (f"; also named {', '.join(aliases)} (the same runs)" if aliases else ""))
    for alias, target in sorted(algorithms.ALIASES.items()):
        print(f"{alias:<12} alias of {target} (the same runs)")
    for name, where in algorithms.plugins().items():
        if isinstance(where, algorithms.MethodError):
            print(f"{name:<12} unusable: {where}")
        else:
            show(name, algorithms.get(name), where)
    return 0


def _cmd_check_method(a) -> int:
    """The conformance kit (:mod:`mcfl.check`) on one method: a line per check; exit 1 naming the
    failed checks."""
    from mcfl import check

    unknown = [c for c in a.checks or () if c not in check.CHECKS]
    if unknown:
        raise ValueError(f"--check: unknown check {unknown[0]!r}; known: {', '.join(check.CHECKS)}")
    cls = check.resolve(a.method)
    print(f"{a.method}: checking {cls.__module__}.{cls.__qualname__} on a {check.TRAIN['rounds']}-round "
          f"digits federation", flush=True)
    failed = []
    for result in check.check_method(cls, a.checks):
        print(result.line(), flush=True)
        failed += [] if result.passed else [result.check]
    if failed:
        print(f"{a.method}: failed {len(failed)} check(s): {', '.join(failed)}")
        return 1
    print(f"{a.method}: all {len(a.checks or check.CHECKS)} checks passed")
    return 0


def _federation_for(run: dict, store: str, device: str, threads: int, inputs=None):
    from mcfl.data import load
    from mcfl.federation import build_federation, resolve_device
    from mcfl.runner import configure_torch

    from mcfl.cost.memory import check_run

    dev = resolve_device(device)
    configure_torch(dev, threads)
    data = load(store)                      # verified in full before anything is written
    check_run(run["train"], run["model"], data, K=run.get("K"), device=dev)
    return build_federation(data, run["model"], run["train"], run["seed"], dev, inputs)


def _cmd_first_models(a) -> int:
    """Every client's first local model from a :func:`mcfl.cluster.spec.first_models_spec` (or a
    whole run's JSON), for the centre files of several runs to share."""
    from mcfl.cluster.init import all_first_models, save_first_models
    from mcfl.cluster.spec import first_models_spec

    from mcfl.config.run_arg import FIRST_MODELS_KEYS, parse_run

    spec = parse_run(a.run, spec_ok=FIRST_MODELS_KEYS)
    if "params" in spec:                                  # a run: its first-models spec
        spec = first_models_spec(spec)
    fed = _federation_for(spec, a.store, a.device, a.threads)
    models = all_first_models(fed, progress=not a.no_progress)
    save_first_models(models, a.out)
    print(f"{a.out}: first local models of {fed.n_clients} clients, {fed.model.size} weights each")
    return 0


def _cmd_init_centres(a) -> int:
    """Initial centres from a :func:`mcfl.cluster.spec.centre_spec` (or a whole run's JSON); with
    ``--first-models``, clustering the first local models that file holds."""
    from mcfl.cluster.init import init_centres, load_first_models, save_centres
    from mcfl.cluster.spec import centre_spec

    from mcfl.config import parse_run

    spec = parse_run(a.run, spec_ok=True)
    if "params" in spec:                                  # a run: its centre spec
        spec = centre_spec(spec)
    if spec["K"] == "auto":
        if not a.k_from:
            raise ValueError("K is 'auto'; pass --k-from with the select-k result")
        from mcfl.select_k import read_k

        spec["K"] = read_k(a.k_from)
    fed = _federation_for(spec, a.store, a.device, a.threads)
    K = int(spec["K"])
    models = load_first_models(a.first_models, fed) if a.first_models else None
    c = init_centres(fed, K, progress=not a.no_progress, models=models,
                     **{k: spec[k] for k in ("restarts", "distance", "weighted", "method", "projection")})
    save_centres(c, a.out)
    sizes = [int((c.assign == k).sum()) for k in range(K)]
    print(f"{a.out}: K={K}, cluster sizes {sizes}, intra-cluster distance {c.inertia:.4g}")
    return 0


def _per_run(a) -> list[dict]:
    """``mcfl train``'s options run by run: every repeated option is given once per ``--run`` (or,
    for the optional ones, not at all)."""
    n = len(a.run)
    per = {"run": a.run, "out": a.out, "centres": a.centres, "checkpoint": a.checkpoint,
           "k_from": a.k_from}
    for name, values in per.items():
        if values is not None and len(values) != n:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{n} --run given but {len(values)} {flag}: give {flag} once per --run"
                             + ("" if name in ("run", "out") else " or not at all"))
    outs = [os.path.abspath(o) for o in a.out]
    if len(set(outs)) != n:
        raise ValueError(f"--out repeated: each run needs its own directory ({', '.join(a.out)})")
    return [{k: (v[i] if v is not None else None) for k, v in per.items()} for i in range(n)]


def _cmd_train(a) -> int:
    from mcfl.runner import train
    from mcfl.track import make_tracker

    from mcfl.config import parse_run

    jobs = _per_run(a)
    runs = [parse_run(j["run"]) for j in jobs]     # every --run checked before any trains
    for j, run in zip(jobs, runs):
        if run["params"].get("K") == "auto":               # checked again with the K chosen
            run = parse_run(json.dumps(_resolve_k(run, j["k_from"])))
        tracker = make_tracker(a.tracking, run.get("experiment", "mcfl"), run_dir=j["out"])
        inputs = {"centres": j["centres"]} if j["centres"] else None
        res = train(run, a.store, j["out"], inputs=inputs, tracker=tracker, device=a.device,
                    threads=a.threads, checkpoint=j["checkpoint"], progress=not a.no_progress)
        f = res["final"]
        extra = f", ARI {f['ari']:.3f}" if "ari" in f else ""
        print(f"{run['dataset']} {run['label']} seed {run['seed']}: micro acc {f['micro_acc']:.4f}, "
              f"macro acc {f['macro_acc']:.4f}{extra} ({res['wall_s']} s)", flush=True)
    return 0


def _resolve_k(run: dict, k_from: str | None) -> dict:
    """A `K: auto` run takes its K from the select_k rule's file."""
    if run["params"].get("K") != "auto":
        return run
    if not k_from:
        raise ValueError(f"{run['label']}: K is 'auto'; pass --k-from with the select-k result")
    from mcfl.select_k import read_k

    return dict(run, params={**run["params"], "K": read_k(k_from)})


def _cmd_select_k(a) -> int:
    from mcfl.runner import configure_torch
    from mcfl.federation import resolve_device
    from mcfl.select_k import select_k

    from mcfl.config import parse_run

    run = parse_run(a.run)
    if not run.get("select_k"):
        raise ValueError(f"{run['label']}: not a `K: auto` run (no select_k settings)")
    configure_torch(resolve_device(a.device), a.threads)
    res = select_k(run, a.store, a.out, device=a.device, threads=a.threads)
    scores = ", ".join(f"K={s['K']}: acc {s['micro_acc']:.4f}" for s in res["scores"])
    print(f"{run['dataset']} {run['label']} seed {run['seed']}: chose K={res['K']} ({scores})")
    return 0


def _cmd_track(a) -> int:
    from mcfl.io import atomic_path
    from mcfl.track import tracking_uri
    from mcfl.record import record_finished

    pairs = record_finished(a.runs, a.experiment)
    with atomic_path(a.out) as tmp:
        tmp.write_text("run_dir\tmlflow_run_id\n" + "".join(f"{d}\t{r}\n" for d, r in pairs))
    print(f"{len(pairs)} runs recorded in {tracking_uri()} (experiment {a.experiment!r})")
    return 0


def _cmd_report(a) -> int:
    from mcfl.report import write_report

    sources = dict(x.split("=", 1) for x in a.sources or [])
    draws = dict(x.split("=", 1) for x in a.original_draw or [])
    write_report([Path(p) for p in a.runs], Path(a.out), sources, draws)
    return 0


def _cmd_report_protocols(a) -> int:
    from mcfl.report.protocols import write

    write(a.runs, a.out, paper_results=a.paper_results, reference=a.reference, title=a.title or None,
          authors_results=a.authors_results)
    return 0


def _cmd_publish(a) -> int:
    from mcfl.report.publish import publish

    publish(Path(a.results), [Path(p) for p in a.runs], Path(a.out), a.config, a.title,
            figures=a.figures)
    return 0


def _cmd_report_writers(a) -> int:
    from mcfl.report.writers import write

    write(a.store, a.runs, a.out, shares=a.shares)
    return 0


def _cmd_report_select_k(a) -> int:
    from mcfl.select_k import write_select_k_report

    write_select_k_report([Path(p) for p in a.files], Path(a.out))
    return 0


def _cmd_paper(a) -> int:
    """``mcfl paper PAPER OUTPUT`` (and ``figure``, ``fedgsp``, ``report-fedcg``): the paper's output."""
    from mcfl.papers import get

    return get(a.paper).commands().write(a)


#: the options that name a command's inputs (files or folders it reads)
INPUT_OPTIONS = ("store", "runs", "run_dirs", "dir", "images", "state", "assignments", "centres",
                 "first_models", "k_from", "files", "results", "config", "paper_results",
                 "authors_results")
#: the commands whose ``--out`` is a folder replaced as a whole (a store, a LEAF folder): it must
#: not contain an input either
WHOLE_FOLDER_OUT = ("prepare", "partition", "import-leaf", "export-leaf", "download")


def refuse_own_inputs(a) -> None:
    """A one-line error before any work if a command's ``--out`` (or ``--checkpoint``) is one of its
    inputs, or, for a folder replaced as a whole, contains one (:func:`mcfl.paths.refuse_overlap`):
    ``mcfl partition S --out S`` would delete the store it reads."""
    from mcfl.paths import refuse_overlap

    def paths(value) -> list:
        values = value if isinstance(value, list) else [value]
        return [v for v in values if isinstance(v, str) and v]

    inputs = [p for k in INPUT_OPTIONS for p in paths(getattr(a, k, None))]
    if a.cmd == "prepare":                     # a source's own path options (raw files, a zip)
        inputs += [v for k, v in vars(a).items() if k not in ("cmd", "out", "source")
                   and isinstance(v, str) and v and os.path.exists(v)]
    whole = a.cmd in WHOLE_FOLDER_OUT
    for flag in ("out", "checkpoint"):
        for out in paths(getattr(a, flag, None)):
            if whole:
                refuse_overlap([out], inputs, flag=f"--{flag}")
            else:                              # files written inside --out: only equality harms
                same = [i for i in inputs if os.path.realpath(i) == os.path.realpath(out)]
                if same:
                    raise ValueError(f"--{flag} {out}: is the input {same[0]}; write the output elsewhere")


COMMANDS = {"prepare": _cmd_prepare, "check-config": _cmd_check_config, "methods": _cmd_methods,
            "check-method": _cmd_check_method,
            "first-models": _cmd_first_models, "init-centres": _cmd_init_centres, "train": _cmd_train, "report": _cmd_report,
            "partition": _cmd_partition, "figure": _cmd_paper, "fedgsp": _cmd_paper,
            "select-k": _cmd_select_k, "report-select-k": _cmd_report_select_k,
            "report-fedcg": _cmd_paper, "paper": _cmd_paper, "report-protocols": _cmd_report_protocols,
            "report-writers": _cmd_report_writers, "publish": _cmd_publish, "track": _cmd_track, **leaf_cli.COMMANDS,
            **replication_cli.COMMANDS}
