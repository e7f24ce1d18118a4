"""Which convolution form (:mod:`mcfl.models.conv`) the batched executor's stacked clients use,
chosen per CPU at start-up and recorded in each run's ``metrics.json`` (``conv_form``).

``MCFL_CONV_FORM`` (environment) overrides the choice: ``grouped`` or ``toeplitz`` force that form
(where a layer cannot take the Toeplitz form it stays grouped), ``auto`` (the default) times both.
The timing (:func:`choose_conv_form`) runs a few stacked training steps of :data:`PROBE_CLIENTS`
clients at the run's batch size in each form, interleaved, best of :data:`PROBE_REPEATS`, and takes
the Toeplitz form only where it is at least :data:`PROBE_MARGIN` times faster: the forms differ by
float rounding, so a near tie keeps the grouped form, which is what every published result was
computed with (a machine whose timings waver around a tie must not flip between forms, and so
between results, from one run to the next). It runs once per process for a model, input and batch
size, on the CPU only (on a GPU the grouped form stays: a Toeplitz matrix per client is far more
memory traffic than cuDNN's kernels) and only for models with a layer the Toeplitz form fits
(the digits CNN; not the FEMNIST CNN, whose matrices would be too large).
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from mcfl.models.conv import FORMS, conv_form, conv_layers

#: the environment variable that overrides the choice
ENV = "MCFL_CONV_FORM"
#: clients stacked in the start-up timing, repeats per form, and how much faster the Toeplitz form
#: must be to be chosen
PROBE_CLIENTS = 8
PROBE_REPEATS = 3
PROBE_MARGIN = 1.2

_chosen: dict[tuple, tuple[str, str]] = {}


def requested_form() -> str:
    """``MCFL_CONV_FORM``'s value (``auto`` when unset); anything else is a ValueError naming it."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in FORMS + ("auto",):
        raise ValueError(f"{ENV}={value!r}: use one of {', '.join(FORMS + ('auto',))}")
    return value


def toeplitz_fits(module: nn.Module, sample: torch.Tensor) -> bool:
    """Whether some :class:`mcfl.models.conv.Conv2d` of ``module`` can take the Toeplitz form for
    inputs like ``sample`` (a batch of one), found by one forward pass (a model the pass cannot
    run, such as one whose forward needs more than an input, counts as not fitting)."""
    layers = conv_layers(module)
    fits = False

    def check(m, inputs, _):
        nonlocal fits
        fits = fits or m.toeplitz_applies(tuple(inputs[0].shape[-2:]))

    if not layers:
        return False
    hooks = [m.register_forward_hook(check) for m in layers]
    try:
        with torch.no_grad():
            module(sample)
    except Exception:  # noqa: BLE001 - not a plain classifier: keep PyTorch's convolution
        return False
    finally:
        for h in hooks:
            h.remove()
    return fits


def step_seconds(module: nn.Module, form: str, x: torch.Tensor, y: torch.Tensor) -> float:
    """Seconds of one stacked training step (forward and gradient, ``vmap`` over the clients of
    ``x`` (C, B, ...)) of ``module`` with its convolutions in ``form``."""
    params = {n: p.detach().expand(len(x), *p.shape).clone().requires_grad_(p.requires_grad)
              for n, p in module.named_parameters()}
    forward = vmap(lambda p, xb: functional_call(module, p, (xb,)))
    t = time.perf_counter()
    with conv_form(module, form):
        logits = forward(params, x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        torch.autograd.grad(loss, [p for p in params.values() if p.requires_grad], allow_unused=True)
    return time.perf_counter() - t


def time_forms(module: nn.Module, input_shape: tuple, batch: int, device,
               clients: int = PROBE_CLIENTS, repeats: int = PROBE_REPEATS) -> dict[str, float]:
    """Each form's least seconds of a stacked step (``clients`` x ``batch`` random samples), the
    forms interleaved; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        n_classes = module(torch.zeros(1, *input_shape, device=device)).shape[-1]
    with torch.random.fork_rng(devices=[]):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(clients, batch, *input_shape, generator=g).to(device)
        y = torch.randint(0, n_classes, (clients, batch), generator=g).to(device)
        best = {f: float("inf") for f in FORMS}
        for f in FORMS:                               # warm-up (first calls build index maps)
            step_seconds(module, f, x, y)
        for _ in range(repeats):
            for f in FORMS:
                best[f] = min(best[f], step_seconds(module, f, x, y))
    return best


def choose_conv_form(module: nn.Module, input_shape: tuple, batch: int,
                     device: torch.device) -> tuple[str, str]:
    """The form the stacked clients of ``module`` train in on this machine, and why (a phrase for
    the log): ``MCFL_CONV_FORM`` if set, else the grouped form off the CPU or where no layer fits
    the Toeplitz form, else the start-up timing's (module docstring), once per process."""
    requested = requested_form()
    if requested != "auto":
        return requested, f"{ENV}={requested}"
    if torch.device(device).type != "cpu":
        return "grouped", f"the default on {torch.device(device).type}"
    sample = torch.zeros(1, *input_shape, device=device)
    if not toeplitz_fits(module, sample):
        return "grouped", "no convolution small enough for the Toeplitz form"
    key = (repr(module), tuple(input_shape), batch, torch.get_num_threads(),
           torch.backends.cpu.get_cpu_capability())
    if key not in _chosen:
        t = time_forms(module, tuple(input_shape), batch, device)
        form = "toeplitz" if t["grouped"] >= PROBE_MARGIN * t["toeplitz"] else "grouped"
        _chosen[key] = form, (f"start-up timing on {torch.backends.cpu.get_cpu_capability()}: a step of "
                              f"{PROBE_CLIENTS} clients x {batch} grouped {t['grouped'] * 1e3:.1f} ms, "
                              f"toeplitz {t['toeplitz'] * 1e3:.1f} ms")
    return _chosen[key]
