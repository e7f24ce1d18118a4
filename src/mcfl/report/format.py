"""The one number formatter, markdown-table writer and machines list of every report."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import pandas as pd

from mcfl.divergence import FACTOR


def mean_std(mean, std=None, digits: int = 1, scale: float = 1.0, sign: bool = False) -> str:
    """``mean ± std`` (times ``scale``, ``digits`` decimals, ``+`` shown if ``sign``); ``mean``
    alone when std is NaN (one seed); empty when mean is NaN."""
    if pd.isna(mean):
        return ""
    s = f"{float(mean) * scale:{'+' if sign else ''}.{digits}f}"
    return s if pd.isna(std) else s + f" ± {float(std) * scale:.{digits}f}"


#: the mark of a table cell whose mean includes a diverged run (mcfl.divergence)
DIVERGED = "†"


def diverged_cell(cell: str, n_diverged) -> str:
    """``cell`` with the diverged mark if any of its runs diverged (and it is not empty)."""
    return f"{cell} {DIVERGED}" if cell and not pd.isna(n_diverged) and int(n_diverged) > 0 else cell


def diverged_note(runs: Iterable[dict], what: Callable[[dict], str]) -> list[str]:
    """Footnote lines under a table, one per row with diverged runs: ``runs`` are records with
    ``diverged`` (metrics.json's, or None), ``seed`` and ``n_seeds`` (the row's seed count); ``what``
    names the row of a run. Empty when no run diverged."""
    rows: dict[str, list[dict]] = {}
    for r in runs:
        if r.get("diverged"):
            rows.setdefault(what(r), []).append(r)
    lines = []
    for name, rs in rows.items():
        seeds = ", ".join(f"seed {r['seed']} from round {r['diverged']['round']}" for r in rs)
        lines.append(f"{DIVERGED} {name}: {len(rs)} of {rs[0]['n_seeds']} seeds diverged ({seeds}: a loss "
                     f"above {FACTOR:g}x its lowest, the run's history.csv column `diverged`); "
                     f"the mean ± std include them.")
    return lines


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub markdown table, one line per row, ending with a newline."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, cells)) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def markdown_html(text: str, title: str) -> str:
    """A standalone HTML page of a report's markdown (headings, pipe tables, paragraphs, list
    items; inline markup kept as text), for Snakemake's report, which shows HTML inline."""
    import html
    import re

    def cells(line: str) -> list[str]:
        return [html.escape(c.strip()) for c in line.strip().strip("|").split("|")]

    body, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()):
            rows = ["<tr>" + "".join(f"<th>{c}</th>" for c in cells(line)) + "</tr>"]
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells(lines[i])) + "</tr>")
                i += 1
            # a table wider than the page scrolls inside its own box instead of being cut off
            body.append('<div class="wide">\n<table>\n' + "\n".join(rows) + "\n</table>\n</div>")
            continue
        m = re.match(r"(#{1,6})\s+(.*)", line)
        if m:
            n = len(m.group(1))
            body.append(f"<h{n}>{html.escape(m.group(2))}</h{n}>")
        elif line.startswith(("- ", "* ")):
            body.append(f"<li>{html.escape(line[2:])}</li>")
        elif line.strip() and not line.startswith("<!--"):
            body.append(f"<p>{html.escape(line)}</p>")
        i += 1
    style = ("body{font-family:sans-serif;font-size:14px} table{border-collapse:collapse} "
             ".wide{max-width:100%;overflow-x:auto} "
             "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right} "
             "th:nth-child(-n+3),td:nth-child(-n+3){text-align:left} th{background:#f3f3f3}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def machine(m: dict) -> str:
    """A run's machine in words, from its metrics.json (device, CPU kernels, threads, torch, and the
    precision local training computed in when it is not fp32). A run resumed on another machine
    names each one with its rounds (``segments``, runner.py)."""
    def one(s: dict) -> str:
        name = s.get("device_name")
        precision = s.get("precision", m.get("precision", "fp32"))
        return (f"{s.get('device', '?')}{f' {name}' if name else ''} ({s.get('cpu', '?')}, "
                f"{s.get('threads', '?')} thread(s), torch {s.get('torch', '?')}"
                f"{f', {precision}' if precision != 'fp32' else ''})")

    parts: list[list] = []                     # consecutive segments of one machine merge
    for s in m.get("segments") or []:
        if parts and parts[-1][0] == one(s):
            parts[-1][2] = s["to"]
        else:
            parts.append([one(s), s["from"], s["to"]])
    if len(parts) < 2:
        return one(m)
    return " + ".join(f"{w} rounds {a}-{b}" for w, a, b in parts)


def machines(runs: Iterable[dict]) -> str:
    """The machines of some runs, one cell: sorted, ``; ``-joined."""
    return "; ".join(sorted({machine(m) for m in runs}))


def machines_section(t: pd.DataFrame, columns: Mapping[str, str], row: Callable[[pd.Series], str]) -> list[str]:
    """Markdown lines, one per machine: the cells it made, as ``row(r)`` of each row whose
    ``columns[name]`` cell (made by ``machines``) names it, grouped by ``name`` when there are several
    columns. With one machine the line is just the machine: it made every cell."""
    seen = sorted({x for col in columns.values() if col in t for v in t[col] if isinstance(v, str) and v
                   for x in v.split("; ")})
    lines = []
    for m in seen:
        made = [(name, [row(r) for _, r in t.iterrows() if m in str(r.get(col, "")).split("; ")])
                for name, col in columns.items()]
        cells = "; ".join(f"{name + ': ' if len(columns) > 1 else ''}{', '.join(rows)}" for name, rows in made if rows)
        lines.append(f"- {m}{': ' + cells if len(seen) > 1 else ''}")
    return lines
