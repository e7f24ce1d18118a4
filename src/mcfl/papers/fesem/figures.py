"""FeSEM's clustering figures from a finished run (Long et al., World Wide Web 2022, §6.2): Fig. 4
from the run's final state (its clients' local models, :func:`mcfl.snapshot.cluster_snapshot`)
and Fig. 5 from its assignments, drawn by :mod:`mcfl.report.figures`; the options are
``mcfl paper fesem {clusters,cases}``'s (:mod:`.cli`)."""

from __future__ import annotations

from pathlib import Path

from mcfl.config import parse_run
from mcfl.federation import resolve_device
from mcfl.io import staged
from mcfl.report import figures
from mcfl.federation import configure_torch
from mcfl.snapshot import cluster_snapshot


def clusters(a):
    """Fig. 4: the PNG and its CSV of 2-D points, both or neither."""
    run = parse_run(a.run)
    dev = resolve_device(a.device)
    configure_torch(dev, a.threads)
    snap = cluster_snapshot(run, a.store, a.state, n_clients=a.clients, centres=a.projection == "pca",
                            seed=a.seed, device=dev)
    with staged(Path(a.out).parent) as stage:
        return figures.clusters_figure(snap, stage / Path(a.out).name, projection=a.projection, seed=a.seed)


def cases(a):
    """Fig. 5: samples of a few clients of each cluster."""
    return figures.cases_figure(a.store, a.assignments, a.out, clients_per_cluster=a.clients,
                                samples=a.samples, seed=a.seed, title=a.title)
