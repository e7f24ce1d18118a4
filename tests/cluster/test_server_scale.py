"""Server-side pieces that keep FeSEM's memory O(K·|W|): the E-step distances computed in blocks,
and the k-means initialisation's random projection (CountSketch JL transform): its definition by
hand, unbiased squared norms with the JL spread, when it is used, and that clustering on it finds
the exact partition (hence the exact centres) on digits."""

import numpy as np
import pytest
import torch

from mcfl.aggregate import sq_distances
from mcfl.cluster import init as cinit
from mcfl.cluster.init import CountSketch, init_centres, projection_dim
from mcfl.data import load
from mcfl.federation import build_federation


def test_blocked_sq_distances_equal_the_direct_formula():
    g = torch.Generator().manual_seed(0)
    centres, w = torch.randn(3, 1000, generator=g), torch.randn(1000, generator=g)
    sel = slice(10, 990)
    exact = ((centres[:, sel].double() - w[sel].double()) ** 2).sum(1)
    for block in (7, 300, 1 << 20):                      # ragged last block, several, one
        d = sq_distances(w, centres, sel, block=block)
        assert d.dtype == torch.float32 and torch.allclose(d.double(), exact, rtol=1e-6)
    W = torch.randn(4, 1000, generator=g)                # rows: one (n, K) matrix
    exact = ((W[:, None, sel].double() - centres[None, :, sel].double()) ** 2).sum(2)
    for block in (7, 300, 1 << 20):
        d = sq_distances(W, centres, sel, block=block)
        assert d.shape == (4, 3) and torch.allclose(d.double(), exact, rtol=1e-6)
        assert torch.allclose(d[2], sq_distances(W[2], centres, sel, block=block), rtol=1e-6)


def test_countsketch_by_hand():
    cs = CountSketch(5, 3, seed=0)
    cs.bucket = torch.tensor([0, 2, 0, 1, 2], dtype=torch.int32)
    cs.sign = torch.tensor([1.0, -1, -1, 1, 1])
    u = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    # bucket 0: +1·1 - 1·3, bucket 1: +1·4, bucket 2: -1·2 + 1·5
    assert torch.equal(cs(u), torch.tensor([-2.0, 4.0, 3.0]))
    assert torch.equal(cs(torch.stack([u, 2 * u])), torch.stack([cs(u), 2 * cs(u)]))   # rows, linear


def test_countsketch_squared_norms_are_unbiased_with_jl_spread():
    d, k = 4000, 256
    u = torch.from_numpy(np.random.default_rng(0).normal(size=d).astype(np.float32))
    ratios = np.array([float(CountSketch(d, k, seed=s)(u).square().sum() / u.square().sum())
                       for s in range(300)])
    assert abs(ratios.mean() - 1) < 0.02                   # E||Su||^2 = ||u||^2 (s.e. ~0.005)
    assert 0.75 < ratios.std() / np.sqrt(2 / k) < 1.25      # spread of a Gaussian JL map
    a, b = CountSketch(d, k, seed=1), CountSketch(d, k, seed=1)
    assert torch.equal(a.bucket, b.bucket) and torch.equal(a.sign, b.sign)   # seeded


def test_projection_is_used_only_when_the_exact_features_are_too_big():
    assert projection_dim(100, 13_706, None) == 0                       # digits: 5 MB, exact
    assert projection_dim(3550, 6_603_710, None) == cinit.PROJECTION_DIM   # FEMNIST: 94 GB
    assert projection_dim(3550, 6_603_710, 0) == 0                      # forced exact
    assert projection_dim(10, 100, 64) == 64                            # forced projection
    with pytest.raises(ValueError, match="projection must be >= 0"):
        projection_dim(10, 100, -1)


def test_projected_kmeans_finds_the_exact_partition_and_centres(digits_store):
    fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                           {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 1}, seed=0)
    exact = init_centres(fed, 4, restarts=5)                           # automatic: exact here
    proj = init_centres(fed, 4, restarts=5, projection=1024)
    assert (exact.projection, proj.projection) == (0, 1024)
    assert torch.equal(exact.assign, proj.assign)
    # centres are means of the members' full models, whatever space the partition was found in
    assert torch.allclose(exact.centres, proj.centres, atol=1e-6)
    assert proj.inertia == pytest.approx(exact.inertia, rel=0.1)       # ~ ||.||^2 preserved


def test_fesem_init_projection_is_validated():
    from mcfl.algorithms.fesem import Params

    assert Params(init_projection=512).init_projection == 512
    with pytest.raises(ValueError, match="init_projection"):
        Params(init_projection=-3)


def test_nofed_refuses_to_start_when_its_m_models_do_not_fit(digits_store, monkeypatch):
    from mcfl.algorithms import nofed

    fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                           {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 1}, seed=0)
    need = fed.n_clients * fed.model.size * 4
    monkeypatch.setattr(nofed, "available_memory", lambda device: need - 1)
    with pytest.raises(MemoryError, match=r"NoFed keeps one model per client: 16 x"):
        nofed.NoFed(fed, nofed.NoFed.Params()).init()
    monkeypatch.setattr(nofed, "available_memory", lambda device: need)
    state = nofed.NoFed(fed, nofed.NoFed.Params()).init()
    assert state.local.shape == (16, fed.model.size)
