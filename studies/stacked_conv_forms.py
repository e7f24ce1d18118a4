"""The batched executor's stacked step of a convolutional network in other forms of the same
function: is the GPU round's time in its grouped convolutions' layout, and in its kernel launches?

Under ``vmap`` a convolution with per-client weights becomes one grouped convolution over the
clients (one group each), in the NCHW layout. On an NVIDIA H200 a full FEMNIST round spends most
of its device time in cuDNN's backward pass of those convolutions, launched per group with a layout
conversion (NCHW to NHWC) around each, and most of its wall time launching kernels
(docs/performance.md, "GPU"). This script times one step of ``--clients`` stacked clients
(forward, loss, gradients of every client's parameters; batch ``--batch``; random inputs, the same
for every form) in four forms:

* ``vmap``: ``vmap(functional_call)`` over the stacked parameters, as the executor runs it (the
  reference of the ratios);
* ``grouped``: the same function written out: the clients folded into the channels, each
  convolution one ``F.conv2d(..., groups=clients)``, each Linear one batched matrix product, NCHW;
* ``grouped-cl``: ``grouped`` in the channels-last memory format (NHWC), the layout cuDNN's
  tensor-core kernels read;
* ``+graph`` (CUDA only): each of the above captured once as a CUDA graph and replayed, which
  removes the host's per-kernel launch cost and leaves the kernels' own time.

For each form it prints milliseconds per step (median of ``--reps``, forms interleaved) and the
ratio to ``vmap``, and how far its gradients are from ``vmap``'s: ``||g - g_vmap|| / ||g_vmap||``
over all parameters. The forms compute the same function, so only rounding differs, and with it,
now and then, which of two nearly equal values a max pooling picks (that moves one gradient entry
to a neighbour, which is why a norm and not the largest entry is shown). Run it on the
GPU the round benchmark ran on, with the round's chunk:

    python studies/stacked_conv_forms.py --device cuda --clients 214
    python studies/stacked_conv_forms.py --device cuda --clients 214 --model femnist_cnn --hidden 248
    python studies/stacked_conv_forms.py --clients 8 --reps 5          # a quick check on a CPU

On a CPU ``grouped`` is the "hand-written stacked forward" of docs/performance.md's digits CNN
table (``--model digits_cnn --clients 100``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import SHAPES, machine  # noqa: E402
from mcfl.models import digits_cnn, femnist_cnn
from mcfl.runner import keep_freed_memory


def build(name: str, hidden: int | None) -> nn.Module:
    shape, classes = SHAPES[name]
    kwargs = {"hidden": hidden} if hidden else {}
    return {"femnist_cnn": femnist_cnn, "digits_cnn": digits_cnn}[name](shape, classes, **kwargs)


def stacked_params(net: nn.Module, clients: int, device: torch.device, gen: torch.Generator) -> dict:
    """Every parameter of ``net`` once per client, each client's a small perturbation of ``net``'s."""
    out = {}
    for name, p in net.named_parameters():
        noise = torch.randn((clients, *p.shape), generator=gen) * 0.01
        out[name] = (p.detach()[None] + noise).to(device).requires_grad_(True)
    return out


def vmap_loss(net: nn.Module):
    """The executor's form: a ``vmap`` over the clients of the module called on its parameters."""
    per_client = vmap(lambda p, x, y: F.cross_entropy(functional_call(net, p, (x,)), y))
    return lambda params, x, y: per_client(params, x, y).sum()


def grouped_loss(net: nn.Module, channels_last: bool):
    """The same function with the clients folded into the channels: every convolution one grouped
    ``F.conv2d``, every Linear one ``baddbmm``, pooling and ReLU on the folded tensor."""
    layers = list(net)
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def loss(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c, b = x.shape[:2]
        h = x.transpose(0, 1).reshape(b, c * x.shape[2], *x.shape[3:]).contiguous(memory_format=fmt)
        folded = True                                   # (batch, clients x channels, H, W)
        for i, layer in enumerate(layers):
            w = params.get(f"{i}.weight")
            bias = params.get(f"{i}.bias")
            if isinstance(layer, nn.Conv2d):
                weight = w.reshape(c * w.shape[1], *w.shape[2:]).contiguous(memory_format=fmt)
                h = F.conv2d(h, weight, bias.reshape(-1), stride=layer.stride, padding=layer.padding,
                             groups=c)
            elif isinstance(layer, nn.Flatten):
                h = h.reshape(b, c, -1).transpose(0, 1)     # (clients, batch, features), NCHW order
                folded = False
            elif isinstance(layer, nn.Linear):
                h = torch.baddbmm(bias[:, None, :], h, w.transpose(1, 2))
            elif isinstance(layer, nn.ReLU):
                h = F.relu(h)
            else:                                           # max pooling
                h = F.max_pool2d(h, layer.kernel_size, layer.stride)
        assert not folded
        return F.cross_entropy(h.reshape(c * b, -1), y.reshape(-1), reduction="none").view(c, b).mean(1).sum()

    return loss


def step_fn(loss, params: dict, x: torch.Tensor, y: torch.Tensor):
    names = list(params)

    def step():
        value = loss(params, x, y)
        return torch.autograd.grad(value, [params[n] for n in names])

    return step


def graphed(step, device: torch.device):
    """``step`` captured once as a CUDA graph (after a warm-up on a side stream); the returned
    function replays it and returns the graph's gradient tensors."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    def replay():
        graph.replay()
        return out

    return replay


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="femnist_cnn", choices=["femnist_cnn", "digits_cnn"])
    ap.add_argument("--hidden", type=int, help="the dense layer's width (default: the model's)")
    ap.add_argument("--clients", type=int, default=128)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()                                     # as training commands run
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = build(args.model, args.hidden).to(device)
    shape, classes = SHAPES[args.model]
    params = stacked_params(net, args.clients, device, gen)
    x = torch.rand((args.clients, args.batch, *shape), generator=gen).to(device)
    y = torch.randint(0, classes, (args.clients, args.batch), generator=gen).to(device)

    steps = {"vmap": step_fn(vmap_loss(net), params, x, y),
             "grouped": step_fn(grouped_loss(net, False), params, x, y),
             "grouped-cl": step_fn(grouped_loss(net, True), params, x, y)}
    if device.type == "cuda":
        for name in list(steps):
            try:
                steps[f"{name}+graph"] = graphed(steps[name], device)
            except Exception as e:                          # report, do not hide, a form that fails
                print(f"{name}+graph: capture failed: {type(e).__name__}: {e}")

    reference = torch.cat([g.flatten() for g in steps["vmap"]()])
    diffs = {}
    for name, fn in steps.items():
        grads = torch.cat([g.flatten() for g in fn()])
        diffs[name] = float((grads - reference).norm() / reference.norm())
        fn()                                                # warm-up
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.reps):
        for name, fn in steps.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)

    n_params = sum(p[0].numel() for p in params.values())
    print(f"{args.model} ({n_params:,} parameters a client), {args.clients} clients x batch "
          f"{args.batch}, one step (forward, loss, every client's gradients); median of {args.reps}")
    print(f"machine: {machine(device)}")
    print()
    print("| form | ms per step | vs vmap | gradient difference (relative norm) |")
    print("|---|---|---|---|")
    base = statistics.median(times["vmap"])
    for name, ts in times.items():
        ms = statistics.median(ts)
        print(f"| {name} | {1e3 * ms:,.2f} | {base / ms:.2f}x | {diffs[name]:.1e} |")


if __name__ == "__main__":
    main()
