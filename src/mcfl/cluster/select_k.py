"""Selecting K (FeSEM §5.2, "Selection of K"): the settings of a ``K: auto`` run's search
(``select_k`` block), the sampled clients' sub-store it trains on, and its result file (read by
``mcfl train --k-from``) and report. The search itself trains through the runner:
:func:`mcfl.select_k.select_k`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mcfl.data.write import write_arrays
from mcfl.inputs import InputError, read_json
from mcfl.io import atomic_path, staged, write_text


@dataclass
class SelectK:
    K: list[int] = field(default_factory=lambda: [2, 3, 4, 5])
    clients: int = 100
    rounds: int = 3
    criterion: str = "accuracy"      # accuracy | distance

    def __post_init__(self):
        if self.criterion not in ("accuracy", "distance"):
            raise ValueError(f"criterion must be 'accuracy' or 'distance', got {self.criterion!r}")
        if not self.K or any(not isinstance(k, int) or k < 1 for k in self.K):
            raise ValueError(f"K must be a non-empty list of positive integers, got {self.K!r}")


def select_k_settings(entry: dict) -> SelectK:
    return SelectK(**entry.get("select_k", {}))


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
