"""mcfl.io's CSV writer: the bytes pandas writes, without importing pandas in training jobs."""

import io

import numpy as np
import pandas as pd
import pytest

from mcfl.io import csv_text, rows_csv


def _pandas(frame: pd.DataFrame) -> str:
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return buf.getvalue()


FLOATS = [0.1, 0.2 + 0.1, 1 / 3, -0.0, 0.0, 1e-4, 9.99e-5, 1e-5, 1e15, 1e16, 123456789.123, 1e-300,
          5e-324, 1.7976931348623157e308, float("inf"), float("-inf"), 2.5, -7.0, 0.8426966292134831]


def test_rows_csv_equals_pandas():
    rng = np.random.default_rng(0)
    rows = []
    for r in range(1, 13):
        row = {"round": r, "train_loss": float(rng.random()), "moved": int(rng.integers(0, 9)),
               "f": FLOATS[r % len(FLOATS)], "np_f64": np.float64(rng.random()),
               "np_f32": np.float32(rng.random()), "np_i64": np.int64(r * 1000),
               "flag": bool(r % 2), "np_flag": np.bool_(r % 3 == 0), "name": f"c{r}, \"quoted\"\nline",
               "mixed": r if r % 2 else 0.5, "maybe_none": None if r % 4 == 0 else 1.5,
               "none": None, "nan": float("nan") if r % 2 else 1.0, "obj": [r, r + 1] if r > 6 else "x"}
        if r % 5 == 0:                              # evaluation rounds: more keys, late columns
            row.update({"micro_acc": float(rng.random()), "count": r, "ok": True,
                        "active/micro_acc": float(rng.random()), "np_f32_late": np.float32(0.1)})
        if r % 3 == 0:
            row.pop("moved")
        rows.append(row)
    rows.append({"round": 13, "train_loss": float("nan"), **{f"x{i}": FLOATS[i] for i in range(len(FLOATS))}})
    assert rows_csv(rows) == _pandas(pd.DataFrame(rows))


@pytest.mark.parametrize("n", [0, 1, 7])
def test_csv_text_of_columns_equals_pandas(n):
    rng = np.random.default_rng(n)
    ids = [f"c{i:04d}" for i in range(n)]
    cols = {"client": np.repeat(np.asarray(ids), 1) if n else np.asarray(ids, dtype=str),
            "ids": ids, "y": rng.integers(0, 10, n), "pred": rng.integers(0, 10, n).astype(np.int32),
            "f64": rng.random(n), "f32": rng.random(n).astype(np.float32),
            "nanf": np.where(rng.random(n) < 0.5, np.nan, rng.random(n)),
            "hit": rng.random(n) < 0.5, "u8": rng.integers(0, 255, n).astype(np.uint8)}
    assert csv_text(cols) == _pandas(pd.DataFrame(cols))
    # a missing column (no true clusters / an unclustered method): pandas' NA, mcfl's None
    assert csv_text({"client": ids, "true_cluster": None, "cluster": cols["y"]}) == \
        _pandas(pd.DataFrame({"client": ids, "true_cluster": pd.NA, "cluster": cols["y"]}))


def test_csv_text_of_floats_equals_pandas():
    x = np.array(FLOATS + [float("nan")])
    assert csv_text({"x": x}) == _pandas(pd.DataFrame({"x": x}))
    x32 = x[~(np.abs(x) > 3e38)].astype(np.float32)                    # float32's range (inf kept)
    assert csv_text({"x": x32}) == _pandas(pd.DataFrame({"x": x32}))
