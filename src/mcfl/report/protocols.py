"""FeSEM's Table 2 under three training protocols, side by side with the paper.

One row per method label (config order), in percent micro accuracy (mean ± std over seeds):

* ``paper``: FeSEM's journal Table 2 (``paper_tables.csv``), where the paper has the row and the
  runs are on FEMNIST (runs whose metrics.json names another data source, e.g. digits, get an
  empty column, a note saying why and, unless a title is given, a title naming their dataset);
* ``paper_protocol``: our runs of the paper's *training* protocol (a second results directory, e.g.
  ``config/femnist-sample/paper.yaml``'s) scored with the authors' V1 evaluation (``v1/…``
  columns), blank where those runs do not exist (yet);
* ``authors``: our runs of the authors' code settings (a third results directory, e.g.
  ``config/femnist-sample/authors.yaml``'s: FeSEM as the authors' recorded command runs it, each
  baseline with their code's settings), scored with V1 too; blank where those runs do not exist,
  and the Markdown says "not run yet" in every row while none does (the Markdown has this column
  only when a results directory is named for it);
* ``standard``: our runs of this config, standard evaluation (:mod:`mcfl.evaluation`);
* one column per named evaluation protocol of the same runs (``v1``, ``v2``, ``active`` ...): the
  same trained models scored with the authors' choices, each alone and together;
* ``diff_vs_ref``: the paired difference to the reference method (FedAvg) under the standard
  protocol, mean ± std over seeds of (this seed's accuracy - the reference's same seed), and the
  exact two-sided sign test over test images (McNemar: the images only one of the two classifies
  correctly, summed over seeds, from the runs' ``predictions.csv``);
* ``authors_clusters_by_seed``: each clustered authors' code run's final clusters (sizes in
  clients, largest first; in brackets the test images of the smallest), since V1 averages clusters
  without weights;
* ``authors_minutes_by_seed``: what each authors' code run's rounds took on its machine, so a
  reader can plan the study's compute;
* ``seeds`` and ``machine`` (each run's device and CPU, from its ``metrics.json``), and the seeds
  and machines of the paper-protocol and authors' code columns.

Files: ``<out>.csv`` (numbers) and ``<out>.md`` (the table, the protocol switches, and the machines).
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from mcfl.io import atomic_path, read_run, staged, write_text
from mcfl.metrics import paired_counts, sign_test_p
from mcfl.report.format import machines, machines_section, markdown_table, mean_std
from mcfl.report.paper import paper_tables

METRIC = "micro_acc"
TITLE = "FeSEM's Table 2 on real FEMNIST writers"   # the table's heading unless a config names one
PAPER_EVAL = "v1"          # the named protocol that scores the paper-protocol runs as the authors did
AUTHORS_NOTE = ("*Authors' code*: FeSEM as the authors' recorded command trains it (10 local epochs, "
                "lr 0.003, 2 clients of each cluster a round, 250 rounds, their 248-unit CNN, last-layer "
                "distance) and each baseline with their code's settings, scored with V1 too")


def load(run_dirs: list[str | Path]) -> list[dict]:
    """Each finished run's metrics.json with its per-test-image hits where predictions.csv exists."""
    need = ("label", "seed", "final", f"final.{METRIC}")
    return [read_run(d, predictions=True, clusters=True, need=need) for d in run_dirs]


def finished(results_dir: str | Path | None) -> list[Path]:
    """The finished run directories (with a metrics.json) under a results directory, if any."""
    if not results_dir or not Path(results_dir).is_dir():
        return []
    return sorted(Path(f).parent for f in glob.glob(os.path.join(results_dir, "runs", "*", "*", "*", "metrics.json")))


def protocol_names(runs: list[dict]) -> list[str]:
    """The named evaluation protocols the runs were scored with, in first-seen order."""
    names: dict[str, None] = {}
    for m in runs:
        for k in m["final"]:
            if k.endswith("/" + METRIC):
                names.setdefault(k.split("/")[0])
    return list(names)


def _stats(values: list[float]) -> tuple[float, float]:
    v = np.asarray([x for x in values if x is not None and not pd.isna(x)], dtype=float) * 100
    if not len(v):
        return np.nan, np.nan
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else np.nan


def cluster_sizes(run: dict) -> str:
    """A run's final clusters: their sizes in clients, largest first, and in brackets the test
    images of the smallest (``"102+3 (3)"``); ``""`` for a run without clusters."""
    of = run.get("cluster_of")
    if not of:
        return ""
    sizes = sorted(Counter(of.values()).items(), key=lambda kv: -kv[1])
    text = "+".join(str(n) for _, n in sizes)
    if len(sizes) > 1 and "client" in run:
        smallest = sizes[-1][0]
        text += f" ({sum(of.get(c) == smallest for c in run['client'])})"
    return text


def minutes(run: dict) -> str:
    """What a run's rounds took on its machine, in minutes: its training, aggregation and
    evaluation seconds summed over every round (``time_s`` of its ``metrics.json``, a resumed run's
    earlier rounds included); ``""`` where the run did not record them."""
    t = run.get("time_s")
    return f"{sum(t.values()) / 60:.0f}" if t else ""


def paired(mine: list[dict], ref: dict[int, dict], prefix: str = "", key: str = METRIC) -> dict:
    """One method's runs against the reference's runs of the same seeds (``ref``: seed -> run):
    ``paired_seeds``, the paired difference of ``key`` in points (``diff_vs_ref_mean``/``_std``) and,
    where both runs of a seed wrote the same test images' predictions, the images only this / only
    the reference classifies correctly (summed over seeds) with their exact sign test; every key
    with ``prefix``."""
    both = [m for m in mine if m["seed"] in ref]
    out: dict = {"paired_seeds": len(both)}
    d = [m["final"].get(key) - ref[m["seed"]]["final"].get(key) for m in both
         if m["final"].get(key) is not None and ref[m["seed"]]["final"].get(key) is not None]
    if d:
        out["diff_vs_ref_mean"], out["diff_vs_ref_std"] = _stats(d)
    counts = [paired_counts(m["hit"], ref[m["seed"]]["hit"]) for m in both
              if "hit" in m and "hit" in ref[m["seed"]] and np.array_equal(m["y"], ref[m["seed"]]["y"])]
    if counts:
        out["only_this"], out["only_ref"] = (int(sum(c[i] for c in counts)) for i in (0, 1))
        out["sign_p"] = sign_test_p(out["only_this"], out["only_ref"])
    return {prefix + k: v for k, v in out.items()}


#: the data sources whose runs the paper's FEMNIST numbers may stand beside (``leaf_json``: LEAF's
#: own JSON, which is how FEMNIST comes from LEAF's scripts)
PAPER_SOURCES = ("femnist", "leaf_json")


def other_datasets(runs: list[dict]) -> list[str]:
    """The datasets of ``runs`` whose recorded data source (metrics.json's ``config.data.source``)
    is not FEMNIST's, e.g. ``["digits"]``: the paper's numbers do not belong beside them. A run
    that records no source is taken to be on the paper's data."""
    other = {}
    for m in runs:
        data = (m.get("config") or {}).get("data") if isinstance(m.get("config"), dict) else None
        source = data.get("source") if isinstance(data, dict) else None
        if source is not None and source not in PAPER_SOURCES:
            other.setdefault(str(m.get("dataset", source)))
    return list(other)


def table(runs: list[dict], paper_runs: list[dict], reference: str = "FedAvg",
          authors_runs: list[dict] | None = None, paper_numbers: bool = True) -> pd.DataFrame:
    """The numbers of the table: one row per method label (config order), then one per label only
    the authors' code runs have (their settings switched one at a time), with those columns alone.
    Without ``paper_numbers`` (runs on another dataset than FEMNIST) the paper's column is empty."""
    authors_runs = authors_runs or []
    paper = paper_tables()
    paper = paper[(paper["paper"] == "journal") & (paper["dataset"] == "FEMNIST") & (paper["metric"] == METRIC)]
    paper = dict(zip(paper["method"], zip(paper["value"], paper["std"]))) if paper_numbers else {}
    names = protocol_names(runs)
    ref = {m["seed"]: m for m in runs if m["label"] == reference}
    authors_ref = {m["seed"]: m for m in authors_runs if m["label"] == reference}
    rows = []
    for label in dict.fromkeys([m["label"] for m in runs] + [m["label"] for m in authors_runs]):
        mine = sorted((m for m in runs if m["label"] == label), key=lambda m: m["seed"])
        row = {"method": label, "seeds": len(mine)}
        row["paper_mean"], row["paper_std"] = paper.get(label, (np.nan, np.nan))
        pp = [m for m in paper_runs if m["label"] == label]
        row["paper_protocol_mean"], row["paper_protocol_std"] = _stats(
            [m["final"].get(f"{PAPER_EVAL}/{METRIC}") for m in pp])
        row["paper_protocol_seeds"] = len(pp)
        ac = [m for m in authors_runs if m["label"] == label]
        row["authors_mean"], row["authors_std"] = _stats([m["final"].get(f"{PAPER_EVAL}/{METRIC}") for m in ac])
        row["authors_by_seed"] = " / ".join(           # V1 scores few clients: its seeds can differ widely
            "" if v is None else f"{100 * v:.1f}"
            for v in (m["final"].get(f"{PAPER_EVAL}/{METRIC}") for m in sorted(ac, key=lambda m: m["seed"])))
        clusters = [cluster_sizes(m) for m in sorted(ac, key=lambda m: m["seed"])]
        row["authors_clusters_by_seed"] = " / ".join(clusters) if any(clusters) else ""
        took = [minutes(m) for m in sorted(ac, key=lambda m: m["seed"])]
        row["authors_minutes_by_seed"] = " / ".join(t or "?" for t in took) if any(took) else ""
        row["authors_seeds"] = len(ac)
        row["authors_standard_mean"], row["authors_standard_std"] = _stats([m["final"][METRIC] for m in ac])
        row["standard_mean"], row["standard_std"] = _stats([m["final"][METRIC] for m in mine])
        for n in names:
            row[f"{n}_mean"], row[f"{n}_std"] = _stats([m["final"].get(f"{n}/{METRIC}") for m in mine])
        if label != reference:
            if mine:
                row.update(paired(mine, ref))
            if ac:          # the authors' code runs against the authors' code reference, V1 and standard
                row.update(paired(ac, authors_ref, "authors_"))
                v1 = paired(ac, authors_ref, "", f"{PAPER_EVAL}/{METRIC}")
                row["authors_v1_diff_mean"], row["authors_v1_diff_std"] = (v1.get(k, np.nan) for k in (
                    "diff_vs_ref_mean", "diff_vs_ref_std"))
        row["machine"] = machines(mine)
        row["paper_protocol_machine"] = machines(pp)
        row["authors_machine"] = machines(ac)
        rows.append(row)
    return pd.DataFrame(rows)


def _p(p) -> str:
    return "" if pd.isna(p) else (f"{p:.2g}" if p >= 1e-3 else "<0.001")


def _n_machines(r: pd.Series, key: str) -> int:
    """How many machines a cell's runs ran on (``key``: its machines column, made by
    :func:`~mcfl.report.format.machines`)."""
    v = r.get(key)
    return len(v.split("; ")) if isinstance(v, str) and v else 0


def _seeded(r: pd.Series, key: str, absent: str) -> str:
    """A column's cell: mean ± std, its seed count and (when several) machines, or ``absent`` where
    the row has no run."""
    n = int(r[f"{key}_seeds"])
    if not n:
        return absent
    m = _n_machines(r, f"{key}_machine")
    return f"{mean_std(r[f'{key}_mean'], r[f'{key}_std'])} ({n} seed{'s' if n > 1 else ''}{f', {m} machines' if m > 1 else ''})"


def to_markdown(t: pd.DataFrame, names: list[str], reference: str, title: str, authors: bool = False,
                note: str = "") -> str:
    """The Markdown page; ``authors``: with the authors' code column (a config that names its results);
    ``note``: a sentence put after the explanation of the table."""
    ms = lambda r, k: mean_std(r[f"{k}_mean"], r[f"{k}_std"])  # noqa: E731
    head = ["method", "paper (Table 2)", "ours: paper's protocol", "ours: authors' code", "ours: standard",
            f"Δ vs {reference} (standard)", f"images only this / only {reference}", "sign test p", "seeds"]
    if not authors:
        head.remove("ours: authors' code")
    authors_ran = t["authors_seeds"].sum() > 0
    rows = []
    ours = t[t["seeds"] > 0]                    # the authors' code switches have their own section
    for _, r in ours.iterrows():
        pp = _seeded(r, "paper_protocol", "not run")
        ac = _seeded(r, "authors", "not run" if authors_ran else "not run yet")
        counts = "" if pd.isna(r.get("only_this")) else f"{int(r['only_this'])} / {int(r['only_ref'])}"
        diff = mean_std(r.get("diff_vs_ref_mean"), r.get("diff_vs_ref_std"), sign=True)
        if diff and r["paired_seeds"] < r["seeds"]:     # the reference lacks some of this row's seeds
            diff += f" ({int(r['paired_seeds'])} of {int(r['seeds'])} seeds)"
        m = _n_machines(r, "machine")
        standard = ms(r, "standard") + (f" ({m} machines)" if m > 1 else "")
        rows.append([r["method"], ms(r, "paper"), pp, *([ac] if authors else []), standard, diff,
                     counts, _p(r.get("sign_p")), int(r["seeds"])])
    out = [f"# {title}", "",
           "Micro accuracy in percent, mean ± std over seeds. *Paper's protocol*: the paper's training "
           f"settings, scored with the authors' V1 evaluation (`{PAPER_EVAL}`). "
           + (AUTHORS_NOTE + ("" if authors_ran else " (this study has not been run yet)") + ". " if authors else "")
           + "*Standard*: every client "
           "tested on its own model, no fine-tuning. Δ: paired over seeds against the same seed's "
           f"{reference} (only the seeds both have); the sign test counts the test images only one of the two classifies correctly "
           "(summed over seeds; exact two-sided binomial). A cell whose seeds ran on more than one machine "
           "says how many; *Machines* below names them." + (f" {note}" if note else ""), "",
           markdown_table(head, rows)]
    if names:
        out += ["## The same trained models under the authors' evaluation choices", "",
                "Each column scores the standard protocol's trained models again (mcfl.evaluation): "
                "`active` = the round's active clients only; `finetune` = those after one epoch of local "
                "fine-tuning; `cluster_mean` = unweighted mean over clusters; `v1` = all three (the "
                "authors' V1 code); `v2` = every client on every cluster model, max over clusters "
                "(V2; methods without clusters, NoFed included, as the standard).", "",
                markdown_table(["method", "standard"] + [f"`{n}`" for n in names],
                               [[r["method"], ms(r, "standard")] + [ms(r, n) for n in names]
                                for _, r in ours.iterrows()])]
    if authors_ran:
        out += authors_section(t, reference)
    out += ["## Machines", "", *machines_section(t, {"standard": "machine", "paper's protocol": "paper_protocol_machine",
                                                    "authors' code": "authors_machine"},
                                                 lambda r: r["method"]), ""]
    return "\n".join(out)


def authors_section(t: pd.DataFrame, reference: str) -> list[str]:
    """The authors' code runs against the authors' code reference (the rows that have runs): the
    paper's own margin, then V1 and the standard evaluation, each paired over seeds."""
    ms = lambda r, k: mean_std(r.get(f"{k}_mean"), r.get(f"{k}_std"))  # noqa: E731
    ref = t[t["method"] == reference]
    paper_ref = float(ref["paper_mean"].iloc[0]) if len(ref) else np.nan
    rows = []
    for _, r in t[t["authors_seeds"] > 0].iterrows():
        this = r["method"] != reference
        margin = r["paper_mean"] - paper_ref if this else np.nan
        counts = "" if pd.isna(r.get("authors_only_this")) else \
            f"{int(r['authors_only_this'])} / {int(r['authors_only_ref'])}"
        diff = lambda k: mean_std(r.get(f"{k}_mean"), r.get(f"{k}_std"), sign=True) if this else ""  # noqa: E731
        paired_n = r.get("authors_paired_seeds")
        seeds = f"{int(r['authors_seeds'])}" + ("" if not this or pd.isna(paired_n) or paired_n == r["authors_seeds"]
                                               else f" ({int(paired_n)} paired)")
        rows.append([r["method"], "" if pd.isna(margin) else f"{margin:+.1f}", ms(r, "authors"), r["authors_by_seed"],
                     r["authors_clusters_by_seed"], diff("authors_v1_diff"), ms(r, "authors_standard"), diff("authors_diff_vs_ref"), counts,
                     _p(r.get("authors_sign_p")) if this else "", seeds, r["authors_minutes_by_seed"]])
    return ["## Under the authors' code settings", "",
            f"The authors' code runs (the column above) against the {reference} trained with the authors' "
            f"code settings, seed by seed. *Paper's Δ*: the paper's Table 2 value minus its {reference}. "
            "*V1*: the authors' evaluation, which scores only the round's trained clients after local "
            "fine-tuning; those clients differ from run to run, so its Δ is paired over seeds only, and "
            "with few of them a seed's score can sit far from the others' (*V1 by seed*, seeds in order). "
            "*Clusters by seed*: each clustered run's final clusters, their sizes in writers and in "
            "brackets the test images of the smallest; V1 averages its clusters' scores unweighted, so "
            "a small cluster weighs as much as a large one. "
            "*Standard*: the same trained models with every client tested on its own model, so the sign "
            "test can count the test images only one of the two classifies correctly (summed over "
            "seeds; exact two-sided binomial). Rows the table above lacks are variants of the authors' code "
            "runs: one of their settings switched back, or another model (the run's name says which). "
            "*Minutes by seed*: what each run's rounds took on its machine (training, aggregation and "
            "evaluation, summed over its rounds; not the job's start-up, nor FeSEM's first local models, "
            "made by a job of their own), seeds in order; other jobs may have shared the machine.", "",
            markdown_table(["method", f"paper's Δ vs {reference}", "ours: V1", "V1 by seed", "clusters by seed",
                            f"Δ vs {reference} (V1)",
                            "ours: standard", f"Δ vs {reference} (standard)", f"images only this / only {reference}",
                            "sign test p", "seeds", "minutes by seed"], rows)]


def write(run_dirs: list[str | Path], out: str | Path, *, paper_results: str | Path | None = None,
          reference: str = "FedAvg", title: str | None = None,
          authors_results: str | Path | None = None) -> pd.DataFrame:
    """Write ``<out>.csv`` and ``<out>.md`` from this config's runs, the paper-protocol runs and the
    authors' code runs (each results directory's finished runs, if any)."""
    runs, paper_runs = load(run_dirs), load(finished(paper_results))
    authors_runs = load(finished(authors_results))
    if not any(m["label"] == reference for m in runs):
        raise ValueError(f"protocols.reference: no run labelled {reference!r} among the {len(runs)} runs "
                         f"(labels: {sorted({m['label'] for m in runs})})")
    other = other_datasets(runs)
    t = table(runs, paper_runs, reference, authors_runs, paper_numbers=not other)
    note = (f"The paper's column is left empty: these runs are on {', '.join(other)}, not on FEMNIST, "
            f"the dataset of the paper's Table 2." if other else "")
    title = title or (f"FeSEM's Table 2 protocols on {', '.join(other)}" if other else TITLE)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with staged(out.parent) as stage:          # both files or neither (mcfl.io.staged)
        with atomic_path(stage / out.with_suffix(".csv").name) as tmp:
            t.round(4).to_csv(tmp, index=False)
        write_text(stage / out.with_suffix(".md").name, to_markdown(t, protocol_names(runs), reference, title,
                                                         authors=authors_results is not None, note=note))
    return t
