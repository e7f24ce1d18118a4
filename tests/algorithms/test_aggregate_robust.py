"""Server maths of the baselines: trimmed mean, trimmed K-means, cosine similarity, bipartition."""

import itertools

import numpy as np
import pytest
import scipy.stats
import torch

from mcfl.aggregate import bipartition, cosine_similarities, trimmed_kmeans, trimmed_mean


def test_trimmed_mean_by_hand_and_against_scipy():
    x = torch.tensor([[1.0, 10.0], [2.0, -5.0], [3.0, 0.0], [4.0, 1.0], [100.0, 2.0]])
    # beta 0.2 of 5 rows drops one value from each end, per coordinate
    assert torch.allclose(trimmed_mean(x, 0.2), torch.tensor([3.0, 1.0]))
    assert torch.allclose(trimmed_mean(x, 0.0), x.mean(0))
    rng = np.random.default_rng(0)
    for n, beta in itertools.product((1, 2, 5, 8, 11), (0.0, 0.1, 0.2, 0.3, 0.45)):
        a = rng.normal(size=(n, 7)).astype(np.float32)
        expect = scipy.stats.trim_mean(a, beta, axis=0)
        assert np.allclose(trimmed_mean(torch.from_numpy(a), beta).numpy(), expect, atol=1e-6), (n, beta)


@pytest.mark.parametrize("n", [3, 5, 10, 17, 33])
def test_trimmed_mean_blocks_and_sorting_network_equal_a_full_sort(n):
    """The blocked min/max network (n <= 32) and the blocked sort (n > 32) give exactly the values
    of one torch.sort over all columns, ties included, whatever the block size."""
    x = torch.from_numpy(np.random.default_rng(n).integers(-3, 4, size=(n, 101)).astype(np.float32))
    for beta in (0.1, 0.2, 0.4, 0.5):
        g = min(int(beta * n), (n - 1) // 2)
        expect = torch.sort(x, dim=0).values[g:n - g].mean(0)
        for block in (7, 64, 1 << 15):
            assert torch.equal(trimmed_mean(x, beta, block=block), expect), (beta, block)
        pad = torch.cat([x[:2] + 100, x, x[:1] - 100])       # rows= picks x out of a larger matrix
        mask = torch.zeros(len(pad), dtype=torch.bool)
        mask[2:2 + n] = True
        assert torch.equal(trimmed_mean(pad, beta, block=64, rows=mask), expect), beta
        assert torch.equal(trimmed_mean(pad, beta, rows=torch.arange(2, 2 + n)), expect), beta


@pytest.mark.parametrize("n", [1, 2, 5, 6])
def test_trim_one_half_is_the_median(n):
    a = np.random.default_rng(n).normal(size=(n, 4)).astype(np.float32)
    assert np.allclose(trimmed_mean(torch.from_numpy(a), 0.5).numpy(), np.median(a, axis=0), atol=1e-6)


def test_trimmed_mean_rejects_bad_fraction():
    with pytest.raises(ValueError, match="trim fraction"):
        trimmed_mean(torch.zeros(3, 2), 0.6)


def test_trimmed_kmeans_ignores_an_outlier_that_drags_plain_kmeans():
    a = torch.tensor([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [0.05, 0.05]])
    b = a + 10.0
    x = torch.cat([a, b, torch.tensor([[1e6, 1e6]])])          # the last point is a huge outlier
    start = torch.tensor([[1.0, 1.0], [9.0, 9.0]])
    labels, centres = trimmed_kmeans(x, start, beta=0.2, iters=5)
    assert labels[:5].tolist() == [0] * 5 and labels[5:10].tolist() == [1] * 5
    # the outlier joins cluster 1 (6 members, one trimmed per end) and is cut away
    assert torch.allclose(centres[0], trimmed_mean(a, 0.2))
    assert centres[1].max() < 11
    _, plain = trimmed_kmeans(x, start, beta=0.0, iters=5)
    assert plain.max() > 1e4                                     # the mean is dragged away


def test_cosine_similarities_by_hand():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    s = cosine_similarities(x)
    r = 1 / np.sqrt(2)
    expect = [[1, 0, -1, r, 0], [0, 1, 0, r, 0], [-1, 0, 1, -r, 0], [r, r, -r, 1, 0], [0, 0, 0, 0, 1]]
    assert torch.allclose(s, torch.tensor(expect, dtype=torch.float32), atol=1e-6)


def _max_cross(s, labels):
    return s[np.ix_(labels == 0, labels == 1)].max()


def test_single_linkage_bipartition_is_the_optimal_bipartition():
    """Sattler et al.: the split minimising the largest cross-group similarity (brute force)."""
    rng = np.random.default_rng(3)
    for trial in range(5):
        v = rng.normal(size=(7, 4))
        s = cosine_similarities(torch.from_numpy(v)).numpy()
        labels = bipartition(s, "single")
        best = min(_max_cross(s, np.array(lab)) for lab in itertools.product((0, 1), repeat=7)
                   if 0 < sum(lab) < 7)
        assert _max_cross(s, labels) == pytest.approx(best), trial


@pytest.mark.parametrize("linkage", ["single", "complete"])
def test_bipartition_separates_two_opposed_groups(linkage):
    rng = np.random.default_rng(1)
    u = rng.normal(size=8)
    v = np.concatenate([u + 0.1 * rng.normal(size=(4, 8)), -u + 0.1 * rng.normal(size=(3, 8))])
    labels = bipartition(cosine_similarities(torch.from_numpy(v)).numpy(), linkage)
    assert len(set(labels[:4])) == 1 and len(set(labels[4:])) == 1 and labels[0] != labels[4]
