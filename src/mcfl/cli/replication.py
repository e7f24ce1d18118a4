"""The replication subcommand of ``mcfl`` (added to its parser by :mod:`mcfl.cli.parser`)::

    mcfl check-draws --out CHECKED.json --sampled N DRAW=STORE...
    mcfl report-replication --out OUT --reference FedAvg --draws original s1 [--protocols standard v1] RUN...
"""

from __future__ import annotations


def add_parsers(sub) -> None:
    p = sub.add_parser("report-replication", help="paired differences to a reference on every draw of "
                                                  "the clients, with verdicts (OUT.md, OUT.csv, OUT.png)")
    p.add_argument("--out", required=True, help="output path without suffix")
    p.add_argument("--reference", default="FedAvg", help="label of the method every row is compared with")
    p.add_argument("--draws", nargs="+", required=True, help="the draws' names, the original first "
                                                             "(each run's metrics.json names its draw; "
                                                             "one that names none is the original's)")
    p.add_argument("--protocols", nargs="+", default=["standard"], help="standard and/or named protocols")
    p.add_argument("--title", default="", help="the page's heading")
    p.add_argument("--runs", nargs="+", required=True, help="run directories (metrics.json, predictions.csv)")


    p = sub.add_parser("check-draws", help="verify every draw's store and that it has the clients a round "
                                           "samples, before any training")
    p.add_argument("--out", required=True, help="JSON file written when every draw passes")
    p.add_argument("--sampled", type=int, default=0, help="clients a round samples (0: all)")
    p.add_argument("stores", nargs="+", help="DRAW=STORE, the original first")


def _cmd_check_draws(a) -> int:
    from mcfl.replication_report import check_draws

    pairs = [s.partition("=") for s in a.stores]
    bad = next((s for s, eq, _ in pairs if not eq), None)
    if bad is not None:
        raise ValueError(f"check-draws: {bad!r} is not DRAW=STORE")
    check_draws({d: store for d, _, store in pairs}, a.sampled, a.out)
    return 0


def _cmd_report_replication(a) -> int:
    from mcfl.replication_report import write

    write(a.runs, a.out, reference=a.reference, protocols=a.protocols, draws=a.draws, title=a.title or None)
    return 0


COMMANDS = {"report-replication": _cmd_report_replication, "check-draws": _cmd_check_draws}
