"""A command that writes a set of files writes all of them or none (mcfl.io.staged): a full disk
or a kill while writing leaves the earlier set as it was. Files respect the umask."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import pytest

from mcfl import cli
from mcfl.io import atomic_path, staged, write_text
from mcfl.report import publish as publish_module
from mcfl.report import table as report_table
from test_paths import _fake_run


def _files(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def runs(tmp_path) -> list[str]:
    return [str(_fake_run(tmp_path / "runs" / f"s{s}", seed=s)) for s in range(2)]


@pytest.fixture
def earlier(tmp_path, runs) -> tuple[Path, dict[str, bytes]]:
    """A finished report in ``out`` and its bytes (one seed: the numbers differ from two seeds')."""
    out = tmp_path / "results"
    assert cli.main(["report", "--out", str(out), runs[0]]) == 0
    (out / "runs-live-here.txt").write_text("not the report's")
    return out, _files(out)


@pytest.mark.parametrize("where", ["convergence_figure", "write_comparison", "markdown_html"])
def test_a_report_that_fails_on_a_full_disk_leaves_the_earlier_report(where, earlier, runs, monkeypatch, capsys):
    out, before = earlier
    monkeypatch.setattr(report_table, where, _full_disk)
    assert cli.main(["report", "--out", str(out), *runs]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"mcfl report: error: {out}: no space left on device"
    assert _files(out) == before                           # no new table.csv beside the error
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_a_report_killed_mid_write_leaves_the_earlier_report(earlier, runs, monkeypatch):
    out, before = earlier

    def killed(*args, **kwargs):
        raise SystemExit(128 + 15)                          # SIGTERM, as the CLI turns it

    monkeypatch.setattr(report_table, "write_comparison", killed)
    with pytest.raises(SystemExit):
        cli.main(["report", "--out", str(out), *runs])
    assert _files(out) == before


def test_a_finished_report_replaces_every_file_and_keeps_the_rest(earlier, runs):
    out, before = earlier
    assert cli.main(["report", "--out", str(out), *runs]) == 0
    after = _files(out)
    assert set(after) == set(before)
    assert after["runs-live-here.txt"] == before["runs-live-here.txt"]
    assert after["table.csv"] != before["table.csv"] and b",2," in after["table.csv"]   # n_seeds 2


def test_staged_names_the_output_file_of_a_failed_write(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(OSError) as e:
        with staged(out) as stage:
            with atomic_path(stage / "sub" / "a.csv") as tmp:
                tmp.write_text("x")
                raise OSError(errno.ENOSPC, "No space left on device", str(tmp))
    assert e.value.filename == str(out / "sub" / "a.csv")
    assert not out.exists()                              # created by the failed set: removed again


def test_staged_clears_a_staging_folder_left_by_a_killed_process(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    dead = out / ".staged.999999999.abc.tmp"             # no such process
    dead.mkdir()
    (dead / "table.csv").write_text("half")
    with staged(out) as stage:
        write_text(stage / "table.csv", "whole")
    assert sorted(p.name for p in out.iterdir()) == ["table.csv"]
    assert (out / "table.csv").read_text() == "whole"


def test_publish_on_a_full_disk_leaves_the_earlier_page_and_figures(earlier, runs, tmp_path, monkeypatch, capsys):
    results, _ = earlier
    docs = tmp_path / "docs"
    argv = ["publish", "--results", str(results), "--out", str(docs / "results" / "digits"),
            "--config", "config/x.yaml", "--title", "Digits", runs[0]]
    assert cli.main(argv) == 0
    before = _files(docs)
    assert "figures/dag/digits/convergence_digits.png" in before and "results/digits.md" in before
    monkeypatch.setattr(publish_module.shutil, "copyfile", _full_disk)
    assert cli.main(argv) == 1
    assert "no space left on device" in capsys.readouterr().err
    assert _files(docs) == before


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_outputs_respect_the_umask(mask, tmp_path, runs):
    old = os.umask(mask)
    try:
        write_text(tmp_path / "a.txt", "x")
        with atomic_path(tmp_path / "d", is_dir=True) as d:
            (d / "f").write_text("y")
        assert cli.main(["report", "--out", str(tmp_path / "rep"), *runs]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o777 & ~mask
    for f in (tmp_path / "rep").rglob("*"):
        want = (0o777 if f.is_dir() else 0o666) & ~mask
        assert stat.S_IMODE(f.stat().st_mode) == want, f
    shutil.rmtree(tmp_path / "rep")
