"""Selecting K (FeSEM §5.2, "Selection of K"): the search.

"The most straightforward solution is to run the algorithm using different K and then select the K
with the best performance in terms of accuracy or intra-cluster distance. [...] we can randomly
select 100 nodes and test K in FL with three communication rounds only, and then apply the K to the
large-scale FL."

:func:`select_k` does exactly that for one run whose method entry says ``K: auto``: it draws
``clients`` clients (seeded by the run's seed), writes them to a temporary sub-store, and for each
candidate K trains the run's own method and settings for ``rounds`` rounds with every sampled client
in every round, through the ordinary runner (centre initialisation included). It then picks

* ``accuracy``: the K with the highest micro accuracy on the sampled clients' test data, or
* ``distance``: the K with the smallest intra-cluster distance of the last round (mean squared
  distance of the local models to their nearest centre; FeSEM-type methods report it). This favours
  large K; it is the paper's rule, taken literally.

Ties go to the smaller K. The result (chosen K, every candidate's scores, the sampled clients) is a
JSON file; the Snakemake rule ``select_k`` writes it and training reads the K from it
(``mcfl train --k-from``, :func:`read_k`); :func:`write_select_k_report` tabulates the results. The
settings (:class:`~mcfl.cluster.spec.SelectK`) are validated with the config.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from mcfl.cluster.spec import SelectK
from mcfl.data.store import load
from mcfl.data.write import write_arrays
from mcfl.inputs import InputError, read_json
from mcfl.io import atomic_path, staged, write_json, write_text
from mcfl.runner import train
from mcfl.streams import SELECT_K, derive_seed


def select_k(run: dict, store, out, *, device: str = "auto", threads: int = 1) -> dict:
    """Run the K search for ``run`` (whose ``select_k`` block holds the settings); write ``out``."""
    sk = SelectK(**run["select_k"])
    data = load(store)
    rng = np.random.default_rng(derive_seed(run["seed"], SELECT_K))
    chosen = np.sort(rng.choice(data.n_clients, size=min(sk.clients, data.n_clients), replace=False))
    if max(sk.K) > len(chosen):
        raise ValueError(f"select_k: K={max(sk.K)} is larger than the {len(chosen)} sampled clients")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scores = []
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".select_k.") as tmp:
        sub = sub_store(data, chosen, Path(tmp) / "store")
        for K in sk.K:
            r = dict(run, params={**run["params"], "K": K}, label=f"{run['label']}:K={K}",
                     train={**run["train"], "rounds": sk.rounds, "eval_every": sk.rounds,
                            "clients_per_round": None, "checkpoint_every": 0})
            final = train(r, sub, Path(tmp) / f"K{K}", device=device, threads=threads, progress=False)["final"]
            if sk.criterion == "distance" and "intra_distance" not in final:
                raise ValueError(f"select_k: {run['method']} reports no intra-cluster distance; "
                                 f"use criterion: accuracy")
            scores.append({"K": K, **{k: final[k] for k in ("micro_acc", "macro_acc", "intra_distance", "ari")
                                      if k in final}})
    key = (lambda s: (-s["micro_acc"], s["K"])) if sk.criterion == "accuracy" else \
        (lambda s: (s["intra_distance"], s["K"]))
    best = min(scores, key=key)["K"]
    result = {"dataset": run["dataset"], "label": run["label"], "method": run["method"],
              "seed": run["seed"], "K": int(best), "settings": dataclasses.asdict(sk),
              "scores": scores, "clients": chosen.tolist()}
    write_json(out, result)
    return result


def sub_store(data, clients: np.ndarray, out: Path) -> Path:
    """A store holding only ``clients`` of ``data`` (in that order)."""
    arrays: dict[str, np.ndarray] = {"cluster": np.asarray(data.cluster)[clients]}
    for split in ("train", "test"):
        off = np.asarray(getattr(data, f"offsets_{split}"))
        rows = np.concatenate([np.arange(off[c], off[c + 1]) for c in clients])
        arrays[f"x_{split}"] = np.asarray(getattr(data, f"x_{split}")[rows])
        arrays[f"y_{split}"] = np.asarray(getattr(data, f"y_{split}")[rows])
        arrays[f"offsets_{split}"] = np.concatenate([[0], np.cumsum(off[clients + 1] - off[clients])])
    meta = {k: v for k, v in data.meta.items() if k not in ("files", "content_hash")}
    meta.update(client_ids=[data.client_ids[c] for c in clients], n_clients=len(clients),
                n_train=int(arrays["offsets_train"][-1]), n_test=int(arrays["offsets_test"][-1]),
                params={**meta.get("params", {}), "subset_of": data.content_hash})
    return write_arrays(out, arrays, meta)


def read_k(path) -> int:
    try:
        return int(read_json(path, what="select-k result")["K"])
    except InputError as e:                     # not JSON, not a regular file, too large
        raise ValueError(f"{path}: not a select-k result ({str(e).removeprefix(f'{path}: ')}); rerun "
                         f"the select_k rule") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a select-k result ({type(e).__name__}: {e}); rerun the "
                         f"select_k rule") from None


def write_select_k_report(files: list[Path], out: Path) -> None:
    """``select_k.csv`` (one row per search and candidate K) and ``select_k.md`` (chosen K per
    dataset, label and seed, with every candidate's micro accuracy)."""
    import pandas as pd                      # (only for this report)

    results = [read_json(f, what="select-k result") for f in files]
    rows = [{"dataset": r["dataset"], "label": r["label"], "seed": r["seed"],
             "criterion": r["settings"]["criterion"], "chosen_K": r["K"], **s} for r in results
            for s in r["scores"]]
    lines = ["# K selection (FeSEM §5.2)", "",
             "| dataset | method | seed | criterion | chosen K | micro acc (%) per candidate K |",
             "|---|---|---|---|---|---|"]
    for r in results:
        cand = ", ".join(f"K={s['K']}: {100 * s['micro_acc']:.1f}" for s in r["scores"])
        lines.append(f"| {r['dataset']} | {r['label']} | {r['seed']} | {r['settings']['criterion']} | "
                     f"{r['K']} | {cand} |")
    with staged(out) as stage:          # both files or neither (mcfl.io.staged)
        with atomic_path(stage / "select_k.csv") as tmp:
            pd.DataFrame(rows).to_csv(tmp, index=False)
        write_text(stage / "select_k.md", "\n".join(lines) + "\n")
