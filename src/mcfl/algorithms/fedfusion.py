"""FedFusion (Yao, Huang, Wu, Zhang, Chen, Li, Xu, "Towards Faster and Better Federated Learning:
A Feature Fusion Approach", ICIP 2019; a baseline of FedGSP's Table 1).

Each client's model holds the round's global feature extractor, frozen, beside a local copy it
trains; their feature maps are fused (``operator``: ``conv``, ``multi`` or ``single``; see
:mod:`mcfl.models.fusion`) and fed to the model's head. Round r:

1. every sampled client starts from the global vector (local extractor = global extractor, fusion
   operator, head) and trains the local extractor, the operator and the head by plain SGD on
   cross-entropy; the global extractor gets no gradient;
2. the server averages the vectors as FedAvg (weights: training-set sizes), then makes the average
   of the local extractors the next round's global extractor.

The global model tested at an evaluation is that vector (both extractors equal). The extractor is
the model's layers before its ``nn.Flatten`` (the LEAF CNNs' convolution blocks). Local training
is plain cross-entropy: the global extractor's parameters are frozen (``requires_grad=False``),
which every executor honours (no step). The fusion network is an ``nn.Sequential`` like the model
it wraps, so under ``executor: batched`` it trains as FedAvg's model does: its dense head on the
low-rank path (on the LEAF CNN, one CPU thread: see studies/methods_round.py), the rest
stacked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mcfl.algorithms.base import param_span
from mcfl.algorithms.fedavg import FedAvg
from mcfl.models.fusion import FusionNet


@dataclass
class Params:
    operator: Literal["conv", "multi", "single"] = "conv"


class FedFusion(FedAvg):
    name = "FedFusion"
    Params = Params

    def __init__(self, fed, params: Params):
        super().__init__(fed, params)
        fed.model.load(fed.w0)                  # both extractors start from the run's initial weights
        net = FusionNet(fed.model.module, fed.data.x_shape, params.operator)
        self.fed = fed.with_network(net)
        flat = self.fed.model
        self.local_sl, self.glob_sl = param_span(flat, FusionNet.LOCAL), param_span(flat, FusionNet.GLOB)

    def server_step(self, w: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        mean[self.glob_sl] = mean[self.local_sl]       # the averaged local extractor becomes global
        return mean
