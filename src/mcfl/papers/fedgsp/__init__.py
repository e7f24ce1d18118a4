"""FedGSP (Zeng, Liu, Pan, Li, Yu, "FedGSP: Accelerating Federated Learning on Non-IID Data via
Grouped Sequential-to-Parallel Training", DASFAA 2022), §4.2: the config's ``fedgsp`` block and its
sweeps (:mod:`.config`), the planner of its outputs (:mod:`.plan`), Table 1 and Figs. 3-6
(:mod:`.tables`, made by ``mcfl paper fedgsp ...``: :mod:`.cli`) and the paper's Table 1
(``PAPER_TABLE1``). Its methods are in :mod:`mcfl.algorithms.fedgsp`, their metrics and cost model
in :mod:`mcfl.fedgsp.metrics`."""

from mcfl.papers import Paper

PAPER = Paper(
    name="fedgsp",
    title='Zeng, Liu, Pan, Li, Yu, "FedGSP: Accelerating Federated Learning on Non-IID Data via Grouped '
          'Sequential-to-Parallel Training", DASFAA 2022',
    planner="mcfl.papers.fedgsp.plan:FedGSPPlan",
    cli="mcfl.papers.fedgsp.cli",
    section="fedgsp",
    check="mcfl.papers.fedgsp.config:check_fedgsp",
    published="mcfl.papers.fedgsp.tables:PAPER_TABLE1",
    docs="docs/methods/fedgsp.md",
)
