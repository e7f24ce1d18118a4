"""CelebA's oracle domains for FedCG's sanity check (Caldarola et al. 2021, §4.2.1, Table 3).

"From the 40 attributes, we select the combination of attributes leading to the most balanced
subdivisions of the dataset and having a low correlation with the target feature ... We choose 5,
having 32 domains. The selected features are attractive, heavy makeup, high cheekbones, mouth
slightly open and wavy hair." A sample's domain is the 5-bit code of those attributes, bit b set when
attribute b is present (``list_attr_celeba.txt`` writes 1 / -1), so domain ids run 0..31 and the
Hamming distance between two ids is the number of attributes in which the domains differ (Table 3's
"H" adjacency, :func:`mcfl.models.fedcg.hamming_adjacency`).

The ``celeba`` source (LEAF's FedCelebA) stores these ids per sample (``domain_train.npy`` /
``domain_test.npy``) by calling :func:`attribute_domains` on each image's attribute row.
"""

from __future__ import annotations

import numpy as np

ATTRIBUTES = ("Attractive", "Heavy_Makeup", "High_Cheekbones", "Mouth_Slightly_Open", "Wavy_Hair")


def attribute_domains(values: np.ndarray) -> np.ndarray:
    """Domain id per row of ``values`` (N, 5): the attributes in :data:`ATTRIBUTES` order, as 1/-1
    (CelebA's file) or 1/0. Bit b of the id is attribute b."""
    v = np.asarray(values)
    if v.ndim != 2 or v.shape[1] != len(ATTRIBUTES):
        raise ValueError(f"expected an (N, {len(ATTRIBUTES)}) array of the attributes {ATTRIBUTES}, "
                         f"got shape {v.shape}")
    if not np.isin(v, (-1, 0, 1)).all():
        raise ValueError("attribute values must be 1 (present) or -1/0 (absent)")
    return ((v == 1).astype(np.int64) << np.arange(len(ATTRIBUTES))).sum(1)


def attribute_columns(header: list[str]) -> list[int]:
    """Column index of each of :data:`ATTRIBUTES` in ``list_attr_celeba.txt``'s header line."""
    missing = [a for a in ATTRIBUTES if a not in header]
    if missing:
        raise ValueError(f"list_attr_celeba.txt header lacks the attributes {missing}")
    return [header.index(a) for a in ATTRIBUTES]
