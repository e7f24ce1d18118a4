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
``invert`` lists domains (indices into ``angles`` + ``unseen``) whose images are also inverted in
intensity after the rotation (16 - x, a bright background): a shift in low-level statistics, the
kind that domain-specific layers address (FedBN's feature shift), where a rotation by a small
angle is one that a shared CNN absorbs. A domain is then its (angle, inverted) pair, so
``angles: [0, 0, 90], invert: [1]`` has the domains rot0, inv-rot0 and rot90.
Domain ids: 0..S-1 for the seen ``angles`` in the given order, S.. for the ``unseen`` angles; they are
stored per sample (``domain_train.npy``/``domain_test.npy``) with ``meta["domains"]`` naming them and
listing the unseen ids. Each client's ``cluster`` is its most frequent training domain.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mcfl.data.partition import split_train_test
from mcfl.data.store import ClientData
from mcfl.data.write import write_store


def transform_images(x: np.ndarray, angle: float, inverted: bool = False) -> np.ndarray:
    """One domain's images: rotated by ``angle``, then (``inverted``) 16 - x."""
    r = rotate_images(x, angle)
    return (16 - r).astype(x.dtype) if inverted else r


def rotate_images(x: np.ndarray, angle: float) -> np.ndarray:
    """Rotate (N, C, H, W) uint8 images counter-clockwise by ``angle`` degrees about their centre."""
    if angle % 360 == 0:
        return x.copy()
    from scipy.ndimage import rotate

    r = rotate(x.astype(np.float32), float(angle), axes=(2, 3), reshape=False, order=1, mode="constant")
    return np.clip(np.rint(r), 0, 255).astype(x.dtype)


N_IMAGES = 1797        # sklearn's digits


def check_options(*, clients: int = 20, angles: tuple = (0, 60, 120), unseen: tuple = (90,),
                  domain_alpha: float = 0.5, unseen_fraction: float = 0.3, pad: int = 2,
                  invert: tuple = (), **_) -> list[tuple[float, bool]]:
    """The options' rules (config validation calls this before any work): the domains as
    (angle, inverted) pairs, seen first, or a ValueError naming the option."""
    angles, unseen = [float(a) for a in angles], [float(a) for a in unseen]
    if not angles:
        raise ValueError("angles: at least one seen domain (rotation angle) is needed")
    all_angles = angles + unseen
    invert = {int(i) for i in invert}
    if any(not 0 <= i < len(all_angles) for i in invert):
        raise ValueError(f"invert {sorted(invert)}: indices into angles + unseen, "
                         f"0..{len(all_angles) - 1}")
    doms = [(a, i in invert) for i, a in enumerate(all_angles)]
    if len(set(doms)) != len(doms):
        raise ValueError(f"angles {angles} and unseen {unseen} (with invert {sorted(invert)}) must "
                         f"all be distinct")
    if not 0 <= unseen_fraction <= 1 or (unseen_fraction > 0 and not unseen):
        raise ValueError(f"unseen_fraction must be in [0, 1] (and needs unseen angles), got {unseen_fraction}")
    if domain_alpha <= 0 or pad < 0:
        raise ValueError(f"domain_alpha must be > 0 and pad >= 0 (got {domain_alpha}, {pad})")
    if not 1 <= clients <= N_IMAGES // 4:
        raise ValueError(f"clients must be between 1 and {N_IMAGES // 4}, got {clients}")
    return doms


def make_digits_domains(out: str | Path, *, clients: int = 20, angles: tuple = (0, 60, 120),
                        unseen: tuple = (90,), domain_alpha: float = 0.5, unseen_fraction: float = 0.3,
                        test_fraction: float = 0.25, pad: int = 2, unseen_copies: bool = False,
                        invert: tuple = (), seed: int = 0) -> Path:
    from sklearn.datasets import load_digits

    doms = check_options(clients=clients, angles=angles, unseen=unseen, domain_alpha=domain_alpha,
                         unseen_fraction=unseen_fraction, pad=pad, invert=invert)
    angles = [float(a) for a in angles]
    unseen = [float(a) for a in unseen]
    invert = sorted({int(i) for i in invert})
    bunch = load_digits()
    x = np.pad(bunch.images.astype(np.uint8)[:, None], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = bunch.target.astype(np.int64)
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
                xi[d == k] = transform_images(xi[d == k], *doms[k])
            xs[split] = xi
        data.append(ClientData(f"c{i:04d}", xs["train"], y[idx[tr]], xs["test"], y[idx[te]],
                               cluster=int(np.bincount(dom[tr], minlength=len(angles)).argmax()),
                               domain_train=dom[tr], domain_test=dom_te))
    names = [("inv-" if inv else "") + f"rot{a:g}" for a, inv in doms]
    params = dict(clients=clients, angles=[float(a) for a in angles], unseen=unseen,
                  domain_alpha=domain_alpha, unseen_fraction=unseen_fraction,
                  test_fraction=test_fraction, pad=pad, seed=seed)
    if unseen_copies:                   # only when set: stores made before the option keep their hash
        params["unseen_copies"] = True
    if invert:
        params["invert"] = invert
    return write_store(out, data, n_classes=10, source="digits_domains", params=params, x_scale=1 / 16,
                       domains={"names": names, "unseen": list(range(len(angles), len(doms)))})


make_digits_domains.check = check_options      # config validation, before any work
