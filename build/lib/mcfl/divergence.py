"""Divergence watch: marks the rounds where a run's loss jumps far above its best so far.

A non-finite loss or weight stops a run at once (:class:`mcfl.errors.DivergenceError`: there is no
model left to evaluate). A finite jump does not: SGD can blow a model up and leave it finite (a
sequential FedGSP chain went from 96.2% to 15.4% test accuracy in one round, train loss 0.08 ->
1.11, test loss 10.4), and the final metrics would then be averaged into a table like any other
seed. The runner therefore checks every round's row:

    a watched loss L_r is a jump when  L_r > FACTOR * max(min_{s<r} L_s, FLOOR)

for ``train_loss`` (every round) and ``test_loss`` (evaluation rounds), each against its own
running minimum. The floor keeps a model that has memorised its clients (train loss 1e-4) from
being flagged for the ordinary minibatch noise of a later round (0.05); with FACTOR 10 and FLOOR
0.1 a loss is a jump only above 1.0 nats once the run has been below 0.1, or above 10x its best.
The run goes on; the round is marked in ``history.csv`` (column ``diverged``: the reason, blank on
other rounds), ``metrics.json`` gets ``diverged: {round, reason, rounds}`` (the first flagged
round, its reason, and every flagged round), the log a warning, and the report tables a mark
(:mod:`mcfl.report.format`). A run that never jumps has neither the column nor the key, so its
outputs are those of a run made before this watch existed.
"""

from __future__ import annotations

import math
from typing import Iterable

#: a loss this many times its running minimum (or the floor, if higher) is a jump
FACTOR = 10.0
#: losses (nats) below this count as this when compared: noise on a memorised model is no jump
FLOOR = 0.1
#: the history columns watched
WATCHED = ("train_loss", "test_loss")
#: the history column and ``metrics.json`` key that mark a jump
COLUMN = "diverged"


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class DivergenceWatch:
    """Running minimum of every watched loss; ``check(row)`` says why the row is a jump, or None."""

    def __init__(self, factor: float = FACTOR, floor: float = FLOOR, watched: Iterable[str] = WATCHED):
        if not factor > 1:
            raise ValueError(f"divergence factor must be > 1, got {factor}")
        if not floor >= 0:
            raise ValueError(f"divergence floor must be >= 0, got {floor}")
        self.factor, self.floor, self.watched = float(factor), float(floor), tuple(watched)
        self.best: dict[str, float] = {}

    def check(self, row: dict) -> str | None:
        """The reason ``row`` is a jump against the rows seen before it (None: it is not); then
        the row's losses join the running minima."""
        reasons = []
        for key in self.watched:
            v = _number(row.get(key))
            if v is None:
                continue
            best = self.best.get(key)
            if best is not None and v > self.factor * max(best, self.floor):
                reasons.append(f"{key} {v:.4g} > {self.factor:g} x max(lowest {best:.4g}, {self.floor:g})")
            self.best[key] = v if best is None else min(best, v)
        return "; ".join(reasons) or None

    def replay(self, rows: Iterable[dict]) -> None:
        """Take the minima of rows already trained (a resumed run's history), marking nothing."""
        for row in rows:
            self.check(row)


def summary(rows: list[dict]) -> dict | None:
    """``{round, reason, rounds}`` of the flagged rows of a history (None if none is flagged)."""
    flagged = [r for r in rows if isinstance(r.get(COLUMN), str) and r[COLUMN]]
    if not flagged:
        return None
    return {"round": int(flagged[0]["round"]), "reason": flagged[0][COLUMN],
            "rounds": [int(r["round"]) for r in flagged]}
