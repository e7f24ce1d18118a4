"""FedFusion's network (:mod:`mcfl.algorithms.fedfusion`): a model's convolutional feature extractor
twice, the global copy frozen and the local copy trained, their feature maps fused, then the rest
of the model (the head).

Fusion operators (Yao et al. 2019), with E_g, E_l the global and local maps of C channels:

* ``conv``:   F = Conv1x1([E_g; E_l]) (2C -> C channels), initialised to the mean (1/2)(E_g + E_l);
* ``multi``:  F = (1 - lambda) E_g + lambda E_l with one learnable lambda per channel;
* ``single``: the same with one learnable scalar lambda.

``lambda`` is the local branch's weight: at 0 (``conv``: the local half of the kernel 0, the global
half the identity) the network is the global model. lambda starts at 1/2; when the two extractors
are equal (the start of every round) every operator gives F = E, the plain model's features.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

OPERATORS = ("conv", "multi", "single")


def split_extractor(module: nn.Module) -> tuple[nn.Sequential, nn.Sequential]:
    """(convolutional extractor, head) of an ``nn.Sequential``, cut at its ``nn.Flatten``."""
    if not isinstance(module, nn.Sequential):
        raise ValueError("FedFusion needs an nn.Sequential model")
    cut = next((i for i, m in enumerate(module) if isinstance(m, nn.Flatten)), None)
    if not cut or not any(p.numel() for p in module[:cut].parameters()):
        raise ValueError("FedFusion needs a convolutional feature extractor (layers with parameters "
                         "before the model's nn.Flatten)")
    return module[:cut], module[cut:]


class Fusion(nn.Module):
    """The two extractors and the operator: an image batch -> the fused feature map."""

    def __init__(self, extractor: nn.Sequential, input_shape, operator: str):
        super().__init__()
        self.operator = operator
        self.local = extractor
        self.glob = copy.deepcopy(extractor).requires_grad_(False)
        with torch.no_grad():
            probe = torch.zeros(1, *input_shape, device=next(extractor.parameters()).device)
            channels = extractor(probe).shape[1]
        if operator == "conv":
            self.fuse = nn.Conv2d(2 * channels, channels, 1)
            eye = torch.eye(channels)[:, :, None, None] / 2
            with torch.no_grad():
                self.fuse.weight.copy_(torch.cat([eye, eye], 1))
                self.fuse.bias.zero_()
        else:
            self.lam = nn.Parameter(torch.full((channels if operator == "multi" else 1,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, loc = self.glob(x), self.local(x)
        if self.operator == "conv":
            return self.fuse(torch.cat([g, loc], 1))
        lam = self.lam.view(1, -1, *([1] * (g.dim() - 2)))
        return g + lam * (loc - g)


class FusionNet(nn.Sequential):
    """``Sequential(Fusion, *head)``: an ``nn.Sequential`` like the model it wraps, so that the
    batched executor's low-rank path trains its dense head as it trains the plain model's (the
    frozen global extractor gets no step on any path). Parameter names: ``0.glob.*``, ``0.local.*``,
    ``0.fuse.*`` / ``0.lam``, then the head's layers."""

    GLOB, LOCAL = "0.glob.", "0.local."

    def __init__(self, module: nn.Module, input_shape, operator: str = "conv"):
        if operator not in OPERATORS:
            raise ValueError(f"operator must be one of {', '.join(OPERATORS)}, got {operator!r}")
        extractor, head = split_extractor(copy.deepcopy(module))
        super().__init__(Fusion(extractor, input_shape, operator), *head)

    # the fusion block's parts, for tests and reports
    local = property(lambda self: self[0].local)
    glob = property(lambda self: self[0].glob)
    fuse = property(lambda self: self[0].fuse)
    lam = property(lambda self: self[0].lam)
    head = property(lambda self: nn.Sequential(*list(self)[1:]))
