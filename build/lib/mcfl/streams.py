"""Every random stream of a run: its purpose id, in one place, and :func:`derive_seed`.

A run has one integer ``seed``; each consumer of randomness draws from its own stream,
``derive_seed(seed, PURPOSE, ...)``, so that adding a consumer never shifts another's draws, and a
client's local update does not depend on which other clients ran. Ids are unique within each of
the three namespaces below (a test checks it); a new consumer takes a new id here.
"""

from __future__ import annotations

import numpy as np

# -- top level: derive_seed(seed, PURPOSE, ...) ------------------------------------------------------
STREAM = 1_000_001          # the pre-sampled client stream, (seed, STREAM, round) (mcfl.federation)
MODEL = 1_000_002           # the initial model's weights
SERVER = 1_000_003          # server-side randomness, (seed, SERVER, round, sub-purpose) below
KMEANS = 1_000_004          # k-means initialisation of the cluster centres (mcfl.cluster.init)
SKETCH = 1_000_005          # the count sketch that projects local models before k-means
FEDCG_EXTRAS = 1_000_006    # FedCG's added parameters (residual layers, GCN)
FEDCG_ADJ = 1_000_007       # FedCG's random adjacency initialisation, (seed, FEDCG_ADJ, i)
SELECT_K = 1_000_008        # the clients sampled for K selection (FeSEM §5.2)
FIGURE_CLIENTS = 9_000_004  # clients drawn for FeSEM's Figs. 4-5 (mcfl.report.figures)
FIGURE_ROWS = 9_000_005     # test samples drawn for Fig. 5

# -- sub-purposes of SERVER: Federation.rng(round, purpose) -------------------------------------------
GSP_GROUPING = 1            # FedGSP: the clients' grouping
GSP_SAMPLING = 2            # FedGSP: the groups that train in a round

# -- local SGD: the engine's batch order, (seed, round, client, purpose) --------------------------------
LOCAL = 0                   # the round's local update
FINETUNE = 7                # local fine-tuning before evaluation (finetune_epochs)


def derive_seed(*key: int) -> int:
    """A 63-bit seed from an integer key, e.g. ``(seed, round, client, purpose)``."""
    return int(np.random.SeedSequence([int(k) for k in key]).generate_state(1, np.uint64)[0] >> 1)
