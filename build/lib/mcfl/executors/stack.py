"""What the batched executor's paths share: sizing a chunk, the masked per-client loss, stacking the
clients' weights, and the probes that decide which path a model can take."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mcfl.engine import DeviceData, FlatModel

#: Device memory the automatic chunk size aims at for the stacked per-client state (CPU: fixed;
#: CUDA: a fraction of the device's total memory).
CPU_CHUNK_BYTES = 1 << 30
CUDA_CHUNK_FRACTION = 0.4


def auto_chunk(model: FlatModel, per_client: int | None = None) -> int:
    """Clients per chunk: ``per_client`` bytes each within the budget; by default about 6 stacked
    copies of the weights (weights, gradient, anchor, linear term, temporaries); at least 1, at
    most 4096."""
    if model.device.type == "cuda":
        budget = CUDA_CHUNK_FRACTION * torch.cuda.get_device_properties(model.device).total_memory
    else:
        budget = CPU_CHUNK_BYTES
    return int(max(1, min(4096, budget // (per_client or 6 * 4 * model.size))))


def forward_macs(module: nn.Module, sample: torch.Tensor) -> int:
    """Multiply-adds of ``module``'s Linear and convolution layers in one forward pass of
    ``sample`` (a batch of one): in x out per Linear, output size x (in_channels / groups) x kernel
    size per convolution."""
    total = 0

    def count(m: nn.Module, _, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(m, nn.Linear):
            total += out.numel() * m.in_features
        else:
            total += out.numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size)

    hooks = [m.register_forward_hook(count) for m in module.modules()
             if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))]
    try:
        with torch.no_grad():
            module(sample)
    finally:
        for h in hooks:
            h.remove()
    return total


def running_buffers(model: FlatModel, data: DeviceData) -> bool:
    """Whether a training-mode forward pass writes to the model's buffers (BatchNorm's running
    statistics and batch counter), found by one forward of two random samples; the buffers, the
    mode and the RNG are left as they were. A model the probe cannot run counts as writing them
    (it then trains sequentially, as every float-buffer model did before the probe)."""
    module = model.module
    if not any(b.is_floating_point() for b in module.buffers()):
        return False
    before = {n: b.clone() for n, b in module.named_buffers()}
    mode = module.training
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *data.x["train"].shape[1:], generator=g).to(data.device)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            module.train()
            try:
                module(x)
            except Exception:      # e.g. inputs a random float sample does not fit: play safe
                return True
        return any(not torch.equal(b, before[n]) for n, b in module.named_buffers())
    finally:
        module.train(mode)
        with torch.no_grad():
            for n, b in module.named_buffers():
                b.copy_(before[n])


def client_ce(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each of n clients' mean cross-entropy over the real rows of its padded batch: ``logits``
    (n, B, classes), ``y`` and ``mask`` (n, B)."""
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
    return (losses * mask).sum(1) / mask.sum(1).clamp(min=1)


class LossCall(nn.Module):
    """``fn(net, x, y, rows, mask=mask)`` as a module's forward, so that ``functional_call`` can
    swap in one client's parameters (names ``net.*``) for a custom ``Task.loss``."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.fn = None

    def forward(self, x, y, rows, mask):
        return self.fn(self.net, x, y, rows, mask=mask)


def stack_parts(vs: list, sl: slice, dev) -> torch.Tensor:
    """The ``sl`` parts of the vectors ``vs`` (None: zeros) stacked into a (len(vs), n) tensor."""
    return torch.stack([v[sl].to(dev) if v is not None else torch.zeros(sl.stop - sl.start, device=dev)
                        for v in vs])
