"""Initial cluster centres for FeSEM-style methods (FeSEM §6.1, "Training settings").

"For the initialization of the cluster centers in FeSEM, we conducted pure clustering 20 times with
randomized initialization, and then the 'best' initialization, which has the minimal intra-cluster
distance, was selected as the initial centers." Implemented as: every client trains once from the
common initial weights (its *first local model*, local round 0); scikit-learn's ``KMeans`` with
``n_init=restarts`` (k-means++ seeding, a different random start per restart; the run with the
lowest inertia, i.e. the smallest intra-cluster squared distance, is kept) clusters those models on
the coordinates the E-step uses (all parameters, or the last layer); each centre is the mean of its
members' full first local models (plain, or sample-weighted like the M-step). The centres are
therefore distinct whenever the first local models are.

``method="random"`` is the authors' code instead: a random partition of the clients (docs/methods/
original-code.md), with centres again the means of each part's first local models.

Memory. k-means needs all m feature vectors at once. At FEMNIST scale (3,550 clients, 6.6M
parameters) the models themselves would take 94 GB, so the features are a Johnson-Lindenstrauss
random projection of the selected coordinates when the m x d float32 matrix would exceed
``FEATURE_BYTES`` (256 MiB), or whenever ``projection=k`` asks for one: each client's update
``u = (w - w0)[sel]`` is mapped, as it arrives, to ``S u`` in ``R^k`` (default k = 2048) by a
CountSketch (a sparse JL transform with one nonzero per column: coordinate j adds ``sign(j)·u_j``
to bucket ``h(j)``; Weinberger et al. 2009; Kane & Nelson 2014), with ``h`` and the signs drawn from
the run's seed (int32 buckets and float signs: 8 bytes per coordinate). ``E||S u||^2 = ||u||^2``,
and for updates spread over many coordinates the relative error of a squared distance has
standard deviation about ``sqrt(2/k)`` (3% at k = 2048); ``studies/projection.py`` measures it.
One pass over the coordinates per client: a dense Gaussian, or sklearn's ``SparseRandomProjection``
(k·sqrt(d) nonzeros: 850 MB and 0.13 s per FEMNIST model on one core), costs far more for the same
guarantee. Distances in the projected space replace the exact ones only for choosing the
partition; the centres are then the means of the members' full models, so the projection never
enters the centres themselves. ``projection=0`` always clusters on the exact coordinates (the
alternative to projecting is a small coordinate subset: ``distance="last_layer"``).

The full models are kept when they fit in ``keep_bytes``; otherwise the first local models are
recomputed (bitwise identical: per-client seeded) in a second pass that accumulates per-cluster sums.
Peak memory is then O(m·k + K·|W|), not O(m·|W|).
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.cluster.spec import KEEP_BYTES, centre_options
from mcfl.engine import Task
from mcfl.io import write_bytes
from mcfl.streams import KMEANS, SKETCH, derive_seed

if TYPE_CHECKING:                      # annotations only: no import of the layer above
    from mcfl.federation import Federation

log = logging.getLogger(__name__)

INIT_ROUND = 0
#: automatic projection: when the exact m x d float32 features would exceed this many bytes ...
FEATURE_BYTES = 256 << 20
#: ... cluster on this many random-projection coordinates instead
PROJECTION_DIM = 2048


@dataclass
class Centres:
    centres: torch.Tensor   # (K, |W|)
    assign: torch.Tensor    # (m,) int64
    inertia: float          # sum of squared distances of the features to their centre
    projection: int = 0     # dimension of the random projection the partition was found on (0: none)


class CountSketch:
    """A k x d sparse JL projection with one ±1 per column: ``S u = sum_j sign_j u_j e_{h(j)}``.
    ``h`` and the signs are drawn on the CPU from ``seed`` (the same on every device)."""

    def __init__(self, d: int, k: int, seed: int, device: torch.device | str = "cpu"):
        g = torch.Generator().manual_seed(seed)
        self.k = int(k)
        self.bucket = torch.randint(self.k, (d,), generator=g).to(device=device, dtype=torch.int32)
        self.sign = (torch.randint(2, (d,), generator=g) * 2 - 1).to(device=device, dtype=torch.float32)

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        """Project a vector ``u`` (d,) or the rows of a matrix (n, d)."""
        if u.dim() == 2:
            return torch.stack([self(r) for r in u])
        return torch.zeros(self.k, dtype=u.dtype, device=u.device).index_add_(0, self.bucket, u * self.sign)


def projection_dim(m: int, d: int, projection: int | None) -> int:
    """The projection dimension to use (0 = cluster on the exact coordinates): ``projection`` if
    given, else :data:`PROJECTION_DIM` when the exact features would exceed :data:`FEATURE_BYTES`."""
    if projection is not None:
        if projection < 0:
            raise ValueError(f"projection must be >= 0 (0 = none), got {projection}")
        return int(projection)
    return PROJECTION_DIM if m * d * 4 > FEATURE_BYTES and d > PROJECTION_DIM else 0


def first_local_models(fed: Federation, start: torch.Tensor | None = None, rnd: int = INIT_ROUND,
                       progress: str | None = None):
    """Every client's local model trained from ``start`` (default: the common initial weights) with
    round ``rnd``'s batches. ``progress``: a description for a progress bar over the clients (a
    tqdm bar on stderr, as training shows its rounds), or None for none."""
    start = fed.w0 if start is None else start
    tasks = (Task(c, start) for c in range(fed.n_clients))
    results = fed.trainer.run(tasks, rnd)
    if progress:
        from tqdm import tqdm

        results = tqdm(results, total=fed.n_clients, desc=progress, unit="client", mininterval=1.0,
                       dynamic_ncols=True)
    for task, res in results:
        yield task.client, res


def init_centres(fed: Federation, K: int, *, restarts: int = 20, distance: str = "all",
                 weighted: bool = False, method: str = "kmeans", projection: int | None = None,
                 keep_bytes: int = KEEP_BYTES, start: torch.Tensor | None = None,
                 rnd: int = INIT_ROUND, progress: bool = False,
                 models: torch.Tensor | None = None) -> Centres:
    """Initial centres from the clients' first local models (see the module docstring);
    ``projection``: None = automatic, 0 = exact coordinates, k = a k-dimensional CountSketch.
    ``start``/``rnd``: cluster the local models trained from another model than the initial weights
    (FeSEM's ``warmup``: the warm model of round ``rnd``), with that round's batches.
    ``models``: those first local models already made (m, |W|), e.g. by :func:`all_first_models`
    in a job of their own that several centre files share; nothing is trained then.
    ``progress``: a progress bar per client trained (``mcfl init-centres`` shows one) and a log line
    per step."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    m, size = fed.n_clients, fed.model.size
    if not 1 <= K <= m:
        raise ValueError(f"K={K} must be between 1 and the number of clients ({m})")
    sel = fed.model.select(distance)
    d = sel.stop - sel.start
    k = projection_dim(m, d, projection) if method == "kmeans" else 0
    sketch = CountSketch(d, k, derive_seed(fed.seed, SKETCH), fed.device) if k else None
    w0 = (fed.w0 if start is None else start)[sel]

    def features(w: torch.Tensor) -> torch.Tensor:    # projected update, or the exact coordinates
        return sketch(w[..., sel] - w0) if sketch else w[..., sel]

    if models is not None and tuple(models.shape) != (m, size):
        raise ValueError(f"first local models {tuple(models.shape)} do not fit m={m}, |W|={size}")
    keep = models is not None or m * size * 4 <= keep_bytes
    feats = np.empty((m, k or d), dtype=np.float32)
    full = models if models is not None else torch.empty(m, size, device=fed.device) if keep else None
    say = log.info if progress else log.debug
    say("first local models of %d clients (K=%d, %s%s)", m, K,
        f"{k}-dimensional projection" if k else "exact coordinates", ", given" if models is not None else "")
    made = ((c, w) for c, w in enumerate(models)) if models is not None else \
        ((c, res.weights) for c, res in first_local_models(fed, start, rnd, "first local models" if progress else None))
    for c, w in made:
        feats[c] = features(w).cpu().numpy()
        if models is None and keep:
            full[c] = w
    if method == "kmeans":
        distinct = len(np.unique(feats, axis=0))
        if distinct < K:
            raise ValueError(f"K={K} but only {distinct} distinct first local models")
        say("k-means: K=%d, %d restarts on %d x %d features", K, restarts, m, feats.shape[1])
        km = KMeans(n_clusters=K, n_init=restarts, random_state=derive_seed(fed.seed, KMEANS) % 2**31)
        # scikit-learn's OpenMP/BLAS pools default to every core; keep to the job's thread budget
        # (Snakemake runs jobs side by side: oversubscribed, 20 restarts took 18 s instead of 1.3 s)
        with threadpool_limits(limits=torch.get_num_threads()):
            labels = km.fit_predict(feats.astype(np.float64))
    elif method == "random":
        rng = np.random.default_rng(derive_seed(fed.seed, KMEANS))
        labels = rng.permutation(np.arange(m) % K)
    else:
        raise ValueError(f"unknown centre initialisation {method!r}; use 'kmeans' or 'random'")
    acc = WeightedSum(K, size, fed.device)
    if not keep:
        say("centres: first local models again (%d x %d weights do not fit in memory)", m, size)
    members = ((c, full[c]) for c in range(m)) if keep else \
        ((c, res.weights) for c, res in first_local_models(fed, start, rnd,
                                                           "centres (second pass)" if progress else None))
    for c, w in members:
        acc.add(int(labels[c]), w, float(fed.n_train[c]) if weighted else 1.0)
    centres = torch.stack([acc.mean(j) for j in range(K)])
    f = torch.from_numpy(feats).to(fed.device)
    centre_feats = features(centres)                              # (K, k or d), never (m, |W|)
    inertia = float(((f - centre_feats[torch.from_numpy(labels).to(fed.device)]) ** 2).sum())
    return Centres(centres, torch.from_numpy(labels.astype(np.int64)), inertia, k)


def all_first_models(fed: Federation, progress: bool = False) -> torch.Tensor:
    """Every client's first local model from the initial weights, as one (m, |W|) tensor: what
    :func:`init_centres` clusters, made once for centre files that differ only in K or in how they
    cluster (``mcfl first-models``; the DAG's ``first_models`` rule)."""
    full = torch.empty(fed.n_clients, fed.model.size, device=fed.device)
    for c, res in first_local_models(fed, progress="first local models" if progress else None):
        full[c] = res.weights
    return full


def save_first_models(models: torch.Tensor, path) -> None:
    """Write the first local models atomically (serialised in memory first, as :func:`save_centres`)."""
    buf = io.BytesIO()
    torch.save({"first_models": models.cpu()}, buf)
    write_bytes(path, buf.getvalue())


def load_first_models(path, fed: Federation) -> torch.Tensor:
    """The first local models :func:`save_first_models` wrote, checked against ``fed``."""
    try:
        models = torch.load(path, map_location=fed.device, weights_only=True)["first_models"]
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - torch raises several types for a file that is not one
        raise ValueError(f"{path}: not a first-models file ({type(e).__name__}); rerun the "
                         f"first_models rule") from None
    if tuple(models.shape) != (fed.n_clients, fed.model.size):
        raise ValueError(f"{path}: first local models {tuple(models.shape)} do not fit "
                         f"m={fed.n_clients}, |W|={fed.model.size}; rerun the first_models rule")
    return models.float()


def save_centres(c: Centres, path) -> None:
    """Write the centres atomically; serialised in memory first, so that a full disk is one OSError
    naming ``path`` (torch.save writing to a file reports it as a RuntimeError)."""
    buf = io.BytesIO()
    torch.save({"centres": c.centres.cpu(), "assign": c.assign.cpu(), "inertia": c.inertia,
                "projection": c.projection}, buf)
    write_bytes(path, buf.getvalue())


def load_centres(path, K: int, fed: Federation) -> Centres:
    try:
        d = torch.load(path, map_location=fed.device, weights_only=True)
        centres, assign = d["centres"], d["assign"]
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - torch raises several types for a file that is not one
        raise ValueError(f"{path}: not a centres file ({type(e).__name__}); rerun the "
                         f"init_centres rule") from None
    if centres.shape != (K, fed.model.size) or assign.shape != (fed.n_clients,):
        raise ValueError(f"{path}: centres {tuple(centres.shape)} / assignments {tuple(assign.shape)} "
                         f"do not fit K={K}, |W|={fed.model.size}, m={fed.n_clients}; "
                         f"rerun the init_centres rule")
    return Centres(centres.float(), assign.long().cpu(), float(d["inertia"]))


def initial_centres(fed: Federation, params) -> Centres:
    """The initial centres a clustered method's ``params`` ask for: the DAG's file when the run has
    one (``fed.inputs["centres"]``), else computed here. Reads FeSEM's fields ``restarts``,
    ``distance``, ``mstep`` and ``init`` where a method has them (defaults 20, all, mean, kmeans)."""
    if "centres" in fed.inputs:
        return load_centres(fed.inputs["centres"], params.K, fed)
    return init_centres(fed, params.K, **centre_options(params))
