"""Max pooling that stays fast when a CPU pools many small images at once.

PyTorch's CPU max pooling in the usual (N, C, H, W) layout pays a fixed cost per H x W plane. The
batched executor stacks 100 clients of the 8x8 digits CNN under ``torch.func.vmap``, so a step pools
16,000 planes of 8x8 and 32,000 of 4x4, and that per-plane cost made pooling a quarter of the step.
In the channels-last layout one kernel runs over all the planes together: 3-5x faster on such
inputs, the change of layout included, and about 4x on the FEMNIST CNN's 28x28 and 14x14 planes.

:class:`MaxPool2d` is ``nn.MaxPool2d`` (square kernel equal to its stride, no padding) that pools
large CPU inputs in channels-last order. Outputs, chosen indices and so gradients are bit for bit
those of ``nn.MaxPool2d``: both of PyTorch's kernels scan each window in the same order and keep
its first maximum; only the memory order of the planes differs. Under ``vmap`` the clients'
dimension is folded into the channels (pooling is per plane), a view of the stacked convolution's
output, not a copy. The backward pass is PyTorch's own, in the usual layout. On a GPU, and for
small inputs, it is ``F.max_pool2d`` itself. ``tests/models/test_pool.py`` checks the equality with tied
maxima, plain and under ``vmap``; ``studies/digits_cnn_forms.py`` times it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: fewest input values a CPU pools in channels-last order; below it the per-plane cost is small
#: and the layout change costs more than it saves (the digits CNN's sequential steps)
CHANNELS_LAST_MIN = 32768


def _pool(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """k x k max pooling with stride k of a 4-d CPU tensor ``x``: (values, indices), both in the
    usual contiguous layout, computed in channels-last order when ``x`` is large enough."""
    if x.numel() >= CHANNELS_LAST_MIN:
        x = x.contiguous(memory_format=torch.channels_last)
    out, idx = torch.ops.aten.max_pool2d_with_indices(x, [k, k], [k, k])
    return out.contiguous(), idx.contiguous()


def _pool_backward(grad: Tensor, x: Tensor, idx: Tensor, k: int) -> Tensor:
    return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [k, k], [k, k], [0, 0], [1, 1],
                                                           False, idx)


class _Pool(torch.autograd.Function):
    """:func:`_pool`'s values, differentiable; the backward pass is PyTorch's own, in the usual
    layout. A plain (not ``torch.func``-aware) Function: it costs a few microseconds a call where
    the ``torch.func``-aware form below costs about 0.2 ms."""

    @staticmethod
    def forward(ctx, x: Tensor, k: int) -> Tensor:
        out, idx = _pool(x, k)
        ctx.save_for_backward(x, idx)
        ctx.k = k
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        x, idx = ctx.saved_tensors
        return _pool_backward(grad, x, idx, ctx.k), None


class _VmappedPool(torch.autograd.Function):
    """The same under ``torch.func.vmap``, where a tensor's memory layout cannot be changed: the
    vmapped dimension is folded into the channels (pooling is per plane), a view when it sits just
    before them in memory, as a vmapped convolution leaves it, and :class:`_Pool` pools that."""

    @staticmethod
    def forward(x: Tensor, k: int) -> Tensor:
        return _pool(x, k)[0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        x, = ctx.saved_tensors
        return _pool_backward(grad, x, _pool(x, ctx.k)[1], ctx.k), None

    @staticmethod
    def vmap(info, in_dims, x: Tensor, k: int):
        c = x.dim() - 4
        x = x.movedim(in_dims[0], c)
        return _Pool.apply(x.flatten(c, c + 1), k).unflatten(c, x.shape[c:c + 2]), c


#: whether a tensor is one inside ``torch.func.vmap`` (a private PyTorch function: where a torch
#: build lacks it, the layer is ``F.max_pool2d`` everywhere)
_is_batched = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", None)


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d(k)`` (stride k, no padding), computed as described in the module docstring."""

    def __init__(self, kernel_size: int):
        super().__init__(kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        k = self.kernel_size
        if x.device.type != "cpu" or _is_batched is None:
            return F.max_pool2d(x, k)
        if _is_batched(x):                               # inside vmap
            return _VmappedPool.apply(x, k)
        if x.dim() == 4 and x.numel() >= CHANNELS_LAST_MIN:
            return _Pool.apply(x, k)
        return F.max_pool2d(x, k)
