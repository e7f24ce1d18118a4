"""``digits_domains``: sklearn's digits with domains mixed inside clients and one domain unseen in training.

A domain-shift benchmark for FedCG (Caldarola et al. 2021, §3: domains are clusters of *data*, a
client may hold several, and test data may come from a domain never seen in training). No download.

Construction (every draw from ``seed``):

1. The 1,797 8x8 images (values 0-16) are zero-padded by ``pad`` pixels on every side (default 2:
   12x12), so that rotations by angles other than multiples of 90 degrees lose no ink.
2. The images are dealt to ``clients`` clients at random, in near-equal parts (labels IID: the
   heterogeneity is the domain mix, not label skew).
3. Client i draws domain proportions p_i ~ Dirichlet(``domain_alpha``) over the seen domains
   (rotations by ``angles`` degrees counter-clockwise); each of its images draws its domain from
   p_i. Small ``domain_alpha`` = clients dominated by one domain; large = every client a mix.
4. Each client's images are split train/test by LEAF's by-sample rule (``test_fraction``).
5. Each test image is moved, with probability ``unseen_fraction``, to an unseen domain (a rotation by
   one of ``unseen`` degrees, uniformly): those domains never occur in training. With
   ``unseen_copies`` the chosen test images stay in their seen domain and a rotated copy is added
   (appended after the client's seen test images): with ``unseen_fraction`` 1 every test image is
   scored on its seen domain and on an unseen one, which gives the unseen domain as many test
   images as the seen ones (the default config: 460 instead of ~140, so that a comparison on the
   unseen domain is not decided by one or two images) and pairs them image by image.

Rotations use ``scipy.ndimage.rotate`` with bilinear interpolation (exact for multiples of 90).
Domain ids: 0..S-1 for the seen ``angles`` in the given order, S.. for the ``unseen`` angles; they are
stored per sample (``domain_train.npy``/``domain_test.npy``) with ``meta["domains"]`` naming them and
listing the unseen ids. Each client's ``cluster`` is its most frequent training domain.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mcfl.data.partition import split_train_test
from mcfl.data.store import ClientData, write_store


def rotate_images(x: np.ndarray, angle: float) -> np.ndarray:
    """Rotate (N, C, H, W) uint8 images counter-clockwise by ``angle`` degrees about their centre."""
    if angle % 360 == 0:
        return x.copy()
    from scipy.ndimage import rotate

    r = rotate(x.astype(np.float32), float(angle), axes=(2, 3), reshape=False, order=1, mode="constant")
    return np.clip(np.rint(r), 0, 255).astype(x.dtype)


def make_digits_domains(out: str | Path, *, clients: int = 20, angles: tuple = (0, 60, 120),
                        unseen: tuple = (90,), domain_alpha: float = 0.5, unseen_fraction: float = 0.3,
                        test_fraction: float = 0.25, pad: int = 2, unseen_copies: bool = False,
                        seed: int = 0) -> Path:
    from sklearn.datasets import load_digits

    angles = [float(a) for a in angles]
    unseen = [float(a) for a in unseen]
    if not angles:
        raise ValueError("angles: at least one seen domain (rotation angle) is needed")
    if len(set(angles + unseen)) != len(angles) + len(unseen):
        raise ValueError(f"angles {angles} and unseen {unseen} must all be distinct")
    if not 0 <= unseen_fraction <= 1 or (unseen_fraction > 0 and not unseen):
        raise ValueError(f"unseen_fraction must be in [0, 1] (and needs unseen angles), got {unseen_fraction}")
    if domain_alpha <= 0 or pad < 0:
        raise ValueError(f"domain_alpha must be > 0 and pad >= 0 (got {domain_alpha}, {pad})")
    bunch = load_digits()
    x = np.pad(bunch.images.astype(np.uint8)[:, None], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = bunch.target.astype(np.int64)
    if not 1 <= clients <= len(y) // 4:
        raise ValueError(f"clients must be between 1 and {len(y) // 4}, got {clients}")
    all_angles = angles + unseen
    rng = np.random.default_rng(seed)
    parts = np.array_split(rng.permutation(len(y)), clients)
    data = []
    for i, idx in enumerate(parts):
        idx = np.sort(idx)
        p = rng.dirichlet(np.full(len(angles), domain_alpha))
        dom = rng.choice(len(angles), size=len(idx), p=p)
        tr, te = split_train_test(len(idx), test_fraction, rng)
        dom_te = dom[te].copy()
        move = rng.random(len(te)) < unseen_fraction
        target = len(angles) + rng.integers(0, len(unseen), int(move.sum())) if unseen else np.zeros(0, int)
        if unseen_copies:
            te, dom_te = np.concatenate([te, te[move]]), np.concatenate([dom_te, target])
        elif unseen:
            dom_te[move] = target
        xs = {}
        for split, rows, d in (("train", tr, dom[tr]), ("test", te, dom_te)):
            xi = x[idx[rows]]
            for k in np.unique(d):
                xi[d == k] = rotate_images(xi[d == k], all_angles[k])
            xs[split] = xi
        data.append(ClientData(f"c{i:04d}", xs["train"], y[idx[tr]], xs["test"], y[idx[te]],
                               cluster=int(np.bincount(dom[tr], minlength=len(angles)).argmax()),
                               domain_train=dom[tr], domain_test=dom_te))
    names = [f"rot{a:g}" for a in all_angles]
    params = dict(clients=clients, angles=[float(a) for a in angles], unseen=unseen,
                  domain_alpha=domain_alpha, unseen_fraction=unseen_fraction,
                  test_fraction=test_fraction, pad=pad, seed=seed)
    if unseen_copies:                   # only when set: stores made before the option keep their hash
        params["unseen_copies"] = True
    return write_store(out, data, n_classes=10, source="digits_domains", params=params, x_scale=1 / 16,
                       domains={"names": names, "unseen": list(range(len(angles), len(all_angles)))})
