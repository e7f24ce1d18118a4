"""Convolutions in two forms of the same function, for the batched executor's stacked clients.

:class:`Conv2d` is ``nn.Conv2d`` (same parameters, names and initialisation) with a ``form``:

* ``"grouped"`` (the default): PyTorch's convolution. Under ``torch.func.vmap`` with per-client
  weights it becomes one grouped convolution, one group per client, which oneDNN runs slowly on
  small images on AVX2 CPUs (docs/performance.md).
* ``"toeplitz"``: the convolution as one dense product per sample. The kernel is scattered through
  a fixed index map into its doubly-blocked Toeplitz matrix ``T`` (``in·H·W`` rows, ``out·H'·W'``
  columns; entries the kernel does not reach are zero), so that ``y = x T + b`` with ``x`` the
  flattened image (I. Goodfellow, Y. Bengio and A. Courville, *Deep Learning*, MIT Press 2016,
  section 9.1: "discrete convolution can be viewed as multiplication by a matrix ... doubly block
  circulant"). Under ``vmap`` the clients' products become one batched GEMM (``bmm``); autograd
  returns the kernel gradient through the same index map (``index_select``'s backward is an
  ``index_add``). ``T`` has ``in·H·W·out·H'·W'`` entries: this form is for small images only
  (:data:`TOEPLITZ_MAX_ENTRIES`).

Which form the executor uses is chosen per CPU (:mod:`mcfl.executors.forms`); the two differ by
float rounding only (``tests/models/test_conv_forms.py`` checks values and gradients against
``torch.nn.functional.conv2d``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

#: the convolution forms of :class:`Conv2d`
FORMS = ("grouped", "toeplitz")
#: the largest Toeplitz matrix (entries) a layer may build per client: 1M floats, 4 MB (the digits
#: CNN's are 65K and 131K; the FEMNIST CNN's first alone would be 19.7M)
TOEPLITZ_MAX_ENTRIES = 1 << 20


def toeplitz_index(in_channels: int, out_channels: int, kernel: tuple[int, int], size: tuple[int, int],
                   stride: tuple[int, int], padding: tuple[int, int]) -> torch.Tensor:
    """The index map of a convolution's Toeplitz matrix: ``idx[i·H·W + h·W + w, o·H'·W' + p·W' + q]``
    is the position in the flattened kernel ``weight[o, i, dh, dw]`` that multiplies input pixel
    ``(i, h, w)`` for output pixel ``(o, p, q)`` (``h = p·stride + dh - padding``), and
    ``out·in·kh·kw`` (one past the kernel: a zero) where no kernel entry does."""
    (kh, kw), (H, W), (sh, sw), (ph, pw) = kernel, size, stride, padding
    Ho, Wo = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
    zero = out_channels * in_channels * kh * kw
    idx = torch.full((in_channels, H, W, out_channels, Ho, Wo), zero, dtype=torch.long)
    o = torch.arange(out_channels).view(-1, 1, 1)
    p = torch.arange(Ho).view(1, -1, 1)
    q = torch.arange(Wo).view(1, 1, -1)
    for i in range(in_channels):
        for dh in range(kh):
            for dw in range(kw):
                h, w = p * sh + dh - ph, q * sw + dw - pw                  # (1, Ho, 1), (1, 1, Wo)
                inside = ((h >= 0) & (h < H) & (w >= 0) & (w < W)).expand(out_channels, Ho, Wo)
                oo, pp, qq = (t.expand(out_channels, Ho, Wo)[inside] for t in (o, p, q))
                hh, ww = (t.expand(out_channels, Ho, Wo)[inside] for t in (h, w))
                idx[i, hh, ww, oo, pp, qq] = ((oo * in_channels + i) * kh + dh) * kw + dw
    return idx.view(in_channels * H * W, out_channels * Ho * Wo)


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` computed in the form ``self.form`` (module docstring); only the Toeplitz form's
    index map is extra state (built on the first Toeplitz call for an input size, not a buffer, so
    ``state_dict`` and the flat parameter layout are ``nn.Conv2d``'s)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.form = "grouped"
        self._index: dict[tuple, torch.Tensor] = {}

    def toeplitz_entries(self, size: tuple[int, int]) -> int:
        """Entries of this layer's Toeplitz matrix for ``size`` (H, W) inputs."""
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        Ho, Wo = (size[0] + 2 * ph - kh) // sh + 1, (size[1] + 2 * pw - kw) // sw + 1
        return self.in_channels * size[0] * size[1] * self.out_channels * Ho * Wo

    def toeplitz_applies(self, size: tuple[int, int]) -> bool:
        """Whether the Toeplitz form computes this layer for ``size`` inputs: no groups, dilation or
        padding other than zeros, and a matrix within :data:`TOEPLITZ_MAX_ENTRIES`."""
        return (self.groups == 1 and self.dilation == (1, 1) and self.padding_mode == "zeros"
                and not isinstance(self.padding, str) and self.toeplitz_entries(size) <= TOEPLITZ_MAX_ENTRIES)

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        size = tuple(input.shape[-2:])
        if self.form != "toeplitz" or not self.toeplitz_applies(size):
            return super()._conv_forward(input, weight, bias)
        return self._toeplitz_forward(input, weight, bias, size)

    def _toeplitz_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          size: tuple[int, int]) -> torch.Tensor:
        """``x`` (B, in, H, W) times the Toeplitz matrix of ``weight``, plus ``bias``."""
        key = (size, x.device)
        if key not in self._index:
            self._index[key] = toeplitz_index(self.in_channels, self.out_channels, self.kernel_size, size,
                                              self.stride, self.padding).to(x.device)
        idx = self._index[key]
        flat = torch.cat([weight.reshape(-1), weight.new_zeros(1)])
        T = flat.index_select(0, idx.view(-1)).view(idx.shape)                 # (in·H·W, out·H'·W')
        Ho = (size[0] + 2 * self.padding[0] - self.kernel_size[0]) // self.stride[0] + 1
        Wo = idx.shape[1] // (self.out_channels * Ho)
        rows = x.reshape(x.shape[0], -1)
        if bias is None:
            y = rows @ T
        else:
            y = torch.addmm(bias.repeat_interleave(Ho * Wo), rows, T)
        return y.view(x.shape[0], self.out_channels, Ho, Wo)


def conv_layers(module: nn.Module) -> list[Conv2d]:
    """``module``'s :class:`Conv2d` layers (the ones with a choice of form)."""
    return [m for m in module.modules() if isinstance(m, Conv2d)]


@contextmanager
def conv_form(module: nn.Module, form: str) -> Iterator[None]:
    """Compute ``module``'s :class:`Conv2d` layers in ``form`` inside the block (then as before)."""
    if form not in FORMS:
        raise ValueError(f"unknown convolution form {form!r}; use one of {', '.join(FORMS)}")
    layers = conv_layers(module)
    before = [m.form for m in layers]
    for m in layers:
        m.form = form
    try:
        yield
    finally:
        for m, f in zip(layers, before):
            m.form = f
