"""Model zoo. ``build(name, input_shape, n_classes, **kw)`` returns an ``nn.Module``.

- ``femnist_cnn``: LEAF FEMNIST CNN (``models/femnist/cnn.py``): conv5x5 32 'same' -> ReLU -> maxpool 2
  -> conv5x5 64 'same' -> ReLU -> maxpool 2 -> dense ``hidden`` -> ReLU -> dense 62. LEAF and the
  FeSEM paper use ``hidden=2048`` (6.6M parameters); the FeSEM authors' code used 248.
- ``celeba_cnn``: LEAF CelebA CNN: 4 x [conv3x3 32 'same', BatchNorm, maxpool 2 'same', ReLU] -> dense 2
  on 6*6*32 = 1152 features (input 3x84x84).
- ``logreg``: multinomial logistic regression (LEAF synthetic; LEAF's sigmoid-before-softmax quirk is
  not reproduced: this is the plain model its data generator assumes).
- ``digits_cnn``: a small CNN for 8x8 digits: conv3x3 16 -> ReLU -> pool -> conv3x3 32 -> ReLU -> pool
  -> dense 64 -> ReLU -> dense classes.

The FEMNIST and digits CNNs pool with :class:`mcfl.models.pool.MaxPool2d`: ``nn.MaxPool2d`` bit for
bit, several times faster on a CPU for the stacked clients of the batched executor, and convolve with
:class:`mcfl.models.conv.Conv2d`: ``nn.Conv2d`` with a choice of form for the stacked clients.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from mcfl.models.conv import Conv2d
from mcfl.models.pool import MaxPool2d


def femnist_cnn(input_shape, n_classes: int, hidden: int = 2048) -> nn.Module:
    c, h, w = input_shape
    return nn.Sequential(
        Conv2d(c, 32, 5, padding=2), nn.ReLU(), MaxPool2d(2),
        Conv2d(32, 64, 5, padding=2), nn.ReLU(), MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), hidden), nn.ReLU(),
        nn.Linear(hidden, n_classes),
    )


def celeba_cnn(input_shape, n_classes: int, channels: int = 32, blocks: int = 4) -> nn.Module:
    layers: list[nn.Module] = []
    c, h, w = input_shape
    for _ in range(blocks):
        layers += [nn.Conv2d(c, channels, 3, padding=1), nn.BatchNorm2d(channels),
                   nn.MaxPool2d(2, ceil_mode=True), nn.ReLU()]
        c, h, w = channels, -(-h // 2), -(-w // 2)
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(c * h * w, n_classes))


def logreg(input_shape, n_classes: int) -> nn.Module:
    dim = 1
    for s in input_shape:
        dim *= s
    return nn.Sequential(nn.Flatten(), nn.Linear(dim, n_classes))


def digits_cnn(input_shape, n_classes: int, hidden: int = 64) -> nn.Module:
    c, h, w = input_shape
    return nn.Sequential(
        Conv2d(c, 16, 3, padding=1), nn.ReLU(), MaxPool2d(2),
        Conv2d(16, 32, 3, padding=1), nn.ReLU(), MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (h // 4) * (w // 4), hidden), nn.ReLU(),
        nn.Linear(hidden, n_classes),
    )


MODELS: dict[str, Callable[..., nn.Module]] = {
    "femnist_cnn": femnist_cnn,
    "celeba_cnn": celeba_cnn,
    "logreg": logreg,
    "digits_cnn": digits_cnn,
}


def build(name: str, input_shape, n_classes: int, **kwargs) -> nn.Module:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name](tuple(input_shape), n_classes, **kwargs)


def init_weights(module: nn.Module, seed: int) -> None:
    """Re-initialise ``module`` reproducibly from ``seed`` alone (PyTorch's default initialisers,
    drawn from a private generator on the CPU so the global RNG is untouched)."""
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        for m in module.modules():
            if hasattr(m, "reset_parameters") and m is not module:
                m.reset_parameters()
    finally:
        torch.random.set_rng_state(gen_state)
