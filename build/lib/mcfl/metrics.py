"""Evaluation metrics, defined once.

Every client is tested on its own test split with its own model (see each algorithm's
``eval_models``). Per client i with n_i test samples:

* ``acc_i``  = fraction of its test samples classified correctly;
* ``f1_i``   = scikit-learn's ``f1_score(y_true_i, y_pred_i, average="macro")``: the unweighted mean
  over the labels that occur in the client's true *or* predicted labels of 2·TP / (2·TP + FP + FN).

Then, as in FeSEM §6.1 ("micro" weights devices by data amount, "macro" does not):

* ``micro_acc`` = sum_i n_i·acc_i / sum_i n_i   (= accuracy pooled over all test samples)
* ``macro_acc`` = mean_i acc_i
* ``micro_f1``  = sum_i n_i·f1_i / sum_i n_i
* ``macro_f1``  = mean_i f1_i

Clients without test samples are left out of all four. ``ari``/``nmi`` compare a clustered method's
client-to-cluster assignment with the true clusters (scikit-learn's ``adjusted_rand_score`` and
``normalized_mutual_info_score``). The F1 computation is vectorised over clients (one ``bincount``)
and tested for equality with scikit-learn's per-client ``f1_score``.

Stores that label every test sample with a domain (FedCG's setting) also get ``acc_dom<d>``, the
accuracy over the test samples of domain d, and ``acc_seen``/``acc_unseen``, the accuracy over the
samples of the domains that do/do not occur in training.

Two classifiers scored on the same test samples are compared by ``paired_counts`` (the samples only
one of them gets right) and ``sign_test_p`` on those counts (McNemar's exact test).
"""

from __future__ import annotations

import numpy as np


def per_client_scores(client: np.ndarray, y_true: np.ndarray, y_pred: np.ndarray, n_clients: int,
                      n_classes: int) -> dict[str, np.ndarray]:
    """Per-client test count, accuracy and macro-F1 from flat (client, y_true, y_pred) arrays."""
    client, y_true, y_pred = (np.asarray(a, dtype=np.int64) for a in (client, y_true, y_pred))
    n = np.bincount(client, minlength=n_clients)
    hit = y_true == y_pred
    correct = np.bincount(client, weights=hit, minlength=n_clients)
    size = n_clients * n_classes
    tp = np.bincount(client[hit] * n_classes + y_true[hit], minlength=size).reshape(n_clients, n_classes)
    true = np.bincount(client * n_classes + y_true, minlength=size).reshape(n_clients, n_classes)
    pred = np.bincount(client * n_classes + y_pred, minlength=size).reshape(n_clients, n_classes)
    present = (true + pred) > 0
    f1_per_label = np.divide(2.0 * tp, true + pred, out=np.zeros(tp.shape), where=present)
    n_labels = present.sum(1)
    f1 = np.divide(f1_per_label.sum(1), n_labels, out=np.zeros(n_clients), where=n_labels > 0)
    acc = np.divide(correct, n, out=np.zeros(n_clients), where=n > 0)
    return {"n": n, "acc": acc, "f1": f1}


def summarize(scores: dict[str, np.ndarray]) -> dict[str, float]:
    """Micro/macro accuracy and F1 (as fractions) over clients that have test samples."""
    n = scores["n"].astype(float)
    has = n > 0
    if not has.any():
        raise ValueError("no client has test samples; nothing to evaluate")
    w = n[has] / n[has].sum()
    return {
        "micro_acc": float((w * scores["acc"][has]).sum()),
        "macro_acc": float(scores["acc"][has].mean()),
        "micro_f1": float((w * scores["f1"][has]).sum()),
        "macro_f1": float(scores["f1"][has].mean()),
    }


def clustering_scores(assign: np.ndarray, truth: np.ndarray | None) -> dict[str, float]:
    """ARI and NMI of an assignment against the true clusters (empty when there is no truth)."""
    if truth is None or assign is None:
        return {}
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    return {"ari": float(adjusted_rand_score(truth, assign)),
            "nmi": float(normalized_mutual_info_score(truth, assign))}


def domain_scores(domain: np.ndarray, hit: np.ndarray, unseen=()) -> dict[str, float]:
    """Accuracy per test domain (``acc_dom<d>``) and over the seen / unseen domains, from each test
    sample's domain id and whether it was classified correctly."""
    domain, hit = np.asarray(domain), np.asarray(hit, dtype=float)
    out = {f"acc_dom{int(d)}": float(hit[domain == d].mean()) for d in np.unique(domain)}
    new = np.isin(domain, np.asarray(list(unseen), dtype=domain.dtype))
    if new.any():
        out["acc_unseen"] = float(hit[new].mean())
        if (~new).any():
            out["acc_seen"] = float(hit[~new].mean())
    return out


def paired_counts(hit_a: np.ndarray, hit_b: np.ndarray) -> tuple[int, int]:
    """The samples only ``a`` and only ``b`` classifies correctly, from both per-sample hits."""
    a, b = np.asarray(hit_a, dtype=bool), np.asarray(hit_b, dtype=bool)
    return int((a & ~b).sum()), int((b & ~a).sum())


def sign_test_p(only_a: int, only_b: int) -> float:
    """Exact two-sided sign test of the discordant counts (1.0 when there are none)."""
    from scipy.stats import binomtest

    n = int(only_a) + int(only_b)
    return float(binomtest(int(only_a), n, 0.5).pvalue) if n else 1.0
