"""The one number formatter and markdown-table writer of every report."""

from __future__ import annotations

from typing import Iterable, Sequence

import pandas as pd


def mean_std(mean, std=None, digits: int = 1, scale: float = 1.0, sign: bool = False) -> str:
    """``mean ± std`` (times ``scale``, ``digits`` decimals, ``+`` shown if ``sign``); ``mean``
    alone when std is NaN (one seed); empty when mean is NaN."""
    if pd.isna(mean):
        return ""
    s = f"{float(mean) * scale:{'+' if sign else ''}.{digits}f}"
    return s if pd.isna(std) else s + f" ± {float(std) * scale:.{digits}f}"


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub markdown table, one line per row, ending with a newline."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, cells)) + " |" for cells in rows]
    return "\n".join(lines) + "\n"
