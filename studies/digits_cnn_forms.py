"""The digits CNN's local step in other forms of the same function, on this machine's CPU: the
levers tried for `make reproduce`'s digits runs.

Forms (the same function and parameters):

* ``conv-relu-pool``: ``Conv2d, ReLU, MaxPool2d`` twice with PyTorch's ``nn.MaxPool2d``: the
  reference every other form is compared with;
* ``zoo``: the same with the package's pooling (``mcfl.models.pool.MaxPool2d``: the stacked
  clients' planes pooled together in channels-last order), the model zoo's form;
* ``conv-pool-relu``: pooling before the ReLU (max commutes with the monotone ReLU: bitwise the
  same outputs and gradients, the ReLU on a quarter of the values);
* ``patch-relu-pool``: the first convolution (one input channel) as patches times kernel
  (``unfold`` and one matrix product, :class:`PatchConv2d` below);
* ``patch-pool-relu``: both;
* ``patch2-relu-pool``: both convolutions as patches.

The patches form is faster stacked, and it is not in the package: its matrix product (a 9-long
inner dimension, through MKL) rounds differently depending on the process's earlier allocations,
so reversing the order in which FedDane's clients are processed moved its weights by 2.5e-5 after
two rounds, against 6e-8 with the convolution (``tests/test_faults_resume.py``); ``MKL_CBWR=AVX2,STRICT``
brought it to 4.8e-7. A package whose runs repeat bit for bit keeps the convolution.

Two steps, as the executors take them: ``stacked``, 100 clients x batch 10 in one
``vmap(functional_call)`` forward and one backward (the batched executor, digits' round), and
``one client``, batch 5 on the plain module (the sequential loop; FedGSP's chains). The last
line times a lone client both ways (stacked as a ``vmap`` over one client, and on the plain
module), which is why the batched executor now hands a call with one client to the sequential
loop. Forms are interleaved rep by rep; CPU seconds per step, the least of ``--reps``; one thread.

``--scaling`` adds where the zoo's stacked step stands on this core: its time per 100 clients at
chunks of 25 to 300 clients (flat past 100 means no per-call cost is left for larger chunks to
share out), and the multiply-adds it does per second against the LEAF FEMNIST CNN's plain step
(hidden 248, batch 10, the sequential loop's step on the real writers) on the same core, counting
a training step as three forward passes (forward, input gradient, weight gradient), and that LEAF
step with PyTorch's pooling against the zoo's.

    python studies/digits_cnn_forms.py
    python studies/digits_cnn_forms.py --reps 40 --clients 100
    python studies/digits_cnn_forms.py --scaling
    python studies/digits_cnn_forms.py --heap
    python studies/digits_cnn_forms.py --reps 80 --scaling --heap --md docs/results/digits-cnn-forms.md

Every form is timed with freed memory kept in the process, as training jobs run
(``mcfl.runner.keep_freed_memory``). ``--heap`` shows what that does: the zoo's stacked step in two
fresh processes, one with glibc's default heap settings and one keeping freed memory, with each
one's page faults and system time per step.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import machine  # noqa: E402
from mcfl.executors.stack import forward_macs
from mcfl.models import digits_cnn, femnist_cnn
from mcfl.runner import keep_freed_memory


class PatchConv2d(nn.Conv2d):
    """A stride-1 ``nn.Conv2d`` computed as its input's patches (``F.unfold``) times the kernel: the
    same function and parameters, rounded differently. Not in the package (see the module
    docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        ho, wo = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
        patches = F.unfold(x, self.kernel_size, padding=self.padding)          # (n, c*kh*kw, ho*wo)
        y = torch.matmul(patches.transpose(1, 2), self.weight.flatten(1).t())  # (n, ho*wo, out)
        return (y + self.bias).view(n, ho, wo, self.out_channels).permute(0, 3, 1, 2)


FORMS = ("conv-relu-pool", "zoo", "conv-pool-relu", "patch-relu-pool", "patch-pool-relu", "patch2-relu-pool")


def build(form: str) -> nn.Module:
    if form == "zoo":
        return digits_cnn((1, 8, 8), 10)
    first = (PatchConv2d if form.startswith("patch") else nn.Conv2d)(1, 16, 3, padding=1)
    second = (PatchConv2d if form.startswith("patch2") else nn.Conv2d)(16, 32, 3, padding=1)
    blocks = ([first, nn.ReLU(), nn.MaxPool2d(2), second, nn.ReLU(), nn.MaxPool2d(2)]
              if form.endswith("relu-pool") else
              [first, nn.MaxPool2d(2), nn.ReLU(), second, nn.MaxPool2d(2), nn.ReLU()])
    return nn.Sequential(*blocks, nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def stacked_step(net: nn.Module, params: dict, x: torch.Tensor, y: torch.Tensor):
    """Every client's gradient, as the batched executor's stacked path computes it."""
    leaves = {n: v.detach().requires_grad_() for n, v in params.items()}
    logits = vmap(lambda p, xi: functional_call(net, p, (xi,)))(leaves, x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)
    return torch.autograd.grad(loss.sum(), list(leaves.values()))


def plain_step(net: nn.Module, x: torch.Tensor, y: torch.Tensor):
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    return [p.grad for p in net.parameters()]


def cpu_times(fns: dict, reps: int, inner: int) -> dict[str, float]:
    """Least CPU seconds per call of each function over ``reps`` (a shared machine only ever adds
    time), the functions interleaved rep by rep."""
    out = {k: [] for k in fns}
    for r in range(reps):
        for k in (list(fns) if r % 2 else list(fns)[::-1]):
            t = time.process_time()
            for _ in range(inner):
                fns[k]()
            out[k].append((time.process_time() - t) / inner)
    return {k: min(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--scaling", action="store_true",
                    help="also time the stacked step per chunk size and its multiply-add rate (module docstring)")
    ap.add_argument("--heap", action="store_true",
                    help="also time the stacked step with glibc's default heap settings and keeping freed memory")
    ap.add_argument("--heap-child", choices=("default", "kept"), help=argparse.SUPPRESS)
    ap.add_argument("--md", type=Path, help="also write the output, with the command and date, to this Markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.heap_child:
        return heap_child(args)
    keep_freed_memory()
    if args.md:
        out = io.StringIO()
        with contextlib.redirect_stdout(_Tee(sys.stdout, out)):
            forms(args)
        cmd = " ".join(["python studies/digits_cnn_forms.py", *sys.argv[1:]]).replace(f" --md {args.md}", "")
        args.md.write_text(f"Output of `{cmd}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:\n\n"
                           f"```text\n{out.getvalue().strip()}\n```\n")
    else:
        forms(args)


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for st in self.streams:
            st.write(text)
        return len(text)


def forms(args) -> None:
    torch.manual_seed(0)
    C, B = args.clients, args.batch
    x = torch.randint(0, 17, (C, B, 1, 8, 8)).float()       # sklearn digits: integers 0-16
    x[..., :2] = 0                                          # blank columns: ties in the pools
    y = torch.randint(0, 10, (C, B))
    nets = {f: build(f) for f in FORMS}
    for f in FORMS[1:]:
        nets[f].load_state_dict(nets[FORMS[0]].state_dict())
    params = {n: p.detach().expand(C, *p.shape) + 0.01 * torch.randn(C, *p.shape)
              for n, p in nets[FORMS[0]].named_parameters()}
    ref = stacked_step(nets[FORMS[0]], params, x, y)
    print(f"digits CNN step forms; {machine(torch.device('cpu'))}")
    print(f"stacked: {C} clients x batch {B} (vmap); one client: batch 5, plain module; CPU ms per "
          f"step, least of {args.reps}\n")
    print("| form | stacked ms | vs conv-relu-pool | one client ms | vs conv-relu-pool | gradients vs conv-relu-pool |")
    print("|---|---|---|---|---|---|")
    st = cpu_times({f: (lambda f=f: stacked_step(nets[f], params, x, y)) for f in FORMS}, args.reps, 3)
    one = cpu_times({f: (lambda f=f: plain_step(nets[f], x[0, :5], y[0, :5])) for f in FORMS}, args.reps, 20)
    for f in FORMS:
        g = stacked_step(nets[f], params, x, y)
        same = all(torch.equal(a, b) for a, b in zip(g, ref))
        diff = "bitwise equal" if same else f"max diff {max((a - b).abs().max().item() for a, b in zip(g, ref)):.1e}"
        print(f"| {f} | {st[f] * 1e3:.1f} | {st[FORMS[0]] / st[f]:.2f}x | {one[f] * 1e3:.2f} | "
              f"{one[FORMS[0]] / one[f]:.2f}x | {diff} |")
    net = nets["zoo"]
    lone = {n: v[:1] for n, v in params.items()}
    net.load_state_dict({n: v[0] for n, v in lone.items()})
    t = cpu_times({"vmap": lambda: stacked_step(net, lone, x[:1, :5], y[:1, :5]),
                   "plain": lambda: plain_step(net, x[0, :5], y[0, :5])}, args.reps, 20)
    print(f"\nA lone client, batch 5 (the zoo's form): stacked as a vmap over one client {t['vmap'] * 1e3:.2f} ms, "
          f"plain module {t['plain'] * 1e3:.2f} ms a step ({t['vmap'] / t['plain']:.2f}x)")
    if args.scaling:
        scaling(net, B, args.reps)
    if args.heap:
        heap(args)


def heap(args) -> None:
    """The zoo's stacked step in a fresh process per heap setting (module docstring)."""
    out = {}
    for mode in ("default", "kept"):
        cmd = [sys.executable, __file__, "--heap-child", mode, "--clients", str(args.clients),
               "--batch", str(args.batch), "--reps", str(args.reps)]
        out[mode] = [float(v) for v in subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()]
    (d_ms, d_f, d_sys), (k_ms, k_f, k_sys) = out["default"], out["kept"]
    print(f"\nThe zoo's stacked step ({args.clients} clients x batch {args.batch}), CPU ms (least of "
          f"{args.reps}) / page faults / system ms per step: glibc's defaults {d_ms:.1f} / {d_f:.0f} / "
          f"{d_sys:.1f}, freed memory kept {k_ms:.1f} / {k_f:.0f} / {k_sys:.1f} ({d_ms / k_ms:.2f}x)")


def heap_child(args) -> None:
    if args.heap_child == "kept":
        keep_freed_memory()
    torch.manual_seed(0)
    C, B = args.clients, args.batch
    net = build("zoo")
    x = torch.randint(0, 17, (C, B, 1, 8, 8)).float()
    y = torch.randint(0, 10, (C, B))
    params = {n: p.detach().expand(C, *p.shape) + 0.01 * torch.randn(C, *p.shape) for n, p in net.named_parameters()}
    for _ in range(3):
        stacked_step(net, params, x, y)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t = cpu_times({"s": lambda: stacked_step(net, params, x, y)}, args.reps, 1)["s"]
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(t * 1e3, (r1.ru_minflt - r0.ru_minflt) / args.reps, (r1.ru_stime - r0.ru_stime) / args.reps * 1e3)


def scaling(net: nn.Module, batch: int, reps: int) -> None:
    """The stacked step's time per 100 clients by chunk size, and its multiply-add rate against
    the LEAF CNN's plain step (module docstring)."""
    macs = forward_macs(net, torch.zeros(1, 1, 8, 8))
    times = {}
    for c in (25, 50, 100, 200, 300):
        x = torch.randint(0, 17, (c, batch, 1, 8, 8)).float()
        y = torch.randint(0, 10, (c, batch))
        params = {n: p.detach().expand(c, *p.shape) + 0.01 * torch.randn(c, *p.shape)
                  for n, p in net.named_parameters()}
        times[c] = cpu_times({"s": lambda: stacked_step(net, params, x, y)}, max(5, reps // 4), 1)["s"]
    leaf = femnist_cnn((1, 28, 28), 62, hidden=248)
    leaf_ref = femnist_cnn((1, 28, 28), 62, hidden=248)
    leaf_ref.load_state_dict(leaf.state_dict())
    leaf_ref[2], leaf_ref[5] = nn.MaxPool2d(2), nn.MaxPool2d(2)          # PyTorch's pooling
    lx, ly = torch.randn(10, 1, 28, 28), torch.randint(0, 62, (10,))
    t = cpu_times({"zoo": lambda: plain_step(leaf, lx, ly), "ref": lambda: plain_step(leaf_ref, lx, ly)},
                  max(5, reps // 4), 2)
    t_leaf = t["zoo"]
    leaf_macs = forward_macs(leaf, lx[:1])
    print(f"\nThe stacked step by chunk (batch {batch}): "
          + ", ".join(f"{c} clients {t * 1e3:.1f} ms ({t * 1e3 * 100 / c:.1f} ms per 100)" for c, t in times.items()))
    rate = 3 * macs * batch * 100 / times[100] / 1e9
    leaf_rate = 3 * leaf_macs * 10 / t_leaf / 1e9
    print(f"Multiply-adds per second, a training step counted as 3 forward passes: the digits CNN stacked, "
          f"100 clients x batch {batch} ({macs / 1e3:.0f}K a sample), {rate:.1f} G/s; the LEAF CNN, hidden "
          f"248, plain, batch 10 ({leaf_macs / 1e6:.1f}M a sample), {leaf_rate:.1f} G/s ({leaf_rate / rate:.1f}x)")
    print(f"The LEAF CNN's plain step (hidden 248, batch 10): {t['ref'] * 1e3:.2f} ms with PyTorch's pooling, "
          f"{t_leaf * 1e3:.2f} ms with the zoo's ({t['ref'] / t_leaf:.2f}x)")


if __name__ == "__main__":
    main()
