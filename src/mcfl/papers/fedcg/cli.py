"""``mcfl paper fedcg tables``: FedCG's Tables 3-5 (Caldarola et al., CVPR Workshops 2021) from run
directories (:mod:`.tables` makes them). ``mcfl report-fedcg`` is the same command."""

from __future__ import annotations

from pathlib import Path


def add_outputs(w) -> None:
    """The sub-parser of the ``tables`` output in the sub-parsers ``w``."""
    add_tables_arguments(w.add_parser("tables", help="FedCG's ablation tables (Tables 3-5) from run directories"))


def add_tables_arguments(p) -> None:
    p.add_argument("--out", required=True, help="output directory (table3-5.csv, tables.md)")
    p.add_argument("runs", nargs="+", help="run directories of FedCG and FedAvg runs (metrics.json, "
                                           "predictions.csv)")


def write(a) -> int:
    from mcfl.papers.fedcg.tables import write_fedcg_report     # (pandas: only when the tables are made)

    write_fedcg_report([Path(p) for p in a.runs], Path(a.out))
    return 0
