"""A stdout or stderr that cannot be written (``> /dev/full``, a full disk under ``logs/``): the
user learns what failed, and outputs written in full are not thrown away."""

from __future__ import annotations

import os
import sys

import pytest

from mcfl import cli

FULL = "/dev/full"
pytestmark = pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full on this system")


@pytest.fixture
def full_stdout(monkeypatch):
    """Set in the test's body: pytest gives sys.stdout its capture again when the test starts."""
    opened = []

    def swap():
        opened.append(open(FULL, "w"))
        monkeypatch.setattr(sys, "stdout", opened[-1])
        return opened[-1]

    yield swap
    monkeypatch.undo()
    for f in opened:
        try:
            f.close()
        except OSError:
            pass


def test_a_command_whose_result_is_printed_fails_naming_stdout(full_stdout, capsys):
    full_stdout()
    assert cli.main(["methods"]) == 1
    assert capsys.readouterr().err == "mcfl methods: error: stdout: no space left on device\n"


def test_a_command_with_complete_outputs_warns_and_succeeds(full_stdout, digits_store, tmp_path, capsys):
    out = tmp_path / "P"
    full = full_stdout()
    assert cli.main(["partition", str(digits_store), "--out", str(out), "--scheme", "iid"]) == 0
    assert capsys.readouterr().err == ("mcfl partition: warning: stdout: no space left on device: the summary "
                                       "was not printed; the outputs are complete\n")
    assert (out / "meta.json").is_file()
    assert sys.stdout is full                         # given back as it was


def test_when_stderr_cannot_be_written_the_exit_status_says_so(monkeypatch, tmp_path):
    """Under Snakemake a job's stdout and stderr are its log: with the log's disk full, the exit
    status (74, EX_IOERR) is what Snakemake shows."""
    monkeypatch.setattr(sys, "stderr", open(FULL, "w"))
    assert cli.main(["report", "--out", str(tmp_path / "o"), str(tmp_path / "missing")]) == cli.EX_IOERR


def test_the_workflow_names_a_full_log_disk(monkeypatch, tmp_path):
    """Snakemake's onerror prints this when the folder of the job logs has no room left."""
    import collections

    from mcfl import paths

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(paths.shutil, "disk_usage", lambda p: usage(10**9, 10**9, 0))
    assert paths.disk_full_note(tmp_path / "logs" / "not-yet") == (
        f"{tmp_path / 'logs' / 'not-yet'}: the disk is full (0 bytes free): jobs could not write their "
        f"logs (exit status 74); free space there and run again")
    monkeypatch.setattr(paths.shutil, "disk_usage", lambda p: usage(10**9, 0, 10**9))
    assert paths.disk_full_note(tmp_path) is None
    from conftest import ROOT

    assert "disk_full_note(P.log_dir)" in (ROOT / "workflow" / "rules" / "common.smk").read_text()
