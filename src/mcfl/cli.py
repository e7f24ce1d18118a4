"""The ``mcfl`` console script. Snakemake rules call these subcommands; so can you.

    mcfl prepare digits --out data/digits --clients 100 --alpha 0.5
    mcfl check-config config/config.yaml          # validate; list the runs it makes
    mcfl methods                                  # algorithms and their hyperparameters
    mcfl init-centres --run JSON --store DIR --out FILE
    mcfl train --run JSON --store DIR --out DIR [--centres FILE] [--checkpoint FILE]
    mcfl report --out results RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import sys
from pathlib import Path


def _add_source_parsers(sub) -> None:
    """``mcfl prepare SOURCE``: one sub-parser per data source, options from its signature."""
    from mcfl.config import _source_fn
    from mcfl.data import SOURCES

    p = sub.add_parser("prepare", help="prepare a dataset into a store")
    srcs = p.add_subparsers(dest="source", required=True, metavar="SOURCE")
    for name in sorted(SOURCES):
        fn = _source_fn(name)
        doc = (inspect.getdoc(inspect.getmodule(fn)) or "").split("\n\n")[0]
        sp = srcs.add_parser(name, help=doc.splitlines()[0] if doc else name, description=doc)
        sp.add_argument("--out", required=True, help="store directory to write")
        for pname, par in inspect.signature(fn).parameters.items():
            if par.default is par.empty:
                continue
            flag = "--" + pname.replace("_", "-")
            d = par.default
            if isinstance(d, bool):
                sp.add_argument(flag, dest=pname, action=argparse.BooleanOptionalAction, default=d)
            elif isinstance(d, (list, tuple)):
                sp.add_argument(flag, dest=pname, action="append", default=None,
                                help=f"repeatable (default: {list(d)})")
            else:
                typ = type(d) if d is not None else str
                sp.add_argument(flag, dest=pname, type=typ, default=d, help=f"default: {d}")


def _cmd_prepare(a) -> int:
    from mcfl.data import prepare

    params = {k: v for k, v in vars(a).items() if k not in ("cmd", "source", "out", "verbose")
              and v is not None}
    out = prepare(a.source, a.out, **params)
    from mcfl.data import load

    d = load(out)
    print(f"{out}: {d.n_clients} clients, {d.meta['n_train']} train / {d.meta['n_test']} test samples, "
          f"{d.n_classes} classes, content hash {d.content_hash[:12]}")
    return 0


def _cmd_check_config(a) -> int:
    from mcfl.config import expand_runs, load_config

    cfg = load_config(a.config)
    runs = expand_runs(cfg)
    print(f"{a.config}: OK, {len(runs)} training runs")
    for r in runs:
        print(f"  {r['dataset']:<12} {r['label']:<14} seed {r['seed']}")
    return 0


def _cmd_methods(a) -> int:
    from mcfl import algorithms

    for name, cls in sorted(algorithms.ALGORITHMS.items()):
        fields = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls.Params))
        doc = (inspect.getdoc(inspect.getmodule(cls)) or "").split("\n")[0]
        print(f"{name:<12} {fields or '(no hyperparameters)'}\n             {doc}")
    return 0


def _federation_for(run: dict, store: str, device: str, threads: int, inputs=None):
    from mcfl.data import load
    from mcfl.federation import build_federation, resolve_device
    from mcfl.runner import configure_torch

    dev = resolve_device(device)
    configure_torch(dev, threads)
    return build_federation(load(store), run["model"], run["train"], run["seed"], dev, inputs)


def _cmd_init_centres(a) -> int:
    from mcfl import algorithms
    from mcfl.cluster.init import init_centres, save_centres

    run = json.loads(a.run)
    params = algorithms.get(run["method"]).Params(**run["params"])
    fed = _federation_for(run, a.store, a.device, a.threads)
    c = init_centres(fed, params.K, restarts=params.restarts, distance=params.distance,
                     weighted=params.mstep == "weighted", method=params.init,
                     projection=getattr(params, "init_projection", None))
    save_centres(c, a.out)
    sizes = [int((c.assign == k).sum()) for k in range(params.K)]
    print(f"{a.out}: K={params.K}, cluster sizes {sizes}, intra-cluster distance {c.inertia:.4g}")
    return 0


def _cmd_train(a) -> int:
    from mcfl.runner import train
    from mcfl.track import make_tracker

    run = json.loads(a.run)
    tracker = make_tracker(a.tracking, run.get("experiment", "mcfl"))
    inputs = {"centres": a.centres} if a.centres else None
    res = train(run, a.store, a.out, inputs=inputs, tracker=tracker, device=a.device,
                threads=a.threads, checkpoint=a.checkpoint, progress=not a.no_progress)
    f = res["final"]
    extra = f", ARI {f['ari']:.3f}" if "ari" in f else ""
    print(f"{run['dataset']} {run['label']} seed {run['seed']}: micro acc {f['micro_acc']:.4f}, "
          f"macro acc {f['macro_acc']:.4f}{extra} ({res['wall_s']} s)")
    return 0


def _cmd_report(a) -> int:
    from mcfl.report import write_report

    write_report([Path(p) for p in a.runs], Path(a.out))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mcfl", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="cmd", required=True)
    _add_source_parsers(sub)
    p = sub.add_parser("check-config", help="validate a config and list its runs")
    p.add_argument("config")
    sub.add_parser("methods", help="list algorithms and their hyperparameters")
    for name in ("init-centres", "train"):
        p = sub.add_parser(name, help="initialise cluster centres" if name != "train" else "train one run")
        p.add_argument("--run", required=True, help="the run's JSON (from `expand_runs`)")
        p.add_argument("--store", required=True, help="prepared data store")
        p.add_argument("--out", required=True)
        p.add_argument("--device", default="auto")
        p.add_argument("--threads", type=int, default=1)
    p.add_argument("--centres", help="initial centres file (from init-centres)")
    p.add_argument("--checkpoint", help="checkpoint file: resumed from if present")
    p.add_argument("--tracking", action=argparse.BooleanOptionalAction, default=True,
                   help="record the run in MLflow")
    p.add_argument("--no-progress", action="store_true")
    p = sub.add_parser("report", help="aggregate run directories into tables and figures")
    p.add_argument("--out", required=True, help="output directory (table.csv, table.md, figures/)")
    p.add_argument("runs", nargs="+", help="run directories (each with metrics.json, history.csv)")
    return ap


COMMANDS = {"prepare": _cmd_prepare, "check-config": _cmd_check_config, "methods": _cmd_methods,
            "init-centres": _cmd_init_centres, "train": _cmd_train, "report": _cmd_report}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    from mcfl.config import ConfigError
    from mcfl.data.store import StoreError
    from mcfl.engine import DivergenceError

    try:
        return COMMANDS[args.cmd](args)
    except (ConfigError, StoreError, DivergenceError, ValueError, FileNotFoundError) as e:
        print(f"mcfl {args.cmd}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
