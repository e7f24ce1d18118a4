"""LEAF's sampling and splitting (``data/utils/sample.py``, ``remove_users.py``, ``split_data.py``).

LEAF works on JSON files ("shards") of users; FEMNIST has one shard per 100 writers, CelebA one
shard. Here a shard is a list of ``(user, samples)`` in file order (``samples`` is any list of sample
references) and the shards are a dict keyed by the file name LEAF would give them, because LEAF
walks each stage's directory in ``os.listdir`` order and shares one RNG across shards, so the order
in which shards are visited changes the result. LEAF's order depends on the filesystem; ours is the
order of ``sorted(os.listdir())``, i.e. sorted file names at every stage (``all_data_1.json`` comes
before ``all_data_10.json``, but ``all_data_10_niid_0.json`` before ``all_data_1_niid_0.json``).
With that order and the same seeds the output equals LEAF's, draw for draw: each function below
makes exactly the ``random.Random`` calls of the LEAF script it names (Python's RNG, not numpy's,
for that reason; seeded explicitly, never from the clock).

Stages, as ``preprocess.sh`` chains them:

* :func:`sample_niid` (``-s niid --sf f``): per shard, shuffle the users and take whole users until
  ``int(f * shard_total)`` samples; the last user is cut to the remainder (its first c samples,
  permuted);
* :func:`sample_iid` (``-s iid --sf f --iu u``): per shard, draw ``int(f * total)`` samples without
  replacement and deal them to ``max(1, round(u * users))`` new users named ``"0"``, ``"1"``, ...;
* :func:`remove_users` (``-k n``): keep users with at least n samples;
* :func:`split_by_sample` (``-t sample --tf f``): per user with n >= 2 samples,
  ``max(1, int(f * n))`` random samples train (1 when n = 2), the rest test, both in original order.
  Users with fewer samples are dropped (LEAF drops them from ``users`` but leaves empty
  ``user_data`` entries, which its reference loader turns into clients without data).

LEAF's ``-t user`` (whole users to train or test) has no counterpart: a store tests every client on
its own test split after training on its train split, which LEAF's reference models require too.
"""

from __future__ import annotations

import random
from typing import Any

Shard = list[tuple[str, list[Any]]]


def _label(x: float) -> str:
    """LEAF's file-name tag of a fraction: ``str(x)[2:]`` (0.05 -> '05', 1.0 -> '0')."""
    return str(x)[2:]


def sample_niid(shards: dict[str, Shard], fraction: float, rng: random.Random) -> dict[str, Shard]:
    out = {}
    for name in sorted(shards):
        users = list(shards[name])
        target = int(fraction * sum(len(s) for _, s in users))
        rng.shuffle(users)
        picked: Shard = []
        count = 0
        while count < target:
            user, samples = users[len(picked)]
            if count + len(samples) > target:
                c = target - count
                samples = [samples[j] for j in rng.sample(list(range(c)), c)]
            picked.append((user, samples))
            count += len(samples)
        out[f"{name[:-5]}_niid_{_label(fraction)}.json"] = picked
    return out


def iid_divide(items: list, groups: int) -> list[list]:
    """LEAF's ``iid_divide``: contiguous groups, the smaller ones (len // groups) first."""
    size, big = divmod(len(items), groups)
    small = groups - big
    cut = [size * i for i in range(small + 1)]
    cut += [cut[-1] + (size + 1) * i for i in range(1, big + 1)]
    return [items[a:b] for a, b in zip(cut, cut[1:])]


def sample_iid(shards: dict[str, Shard], fraction: float, users_fraction: float,
               rng: random.Random) -> dict[str, Shard]:
    out, named = {}, 0
    for name in sorted(shards):
        pool = [s for _, samples in shards[name] for s in samples]
        n_users = max(1, int(round(users_fraction * len(shards[name]))))
        drawn = [pool[i] for i in rng.sample(list(range(len(pool))), int(fraction * len(pool)))]
        out[f"{name[:-5]}_iid_{_label(users_fraction)}_{_label(fraction)}.json"] = [
            (str(named + i), g) for i, g in enumerate(iid_divide(drawn, n_users))]
        named += n_users
    return out


def remove_users(shards: dict[str, Shard], min_samples: int) -> dict[str, Shard]:
    return {f"{name[:-5]}_keep_{min_samples}.json": [(u, s) for u, s in shard if len(s) >= min_samples]
            for name, shard in shards.items()}


def split_by_sample(shards: dict[str, Shard], fraction: float,
                    rng: random.Random) -> list[tuple[str, list, list]]:
    """``(user, train, test)`` in LEAF's processing order; users with fewer than 2 samples dropped."""
    out = []
    for name in sorted(shards):
        for user, samples in shards[name]:
            n = len(samples)
            if n < 2:
                continue
            n_train = 1 if n == 2 else max(1, int(fraction * n))
            chosen = set(rng.sample(list(range(n)), n_train))
            out.append((user, [s for j, s in enumerate(samples) if j in chosen],
                        [s for j, s in enumerate(samples) if j not in chosen]))
    return out


SAMPLINGS = ("niid", "iid", "none")


def check_options(*, sampling: str, sf: float, iu: float, k: int, split: str, tf: float,
                  **_: Any) -> None:
    """Validate LEAF's preprocessing options before any work (clear errors for ``mcfl prepare``;
    also a LEAF source's ``check``, which config validation calls with its prepare arguments)."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {SAMPLINGS} (LEAF's -s), got {sampling!r}")
    if not 0 < sf <= 1:
        raise ValueError(f"sf (fraction of the data to sample) must be in (0, 1], got {sf}")
    if sampling == "iid" and not 0 < iu <= 1:
        raise ValueError(f"iu (iid users as a fraction of each shard's users) must be in (0, 1], got {iu}")
    if k < 0:
        raise ValueError(f"k (minimum samples per user) must be >= 0, got {k}")
    if split == "user":
        raise ValueError("split='user' (LEAF's -t user) is not supported: a store trains and tests "
                         "every client on its own data (LEAF's reference models need -t sample too); "
                         "use split='sample'")
    if split != "sample":
        raise ValueError(f"split must be 'sample' (LEAF's -t), got {split!r}")
    if not 0 < tf <= 1:
        raise ValueError(f"tf (train fraction per user) must be in (0, 1], got {tf}")


def leaf_split(shards: dict[str, Shard], *, sampling: str, sf: float, iu: float, k: int, tf: float,
               seed: int, split_seed: int) -> list[tuple[str, list, list]]:
    """LEAF's ``-s SAMPLING --sf SF [--iu IU] -k K -t sample --tf TF --smplseed SEED --spltseed
    SPLIT_SEED`` on ``shards``; returns ``(user, train, test)`` sorted by user id (the order of
    LEAF's reference loader, ``sorted(users)``)."""
    if sampling == "niid":
        shards = sample_niid(shards, sf, random.Random(seed))
    elif sampling == "iid":
        shards = sample_iid(shards, sf, iu, random.Random(seed))
    shards = remove_users(shards, k)
    rows = split_by_sample(shards, tf, random.Random(split_seed))
    users = [u for u, _, _ in rows]
    if len(set(users)) != len(users):
        dup = sorted({u for u in users if users.count(u) > 1})[:5]
        raise ValueError(f"user ids occur in more than one shard: {dup}")
    return sorted(rows, key=lambda r: r[0])
