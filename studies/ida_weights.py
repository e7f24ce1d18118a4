"""How IDA's aggregation weights relate to the clients' training-set sizes on the real writers of
config/femnist-sample/fedgsp.yaml (FedGSP's Table 1), against FedAvg's size-proportional weights.

IDA (mcfl.algorithms.ida) weights each local model by the inverse of its distance to the round's
plain average, ignoring how much data the client holds; FedAvg weights by size. For rounds 1..R the
script trains the round's clients from the current global model, prints the Spearman correlation
between size and IDA weight, the share of the round's weight that the largest quarter of the
clients get under IDA and under FedAvg, and IDA's largest / smallest weight; the global model then
moves by a FedAvg step, so later rounds start from a partly trained model.

    python studies/ida_weights.py --rounds 6
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import add_config_args, config_runs, machine, pick_run  # noqa: E402


def main(argv=None) -> int:
    from scipy.stats import spearmanr

    from mcfl.algorithms.ida import ida_weights
    from mcfl.engine import Task
    from mcfl.federation import build_federation
    from mcfl.trainspec import TrainSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_args(ap)
    ap.add_argument("--run", default="IDA", help="run id in the config whose settings are used")
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    runs, data = config_runs(a.config, a.store)
    run = pick_run(runs, a.run, a.config)
    fed = build_federation(data, run["model"], TrainSpec.of(run["train"]), run["seed"], torch.device("cpu"))
    print(f"# IDA weights against training-set sizes, {a.config[-1].name}, run {a.run}, seed {run['seed']}")
    print(f"# {machine(torch.device('cpu'))}")
    print("| round | clients | sizes | Spearman(size, IDA weight) | p | largest quarter: IDA share "
          "| FedAvg share | IDA max / min |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    w = fed.w0.clone()
    for r in range(1, a.rounds + 1):
        res = [x for _, x in fed.trainer.run((Task(int(c), w) for c in fed.clients(r)), r)]
        W = torch.stack([x.weights for x in res])
        n = torch.tensor([x.n_samples for x in res], dtype=torch.float64)
        ida = ida_weights(W, fed.model.n_params)
        avg = n / n.sum()
        top = n.argsort()[-max(1, len(n) // 4):]
        rho = spearmanr(n.numpy(), ida.numpy())
        print(f"| {r} | {len(n)} | {int(n.min())}-{int(n.max())} | {rho.statistic:+.2f} | {rho.pvalue:.2g} "
              f"| {float(ida[top].sum()):.3f} | {float(avg[top].sum()):.3f} "
              f"| {float(ida.max() / ida.min()):.2f} |", flush=True)
        w = avg.to(W.dtype) @ W
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
