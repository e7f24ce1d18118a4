"""FeSEM (Long, Xie, Shen, Zhou, Wang, Jiang, "Multi-Center Federated Learning: Clients Clustering
for Better Personalization", World Wide Web 2022): the planner of its clustering figures
(:mod:`.plan`, Figs. 4-5, made by ``mcfl paper fesem ...``: :mod:`.cli`). Its published Tables 2-3
are ``mcfl/report/paper_tables.csv``, which the workflow's report compares every run with
(:mod:`mcfl.report.paper`); its methods are in :mod:`mcfl.algorithms`."""

from mcfl.papers import Paper

PAPER = Paper(
    name="fesem",
    title='Long, Xie, Shen, Zhou, Wang, Jiang, "Multi-Center Federated Learning: Clients Clustering for '
          'Better Personalization", World Wide Web 2022',
    planner="mcfl.papers.fesem.plan:FiguresPlan",
    cli="mcfl.papers.fesem.cli",
    section="figures",
    published="report/paper_tables.csv",
    docs="docs/methods/fesem.md",
)
