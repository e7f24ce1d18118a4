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
