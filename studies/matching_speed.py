"""FeSEM-MA's M-step on the FEMNIST CNN: matched averaging of a cluster's local models with the
identity shortcut (:func:`mcfl.algorithms.matching.assignment`) against the Hungarian method on
every layer, in the same run, and a check that both give the same average bit for bit.

The local models are the reference plus a small perturbation (what one local epoch from the
cluster's centre gives), so each unit stays nearest its own index, as on the real writers, where
the matching never chose anything but the identity in 250 rounds. The shortcut saves the Hungarian
method and the cost matrix's copy to the host; the squared distances themselves (a float64
product of every unit pair) are computed either way, and on a CPU they are most of the time.

    python studies/matching_speed.py                     # 10 members, hidden 2048, CPU
    python studies/matching_speed.py --device cuda --members 10 --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import machine  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, kind, default in (("--members", int, 10), ("--hidden", int, 2048), ("--repeats", int, 2),
                                ("--device", str, "cpu"), ("--threads", int, 1)):
        ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--noise", type=float, default=1e-3, help="local models: reference + noise x N(0, 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from scipy.optimize import linear_sum_assignment

    from mcfl.algorithms import matching
    from mcfl.engine import FlatModel
    from mcfl.models import build

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = FlatModel(build("femnist_cnn", (1, 28, 28), 62, hidden=args.hidden), device)
    layers = matching.plan(model)
    ref = model.flat.to(device)
    models = ref + args.noise * torch.randn(args.members, ref.numel(), device=device)
    weights = np.ones(args.members)

    def hungarian(cost):
        _, col = linear_sum_assignment(cost.cpu().numpy())
        return torch.from_numpy(np.asarray(col, dtype=np.int64)).to(cost.device)

    def timed(fn):
        best, out = float("inf"), None
        for _ in range(args.repeats):
            t = time.perf_counter()
            out = fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t)
        return best, out

    print(f"# FeSEM-MA M-step: {args.members} members, femnist_cnn hidden {args.hidden} "
          f"({ref.numel():,} parameters)\n# {machine(device)}")
    fast_s, fast = timed(lambda: matching.matched_average(models, weights, ref, layers))
    shortcut = matching.assignment
    matching.assignment = hungarian
    try:
        slow_s, slow = timed(lambda: matching.matched_average(models, weights, ref, layers))
    finally:
        matching.assignment = shortcut
    print(f"Hungarian on every layer: {slow_s:.3f} s; identity shortcut: {fast_s:.3f} s; "
          f"{slow_s / fast_s:.1f}x; same average bit for bit: {torch.equal(fast, slow)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
