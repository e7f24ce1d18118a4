import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score

from mcfl.metrics import clustering_scores, per_client_scores, summarize


def test_per_client_f1_and_accuracy_equal_sklearn():
    rng = np.random.default_rng(0)
    n, m, c = 600, 7, 5
    client = rng.integers(0, m, n)
    y = rng.integers(0, c, n)
    p = np.where(rng.random(n) < 0.6, y, rng.integers(0, c, n))
    s = per_client_scores(client, y, p, m, c)
    for i in range(m):
        sel = client == i
        assert s["acc"][i] == pytest.approx(accuracy_score(y[sel], p[sel]))
        assert s["f1"][i] == pytest.approx(f1_score(y[sel], p[sel], average="macro"))


def test_micro_and_macro_by_hand():
    # client 0: 3 samples, 3 correct; client 1: 1 sample, wrong; client 2: no test samples
    s = per_client_scores([0, 0, 0, 1], [0, 1, 1, 2], [0, 1, 1, 0], 3, 3)
    out = summarize(s)
    assert out["micro_acc"] == pytest.approx(3 / 4)
    assert out["macro_acc"] == pytest.approx((1 + 0) / 2)
    assert out["macro_f1"] == pytest.approx((1 + 0) / 2)
    assert out["micro_f1"] == pytest.approx(3 / 4)


def test_clustering_scores_are_label_permutation_invariant():
    truth = np.array([0, 0, 1, 1, 2, 2])
    assert clustering_scores(np.array([2, 2, 0, 0, 1, 1]), truth)["ari"] == pytest.approx(1.0)
    assert clustering_scores(np.array([0, 1, 0, 1, 0, 1]), truth)["ari"] < 0.1
    assert clustering_scores(np.array([0, 1]), None) == {}


def test_paired_counts_and_sign_test_by_hand():
    from mcfl.metrics import paired_counts, sign_test_p

    a = [1, 1, 1, 0, 0, 1]          # only a right: samples 1, 2; only b right: sample 3
    b = [1, 0, 0, 1, 0, 1]
    assert paired_counts(a, b) == (2, 1) and paired_counts(b, a) == (1, 2)
    assert sign_test_p(2, 1) == pytest.approx(1.0)                  # 2 * P(X >= 2 | 3) = 2 * 4/8
    assert sign_test_p(6, 0) == pytest.approx(2 / 64)               # 2 * (1/2)^6
    assert sign_test_p(0, 0) == 1.0


def test_ari_and_nmi_equal_sklearn_bitwise():
    """mcfl's own ARI and NMI (training jobs do not import scikit-learn) are scikit-learn's floats,
    bit for bit, on random and on degenerate assignments."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from mcfl.metrics import adjusted_rand_score as ari, normalized_mutual_info_score as nmi

    rng = np.random.default_rng(0)
    cases = [([], []), ([0], [0]), ([0, 0, 0], [1, 1, 1]), ([0, 0, 1, 1], [0, 1, 0, 1]),
             ([0, 0, 0, 0], [0, 1, 2, 3]), ([0, 1, 2, 3], [0, 0, 0, 0]), ([0, 0, 1, 2], [5, 5, 7, 7]),
             ([3, 3, 1, 1], [1, 1, 0, 0])]
    for m in (2, 5, 17, 100, 1000, 3550):
        for k_true, k_pred in ((1, 4), (4, 1), (2, 2), (4, 3), (10, 62), (62, 10)):
            t = rng.integers(0, k_true, m)
            cases.append((t, rng.integers(0, k_pred, m)))
            cases.append((t, np.where(rng.random(m) < 0.7, t, rng.integers(0, k_pred, m))))
    for t, p in cases:
        t, p = np.asarray(t, dtype=np.int64), np.asarray(p, dtype=np.int64)
        assert ari(t, p) == float(adjusted_rand_score(t, p)), (t, p)
        assert nmi(t, p) == float(normalized_mutual_info_score(t, p)), (t, p)
        assert clustering_scores(p, t) == {"ari": float(adjusted_rand_score(t, p)),
                                           "nmi": float(normalized_mutual_info_score(t, p))}
