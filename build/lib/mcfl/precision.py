"""A run's training precision (``train.precision``): what each setting computes in, and the contexts
the engine and the executors wrap local training in (nothing here is used by evaluation, which
computes in float32 whatever the setting).

* ``fp32`` (absent: the same): no context at all: PyTorch's defaults, bitwise repeatable on a CPU.
* ``tf32``: :func:`tf32_scope` around whole local updates (forward and backward) on CUDA: float32
  matrix products and cuDNN convolutions on TF32 tensor cores. Other devices have no TF32: fp32.
* ``bf16``: ``torch.autocast(device, bfloat16)`` around each step's forward pass and loss; the
  parameters, gradients and updates stay float32. Where autocast does not reach (inside
  ``torch.func.vmap`` on a CPU; the low-rank layers' own products) the executors cast to bfloat16
  themselves (:mod:`mcfl.executors`).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

#: the number formats of local training (``train.precision``; absent: fp32)
PRECISIONS = ("fp32", "tf32", "bf16")


def precision_ran(precision: str | None, device: torch.device | str) -> str:
    """What local training computes in, for ``metrics.json``: ``fp32``; ``tf32`` on CUDA only (fp32
    elsewhere: TF32 is a mode of NVIDIA tensor cores); ``bf16 (autocast)``."""
    precision = precision or "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if precision == "tf32":
        return "tf32" if torch.device(device).type == "cuda" else "fp32"
    return "bf16 (autocast)" if precision == "bf16" else "fp32"


@contextmanager
def tf32_scope():
    """TF32 for CUDA float32 matrix products and cuDNN convolutions inside the block; the previous
    settings come back after it (so a process's other work keeps its own)."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    if hasattr(matmul, "fp32_precision"):                  # PyTorch >= 2.9's settings
        before = matmul.fp32_precision, conv.fp32_precision
        matmul.fp32_precision = conv.fp32_precision = "tf32"
        try:
            yield
        finally:
            matmul.fp32_precision, conv.fp32_precision = before
    else:                                                  # pragma: no cover - older PyTorch
        before = matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def bf16_supported(device: torch.device | str) -> bool:
    """Whether ``torch.autocast`` can run bfloat16 on ``device`` (CUDA: compute capability 8.0 or
    later; a CPU: one tiny product under autocast succeeds)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
        return out.dtype == torch.bfloat16
    except (RuntimeError, TypeError):
        return False


def autocast(precision: str, device: torch.device):
    """The context of a training step's forward pass and loss: bfloat16 autocast for ``bf16``,
    else none."""
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()


def numerics(precision: str, device: torch.device):
    """The context of whole local updates (forward and backward): :func:`tf32_scope` for ``tf32``
    on CUDA, else none."""
    if precision == "tf32" and torch.device(device).type == "cuda":
        return tf32_scope()
    return nullcontext()
