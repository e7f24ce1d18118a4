"""The ``mcfl`` command line: its parser (every sub-command's options and help)."""

from __future__ import annotations

import argparse
import inspect
import os

from mcfl.cli import replication as replication_cli
from mcfl.data.leaf import cli as leaf_cli

#: the parser's description: what ``mcfl --help`` shows above the sub-commands
USAGE = """The mcfl console script. Snakemake rules call these subcommands; so can you.
The subcommands (each has its own --help):

    mcfl prepare digits --out data/digits --clients 100 --alpha 0.5
    mcfl partition data/digits --out data/digits-iid --scheme iid   # re-deal a store's samples
    mcfl check-config config/config.yaml          # validate; list the runs and what they cost
    mcfl methods                                  # algorithms and their hyperparameters
    mcfl check-method mypkg.fedfoo:FedFoo          # does a method keep the algorithm contract?
    mcfl first-models --run JSON --store DIR --out FILE   # shared by several centre files
    mcfl init-centres --run JSON --store DIR --out FILE [--first-models FILE]
    mcfl train --run JSON --store DIR --out DIR [--centres FILE] [--checkpoint FILE] [--k-from FILE]
    mcfl select-k --run JSON --store DIR --out FILE  # K selection (FeSEM §5.2) for a K: auto run
    mcfl report --out results RUN_DIR [RUN_DIR ...] [--sources femnist=femnist ...]
    mcfl track --experiment NAME --out FILE RUN_DIR [RUN_DIR ...]   # tracking: deferred
    mcfl download femnist --out data/raw/femnist  # LEAF raw files (see mcfl.data.leaf.cli)
    mcfl import-leaf DIR --out STORE / mcfl export-leaf STORE --out DIR
    mcfl paper PAPER OUTPUT ...                   # a paper's tables and figures (mcfl paper -h)
    mcfl paper fesem clusters|cases ...           # FeSEM Figs. 4 and 5 (also: mcfl figure ...)
    mcfl paper fedgsp {cpd,table,heatmap,kappa} ...   # FedGSP's tables and figures (also: mcfl fedgsp)
    mcfl paper fedcg tables --out results/fedcg RUN_DIR ...   # FedCG's Tables 3-5 (also: report-fedcg)
"""


#: the sub-commands whose options take imports to build (data sources, report modules), with their
#: help: ``build_parser(commands)`` lists those not in ``commands`` with the help alone
HEAVY = {"prepare": "prepare a dataset into a store",
         "partition": "re-partition a store's samples into new clients",
         "download": leaf_cli.DOWNLOAD_HELP,
         "fedgsp": "FedGSP tables and figures (CPD, Table 1, heatmaps, kappa; = mcfl paper fedgsp)",
         "paper": "a registered paper's tables and figures: mcfl paper PAPER OUTPUT ...",
         "figure": "FeSEM's clustering figures (Fig. 4: clusters, Fig. 5: cases; = mcfl paper fesem)",
         "report-fedcg": "FedCG's ablation tables (Tables 3-5) from run directories (= mcfl paper fedcg tables)"}


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; all cores where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not on Linux
        return os.cpu_count() or 1


def _add_source_parsers(sub) -> None:
    """``mcfl prepare SOURCE``: one sub-parser per data source, options from its signature."""
    from mcfl.data import SOURCES, source_fn

    p = sub.add_parser("prepare", help=HEAVY["prepare"])
    srcs = p.add_subparsers(dest="source", required=True, metavar="SOURCE")
    for name in sorted(SOURCES):
        fn = source_fn(name)
        doc = _plain((inspect.getdoc(inspect.getmodule(fn)) or "").split("\n\n")[0])
        sp = srcs.add_parser(name, help=_first_sentence(doc) or name, description=doc)
        sp.add_argument("--out", required=True, help="store directory to write")
        aliases = getattr(fn, "cli_aliases", {})     # e.g. LEAF's short flags: {"k": ["-k"]}
        for pname, par in inspect.signature(fn).parameters.items():
            flag = ["--" + pname.replace("_", "-"), *aliases.get(pname, ())]
            if par.default is par.empty:
                if par.kind == par.KEYWORD_ONLY:        # a required option, e.g. leaf_json's --dir
                    sp.add_argument(*flag, dest=pname, required=True,
                                    help="required (see the description above)")
                continue
            d = par.default
            if isinstance(d, bool):
                sp.add_argument(*flag, dest=pname, action=argparse.BooleanOptionalAction, default=d,
                                help=f"on or off (default: {'on' if d else 'off'})")
            elif isinstance(d, (list, tuple)):
                sp.add_argument(*flag, dest=pname, action="append", default=None,
                                help=f"repeatable (default: {list(d)})")
            else:
                typ = type(d) if d is not None else _optional_type(fn, pname)
                sp.add_argument(*flag, dest=pname, type=typ, default=d, help=f"default: {d}")


def _plain(text: str) -> str:
    """Docstring text for a terminal: reStructuredText's double backticks and emphasis dropped."""
    return text.replace("``", "").replace("`", "")


def _first_sentence(text: str) -> str:
    """The first sentence of ``text`` on one line: up to the first '. ' outside parentheses (a
    citation's "Eqs. 6-8" does not end it), or the end."""
    text, depth = " ".join(text.split()), 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "." and depth <= 0 and text[i + 1:i + 2] == " ":
            return text[:i + 1]
    return text


def _optional_type(fn, name: str) -> type:
    """The type of a parameter that defaults to None, from its annotation (``int | None`` -> int)."""
    import typing

    hint = typing.get_type_hints(fn).get(name)
    return next((t for t in typing.get_args(hint) if t in (int, float)), str)


def _add_partition_parser(sub) -> None:
    from mcfl.data.repartition import DEFAULTS, SCHEMES

    p = sub.add_parser("partition", help=HEAVY["partition"],
                       description="Write a new store from STORE with the samples dealt out by "
                                   "--scheme (see mcfl.data.repartition).")
    p.add_argument("store", help="prepared store to read")
    p.add_argument("--out", required=True, help="store directory to write")
    p.add_argument("--scheme", choices=SCHEMES, default=DEFAULTS["scheme"],
                   help=f"how samples are dealt to clients (default: {DEFAULTS['scheme']})")
    p.add_argument("--clients", type=int, help="number of new clients (default: as many as STORE)")
    p.add_argument("--alpha", type=float, default=DEFAULTS["alpha"], help="Dirichlet concentration")
    p.add_argument("--classes-per-client", type=int, default=DEFAULTS["classes_per_client"],
                   help="labels per client of the classes scheme (default: %(default)s)")
    p.add_argument("--min-samples", type=int, default=DEFAULTS["min_samples"],
                   help="fewest training samples a client may get (default: %(default)s)")
    p.add_argument("--sizes", choices=("equal", "natural"), default=DEFAULTS["sizes"],
                   help="iid client sizes: equal, or shaped like the dataset's own clients")
    p.add_argument("--split", choices=("keep", "redo"),
                   help="train/test: keep each sample's role, or redo per client (default: keep "
                        "for natural, redo otherwise)")
    p.add_argument("--test-fraction", type=float, default=DEFAULTS["test_fraction"],
                   help="share of each client's samples held out for testing when the split is "
                        "redone (default: %(default)s)")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"],
                   help="seed of the dealing and the split (default: %(default)s)")


def _add_paper_parsers(sub, full) -> None:
    """``mcfl paper PAPER OUTPUT ...``: every registered paper's outputs (:mod:`mcfl.papers`), and
    the older names of the built-in papers' outputs: ``figure`` (FeSEM), ``fedgsp``, ``report-fedcg``.
    Each is built only when it is the command (the registry loads the installed papers)."""
    from mcfl.papers import get, papers

    if full("paper"):
        p = sub.add_parser("paper", help=HEAVY["paper"])
        w = p.add_subparsers(dest="paper", required=True, metavar="PAPER")
        try:
            for name, paper in papers().items():
                q = w.add_parser(name, help=paper.title, description=paper.title)
                paper.commands().add_outputs(q.add_subparsers(dest="output", required=True, metavar="OUTPUT"))
        except ValueError as e:         # mcfl.papers.PaperError: an installed paper that cannot be used
            raise SystemExit(f"mcfl paper: error: {e}") from None
    if full("figure"):
        p = sub.add_parser("figure", help=HEAVY["figure"])
        get("fesem").commands().add_outputs(p.add_subparsers(dest="output", required=True, metavar="FIGURE"))
        p.set_defaults(paper="fesem")
    if full("fedgsp"):
        p = sub.add_parser("fedgsp", help=HEAVY["fedgsp"])
        get("fedgsp").commands().add_outputs(p.add_subparsers(dest="output", required=True))
        p.set_defaults(paper="fedgsp")
    if full("report-fedcg"):
        p = sub.add_parser("report-fedcg", help=HEAVY["report-fedcg"])
        get("fedcg").commands().add_tables_arguments(p)
        p.set_defaults(paper="fedcg", output="tables")


DEVICE_HELP = ("where to compute: cpu, cuda, cuda:N (the N-th GPU), or auto = the GPU when PyTorch "
               "sees one, else the CPU (default: auto)")


THREADS_HELP = (f"CPU threads for PyTorch (default: the cores this process may use, here "
                f"{available_cores()}; the workflow passes each job's threads setting)")


RUN_HELP = ("the run's settings as JSON text, as the workflow passes them (mcfl check-config lists a "
            "config's runs; the Snakemake log shows each job's command)")


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The ``mcfl`` parser. ``commands``: the sub-commands to build in full (default: all); the
    others in :data:`HEAVY` are listed with their help only, so that a job does not import every
    data source and report module to read its own options (``main`` builds the one it runs)."""
    def full(name: str) -> bool:
        if commands is None or name in commands:
            return True
        sub.add_parser(name, help=HEAVY[name])
        return False

    ap = argparse.ArgumentParser(prog="mcfl", description=USAGE,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true", help="log debugging detail too")
    sub = ap.add_subparsers(dest="cmd", required=True)
    if full("prepare"):
        _add_source_parsers(sub)
    if full("partition"):
        _add_partition_parser(sub)
    p = sub.add_parser("check-config", help="validate a config, list its runs and estimate what "
                                            "they cost on this machine")
    p.add_argument("config", nargs="+", help="a config file (YAML, e.g. config/config.yaml; one that "
                   "names a base with extends: is read over it), then any overlays merged over it in "
                   "order, as snakemake --configfile A B merges them")
    p.add_argument("--estimate", action=argparse.BooleanOptionalAction, default=True,
                   help="time a few local steps of each model here and print what the runs cost "
                        "(a few seconds; default: on)")
    sub.add_parser("methods", help="list algorithms and their hyperparameters")
    # -- check-method: the conformance kit (mcfl.check) ------------------------------------------
    p = sub.add_parser("check-method", help="check that a method keeps the algorithm contract "
                                            "(state, resume, order, random generators, executors, ...)")
    p.add_argument("method", help="a method as a config names it: a built-in name, module:Class, or "
                                  "the name an installed package registers (mcfl.methods entry point)")
    p.add_argument("--check", action="append", dest="checks", metavar="NAME",
                   help="run only this check (repeatable; default: all of mcfl.check.CHECKS)")
    helps = {"first-models": "every client's first local model, for several centre files to share",
             "init-centres": "initialise cluster centres", "train": "train one run (or several: repeat --run)",
             "select-k": "choose K for a run with K: auto (FeSEM §5.2)"}
    outs = {"first-models": "first local models file to write (a PyTorch file)",
            "init-centres": "centres file to write (a PyTorch file)",
            "train": "run directory to write (metrics.json, history.csv, ...)",
            "select-k": "file to write the chosen K and the scores of every candidate to"}
    for name, text in helps.items():
        p = sub.add_parser(name, help=text)
        many = {"action": "append"} if name == "train" else {}
        p.add_argument("--run", required=True, **many, help=RUN_HELP + (
            "; repeat --run (and --out, and --centres/--checkpoint/--k-from where given) to train "
            "several runs of one store one after the other in this process, the i-th of each "
            "option belonging to the i-th run" if many else ""))
        p.add_argument("--store", required=True, help="prepared data store")
        p.add_argument("--out", required=True, **many, help=outs[name] + ("; once per --run" if many else ""))
        p.add_argument("--device", default="auto", help=DEVICE_HELP)
        p.add_argument("--threads", type=int, default=available_cores(), help=THREADS_HELP)
        if name not in ("select-k", "first-models"):
            p.add_argument("--k-from", **many, help="the select-k result to take K from (runs with K: auto)")
        if name != "select-k":
            p.add_argument("--no-progress", action="store_true",
                           help="no progress bar on stderr (default: a bar per "
                                + ("round" if name == "train" else "client trained") + ")")
    sub.choices["init-centres"].add_argument(
        "--first-models", help="the clients' first local models (from first-models) to cluster "
                               "instead of training them here")
    p = sub.choices["train"]
    p.add_argument("--centres", action="append", help="initial centres file (from init-centres)")
    p.add_argument("--checkpoint", action="append", help="checkpoint file: resumed from if present")
    p.add_argument("--tracking", action=argparse.BooleanOptionalAction, default=True,
                   help="record the run in MLflow")
    p = sub.add_parser("report", help="aggregate run directories into tables and figures")
    p.add_argument("--out", required=True, help="output directory (table.csv, table.md, figures/)")
    p.add_argument("runs", nargs="+", help="run directories (each with metrics.json, history.csv)")
    p.add_argument("--sources", nargs="*", metavar="DATASET=SOURCE",
                   help="data source of each dataset, to match FeSEM's tables (femnist, celeba)")
    p.add_argument("--original-draw", action="append", metavar="DATASET=DRAW",
                   help="the draw of a dataset whose runs name none (a replicated config's original)")
    p = sub.add_parser("track", help="record finished runs in MLflow from their files "
                                     "(tracking: deferred)")
    p.add_argument("--experiment", required=True, help="MLflow experiment name")
    p.add_argument("--out", required=True, help="TSV written: run directory -> MLflow run id")
    p.add_argument("runs", nargs="+", help="run directories (metrics.json, history.csv, ...)")
    p = sub.add_parser("report-select-k", help="tabulate select-k results (select_k.csv/.md)")
    p.add_argument("--out", required=True, help="output directory (select_k.csv, select_k.md)")
    p.add_argument("files", nargs="+", help="select-k result files")
    leaf_cli.add_parsers(sub, download=full("download"))     # download, import-leaf, export-leaf
    replication_cli.add_parsers(sub)                         # report-replication
    _add_paper_parsers(sub, full)
    p = sub.add_parser("report-protocols", help="FeSEM's Table 2 under the paper's and the standard "
                                                "protocol, beside the paper (OUT.csv, OUT.md)")
    p.add_argument("--out", required=True, help="output path without suffix (OUT.csv and OUT.md are written)")
    p.add_argument("--paper-results", help="results directory of the paper-protocol config (its finished "
                                           "runs are shown; absent or empty = 'not run')")
    p.add_argument("--authors-results", help="results directory of the authors' code config (its finished "
                                             "runs are shown; absent or empty = 'not run yet')")
    p.add_argument("--reference", default="FedAvg", help="label of the method of the paired comparison")
    p.add_argument("--title", default="", help="the table's heading (empty: FeSEM's Table 2's)")
    p.add_argument("runs", nargs="+", help="run directories (metrics.json, predictions.csv)")
    p = sub.add_parser("report-writers", help="per-writer image statistics against clustered runs' "
                                              "clusters (OUT.csv, OUT.md)")
    p.add_argument("--store", required=True, help="the runs' prepared store")
    p.add_argument("--out", required=True, help="output path without suffix")
    p.add_argument("--shares", action="store_true",
                   help="also OUT-shares.csv: domain shares (FedCG's domain_share_<k>) against the statistics")
    p.add_argument("runs", nargs="+", help="run directories (metrics.json, assignments.csv)")
    p = sub.add_parser("publish", help="copy a report (table.md, figures/) into the docs with its provenance")
    p.add_argument("--results", required=True, help="the config's results directory")
    p.add_argument("--out", required=True, help="page path without suffix, e.g. docs/results/NAME")
    p.add_argument("--config", required=True, help="the config file named on the page")
    p.add_argument("--title", required=True, help="the page's heading")
    p.add_argument("--figures", default="figures", help="folder of --results whose PNGs are copied "
                   "('.' for --results itself; default: figures)")
    p.add_argument("runs", nargs="+", help="the run directories of the report")
    return ap
