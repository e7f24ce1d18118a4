"""FedCG's hyperparameters (the ablations of Tables 3-4 are switches here) and its state."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Params:
    K: int = 3
    clustering: str = "classifier"   # classifier (teacher-student, §3.1) | kmeans | oracle
    teacher_every: int = 5           # R: teacher <- student every R rounds [value lost; GUESS]
    domain_lr: float = 0.0           # student's SGD lr [value lost]; 0 = the run's lr
    layers: str = "last"             # last (last conv) | conv (all convs) | all (convs + linears)
    agnostic: bool = True            # residual on a domain-agnostic layer (Eq. 4) vs domain-specific only
    gcn: bool = True                 # connect the domains through the GCN (Eq. 5)
    projection: bool = True          # the GCN's W
    relu: bool = True                # sigma of Eq. 5
    gcn_layers: int = 1              # 1 (CelebA) or 2 (FEMNIST)
    bottleneck: int = 1              # W as d -> ceil(d/r) -> d when r > 1
    adjacency: str = "distance"      # distance (Eq. 6) | uniform (U) | hamming (H)
    adjacency_init: str = "eye"      # eye | random | uniform: A before the first distance update
    self_weight: float = 0.75        # lambda of Eq. 6 [value lost; GUESS: see models.fedcg]
    test_assignment: str = "soft"    # soft | hard | source
    dc_width: int = 32               # domain classifier conv features w, 2w [lost; GUESS]
    dc_kernel: int = 5               # domain classifier kernel size [lost; GUESS]
    restarts: int = 10               # k-means restarts (clustering: kmeans)
    calibrate_teacher: bool = True   # standardise the teacher's logits when (re)set (OUR ADDITION)
    alpha_init: float = 0.0          # initial alpha of Eq. 4 (first author's prototype: 0)
    residual_init: str = "uniform"   # theta_k at start: uniform (layer default) | zero (OUR ADDITION)

    def __post_init__(self):
        choices = {"clustering": ("classifier", "kmeans", "oracle"), "layers": ("last", "conv", "all"),
                   "adjacency": ("distance", "uniform", "hamming"),
                   "adjacency_init": ("eye", "random", "uniform"),
                   "test_assignment": ("soft", "hard", "source"), "residual_init": ("uniform", "zero")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} must be one of {', '.join(allowed)}; got {getattr(self, key)!r}")
        for key in ("K", "teacher_every", "gcn_layers", "bottleneck", "dc_width", "dc_kernel", "restarts"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.self_weight <= 1:
            raise ValueError(f"self_weight must be in [0, 1], got {self.self_weight}")
        if (self.gcn and self.K > 1 and math.isclose(self.K * self.self_weight, 1)
                and (self.K == 2 or self.adjacency == "uniform")):
            raise ValueError(f"self_weight = 1/K = {self.self_weight:g} makes the GCN's adjacency "
                             f"uniform, so every domain would get the same parameters; use > 0.5")
        if self.domain_lr < 0:
            raise ValueError(f"domain_lr must be >= 0, got {self.domain_lr}")
        if self.residual_init == "zero":
            if self.gcn and self.relu:
                raise ValueError("residual_init: zero needs relu: false (or gcn: false): the GCN's "
                                 "ReLU has zero gradient at 0, so the domain parameters would never move")
            if self.agnostic and self.alpha_init == 0:
                raise ValueError("residual_init: zero needs alpha_init != 0: with both at 0 neither "
                                 "alpha nor the domain parameters get a gradient")


@dataclass
class State:
    w: torch.Tensor               # the whole FedCG model, one flat vector
    client_cluster: torch.Tensor  # (m,) k-means cluster per client (clustering: kmeans), else -1
