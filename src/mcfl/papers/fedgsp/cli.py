"""``mcfl paper fedgsp {cpd,table,heatmap,kappa}``: FedGSP's tables and figures (Zeng et al.,
DASFAA 2022, §4.2; :mod:`.tables` makes them). ``mcfl fedgsp ...`` is the same command."""

from __future__ import annotations

from pathlib import Path

from mcfl.fedgsp.metrics import cost_model
from mcfl.inputs import json_flag
from mcfl.io import staged
from mcfl.papers.fedgsp.tables import table_markdown, write_cpd, write_heatmap, write_kappa, write_table

HELP = {"cpd": "CPD box plots (Fig. 3a)", "table": "Table 1, curves, time/traffic to target (Figs. 3b/c, 6)",
        "heatmap": "test-loss heatmaps (Fig. 4)", "kappa": "kappa sweep (Fig. 5)"}


def add_outputs(w) -> None:
    """One sub-parser per output (``cpd``, ``table``, ``heatmap``, ``kappa``) of the sub-parsers ``w``."""
    c = w.add_parser("cpd", help=HELP["cpd"])
    c.add_argument("--store", required=True, help="prepared store whose clients are grouped")
    c.add_argument("--groups", type=int, required=True, help="number of groups")
    c.add_argument("--seeds", type=int, nargs="+", required=True, help="seeds of the groupings compared")
    c.add_argument("--rounding", default="paper", choices=["paper", "exact"],
                   help="group sizes rounded as the paper does, or exactly (default: paper)")
    c.add_argument("--icg-iters", type=int, default=10, help="ICG iterations (default: 10)")
    c.add_argument("--sigma", type=float, default=1.0, help="kernel width of the MMD (default: 1.0)")
    for name in ("table", "heatmap", "kappa"):
        q = w.add_parser(name, help=HELP[name])
        q.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (metrics.json, history.csv)")
        if name != "heatmap":
            q.add_argument("--train", required=True, help="JSON list, one per RUN_DIR, of "
                           "{clients_per_round, local_epochs}")
            q.add_argument("--store", required=True, help="the runs' prepared store")
            q.add_argument("--cost", default="{}", help="JSON of cost-model constants (Eqs. 15-17)")
        if name == "table":
            q.add_argument("--target", type=float, required=True, help="target accuracy (e.g. 0.8)")
    for q in list(w.choices.values()):
        q.add_argument("--out", required=True, help="output directory")


def write(a) -> int:
    """Make the output ``a.output`` names (every file of it or none: :func:`mcfl.io.staged`)."""
    with staged(a.out) as out:
        text = _write(a, out)
    print(text)
    return 0


def _write(a, out: Path) -> str:
    if a.output == "cpd":
        s = write_cpd(a.store, out, a.groups, a.seeds, rounding=a.rounding, icg_iters=a.icg_iters, sigma=a.sigma)
        return s.to_string(index=False)
    dirs = [Path(d) for d in a.run_dirs]
    if a.output == "heatmap":
        return write_heatmap(dirs, out).to_string(index=False)
    train, cost = json_flag(a.train, "--train", list, items=dict), cost_model(json_flag(a.cost, "--cost", dict))
    if a.output == "table":
        return table_markdown(write_table(dirs, train, a.store, a.target, out, cost))
    return write_kappa(dirs, train, a.store, out, cost).to_string(index=False)
