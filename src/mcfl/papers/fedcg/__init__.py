"""FedCG (Caldarola, Mancini, Galasso, Ciccone, Rodolà, Caputo, "Cluster-driven Graph Federated
Learning over Multiple Domains", CVPR Workshops 2021): the planner of its tables (:mod:`.plan`) and
Tables 3-5 with the paper's own numbers (:mod:`.tables`, made by ``mcfl paper fedcg tables``:
:mod:`.cli`). Its method is :mod:`mcfl.algorithms.fedcg`, its model :mod:`mcfl.models.fedcg`."""

from mcfl.papers import Paper

PAPER = Paper(
    name="fedcg",
    title='Caldarola, Mancini, Galasso, Ciccone, Rodolà, Caputo, "Cluster-driven Graph Federated Learning '
          'over Multiple Domains", CVPR Workshops 2021',
    planner="mcfl.papers.fedcg.plan:FedCGPlan",
    cli="mcfl.papers.fedcg.cli",
    published="mcfl.papers.fedcg.tables:paper_table5",
    docs="docs/methods/fedcg.md",
)
