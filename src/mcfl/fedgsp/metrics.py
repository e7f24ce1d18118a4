"""FedGSP's evaluation metrics (Zeng et al., DASFAA 2022, §4.1): class probability distance (CPD,
Eq. 14), the computation and communication cost models (Eqs. 15-17) and rounds to a target accuracy.

CPD. Two groups' normalised class distributions P = norm(V_m1), Q = norm(V_m2) are distributions
over the F classes; CPD is the squared maximum mean discrepancy between them with a Gaussian RBF
kernel (Gretton et al. 2012), Eq. 14:

    CPD = E_{x,x'~P} k(x,x') - 2 E_{x~P,y~Q} k(x,y) + E_{y,y'~Q} k(y,y') = (p - q)^T Kmat (p - q),

with classes embedded as one-hot vectors e_i (classes have no order) and
k(e_i, e_j) = exp(-||e_i - e_j||^2 / (2 sigma^2)), i.e. 1 on the diagonal and exp(-1/sigma^2) off it.
In closed form CPD = (1 - exp(-1/sigma^2)) ||p - q||^2, so sigma only scales it; ratios between
groupings (the paper's "-41% vs NaiveGSP") do not depend on it.

Cost models, with the paper's constants as defaults (a Snapdragon 835 phone for computation, an AWS
EC2 link for communication, the 6.3M-parameter FEMNIST CNN):

    T_comp(R) = sum_r [ N_calc/T_FLOPS · n e K / min(K, f(r)) + N_aggr/T_FLOPS · (kappa f(r) - 1) ]  (15)
    T_comm(R) = 8 kappa K M R (1/R_in + 1/R_out)                                                  (16)
    D_comm(R) = 2 kappa K M R                                                                     (17)

n is the mean number of training samples per client, e the local epochs, M the model size in bytes.
For a run, f(r) is the number of groups actually formed in round r and kappa·f(r) the number of
groups trained, so kappa may change with r; Eqs. 16-17 are then summed over rounds. A FedAvg-style
method is the case f(r) = K (every client its own group) with kappa = clients per round / K.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

# CPD is computed beside the ICG grouping, which FedGSP's algorithm uses too (re-exported here)
from mcfl.cluster.icg import class_counts, cpd, group_counts, pairwise_cpd  # noqa: F401


# ----------------------------------------------------------------------------------- cost models
@dataclass(frozen=True)
class CostModel:
    """Constants of Eqs. 15-17 (paper values)."""

    n_calc: float = 96e6          # FLOPs per training sample
    n_aggr: float = 6.3e6         # FLOPs per aggregation of two models
    flops: float = 567e9          # device throughput, FLOP/s
    model_mb: float = 25.2        # model size M, MB
    rate_in: float = 567.0        # inbound rate, Mbit/s
    rate_out: float = 567.0       # outbound rate, Mbit/s


def cost_model(given: dict) -> CostModel:
    """A :class:`CostModel` from ``--cost``'s constants, each a known key and a positive finite
    number; else a one-line ValueError naming the flag and the key."""
    known = [f.name for f in dataclasses.fields(CostModel)]
    for key, value in given.items():
        if key not in known:
            raise ValueError(f"--cost: unknown constant {key!r}; known: {', '.join(known)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"--cost: {key}: {value!r:.40} is not allowed: a positive finite number")
    return CostModel(**{k: float(v) for k, v in given.items()})


def t_comp(f: np.ndarray, kappa: np.ndarray | float, K: int, n: float, e: float,
           c: CostModel = CostModel()) -> float:
    """Eq. 15 over rounds 1..len(f): seconds of computation."""
    f = np.asarray(f, dtype=np.float64)
    kappa = np.broadcast_to(np.asarray(kappa, dtype=np.float64), f.shape)
    local = c.n_calc / c.flops * n * e * K / np.minimum(K, f)
    aggr = c.n_aggr / c.flops * (kappa * f - 1.0)
    return float((local + aggr).sum())


def t_comm(kappa: np.ndarray | float, K: int, rounds: int, c: CostModel = CostModel()) -> float:
    """Eq. 16: seconds of communication over ``rounds`` rounds (kappa per round or constant)."""
    k = np.broadcast_to(np.asarray(kappa, dtype=np.float64), (rounds,))
    return float(8.0 * K * c.model_mb * k.sum() * (1.0 / c.rate_in + 1.0 / c.rate_out))


def d_comm(kappa: np.ndarray | float, K: int, rounds: int, c: CostModel = CostModel()) -> float:
    """Eq. 17: bytes transferred over ``rounds`` rounds."""
    k = np.broadcast_to(np.asarray(kappa, dtype=np.float64), (rounds,))
    return float(2.0 * K * c.model_mb * 1e6 * k.sum())


def run_cost(groups: np.ndarray, trained_groups: np.ndarray, K: int, n: float, e: float,
             c: CostModel = CostModel()) -> dict[str, float]:
    """Eqs. 15-17 for a run's first R rounds, from per-round groups formed f(r) and groups trained
    kappa·f(r) (FedAvg-style: f(r) = K and kappa·f(r) = clients per round)."""
    f = np.asarray(groups, dtype=np.float64)
    kappa = np.asarray(trained_groups, dtype=np.float64) / f
    R = len(f)
    return {"t_comp_s": t_comp(f, kappa, K, n, e, c), "t_comm_s": t_comm(kappa, K, R, c),
            "d_comm_bytes": d_comm(kappa, K, R, c)}


# ------------------------------------------------------------------------------ rounds to target
def rounds_to_target(rounds: np.ndarray, acc: np.ndarray, target: float) -> int | None:
    """First evaluated round whose accuracy is at least ``target`` (None if never)."""
    rounds, acc = np.asarray(rounds), np.asarray(acc, dtype=np.float64)
    ok = np.flatnonzero(acc >= target)
    return int(rounds[ok[0]]) if len(ok) else None
