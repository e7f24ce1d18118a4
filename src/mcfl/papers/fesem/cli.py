"""``mcfl paper fesem {clusters,cases}``: FeSEM's clustering figures (Long et al., World Wide Web
2022, §6.2): Fig. 4 (sampled clients' local models in 2-D, coloured by cluster and by true cluster)
and Fig. 5 (samples of a few clients of each cluster), drawn by :mod:`.figures`.
``mcfl figure {clusters,cases}`` is the same command."""

from __future__ import annotations

import os

DEVICE_HELP = ("where to compute: cpu, cuda, cuda:N (the N-th GPU), or auto = the GPU when PyTorch "
               "sees one, else the CPU (default: auto)")


def _cores() -> int:
    """The CPU cores this process may run on (its affinity mask; all cores where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not on Linux
        return os.cpu_count() or 1


def add_outputs(w) -> None:
    """The sub-parsers of the ``clusters`` (Fig. 4) and ``cases`` (Fig. 5) outputs in ``w``."""
    f = w.add_parser("clusters", help="Fig. 4: sampled clients' local models in 2-D, coloured by "
                                      "cluster and by true cluster")
    f.add_argument("--run", required=True, help="the clustered run's JSON, as the workflow passes it "
                                                "(the run's settings from the config)")
    f.add_argument("--store", required=True, help="the store the run trained on")
    f.add_argument("--state", required=True, help="the run's final state (state.pt)")
    f.add_argument("--out", required=True, help="PNG to write (the 2-D points go next to it as .csv)")
    f.add_argument("--clients", type=int, default=400, help="clients to sample (all if fewer)")
    f.add_argument("--projection", choices=("pca", "tsne"), default="pca",
                   help="2-D projection of the models: PCA or t-SNE (default: pca)")
    f.add_argument("--seed", type=int, default=0, help="seed of the client sample and of t-SNE")
    f.add_argument("--device", default="auto", help=DEVICE_HELP)
    f.add_argument("--threads", type=int, default=_cores(),
                   help=f"CPU threads for PyTorch (default: the cores this process may use, here {_cores()})")
    f = w.add_parser("cases", help="Fig. 5: samples of a few clients of each cluster")
    f.add_argument("--store", required=True, help="the store the run trained on")
    f.add_argument("--assignments", required=True, help="the run's assignments.csv")
    f.add_argument("--out", required=True, help="PNG to write")
    f.add_argument("--title", default="", help="figure title (e.g. dataset and run label)")
    f.add_argument("--clients", type=int, default=3, help="clients shown per cluster")
    f.add_argument("--samples", type=int, default=8, help="training samples shown per client")
    f.add_argument("--seed", type=int, default=0, help="seed of the client and sample choice")


def write(a) -> int:
    """Draw the figure ``a.output`` names."""
    from mcfl.papers.fesem import figures      # (torch, matplotlib: only when a figure is drawn)

    res = figures.clusters(a) if a.output == "clusters" else figures.cases(a)
    print(f"{a.out}: {res}")
    return 0
