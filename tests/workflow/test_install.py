"""workflow/scripts/install_venv.py (what `make` installs with): pip's index settings reach uv with
pip's precedence, and any failure of uv falls back to pip."""

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def install(monkeypatch):
    spec = importlib.util.spec_from_file_location("install_venv", ROOT / "workflow/scripts/install_venv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CONFIG = """global.extra-index-url='file:///a/simple file:///b/simple'
global.find-links='/opt/wheels'
global.index-url='https://global.example/simple'
install.index-url='https://install.example/simple'
:env:.find-links='/env/wheels'
global.cert='/etc/ca.crt'
"""


def test_pip_settings_take_env_over_install_over_global(install, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, CONFIG, ""))
    s = install.pip_settings("python")
    assert s == {"index-url": ["https://install.example/simple"],
                 "extra-index-url": ["file:///a/simple", "file:///b/simple"],
                 "find-links": ["/env/wheels"], "cert": ["/etc/ca.crt"]}
    cmd = install.uv_command("/v/bin/python", s)
    assert cmd[:2] == ["/v/bin/uv", "pip"] and ["-c", "requirements.lock"] == cmd[cmd.index("-c"):][:2]
    flags = list(zip(cmd, cmd[1:]))
    assert ("--index-url", "https://install.example/simple") in flags
    assert ("--extra-index-url", "file:///b/simple") in flags and ("--find-links", "/env/wheels") in flags
    assert ("--index-strategy", "unsafe-best-match") in flags
    assert "--compile-bytecode" in cmd            # as pip does: no per-process recompiling of torch


def test_a_failing_uv_falls_back_to_pip_and_a_bad_choice_is_refused(install, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(install, "run", lambda cmd, env=None: calls.append(cmd) or "uv" not in " ".join(cmd))
    assert install.main("/v/bin/python") == 0
    assert calls[0][-1] == "uv"                                       # tried to get uv first
    assert calls[-1][:4] == ["/v/bin/python", "-m", "pip", "install"] and "requirements.lock" in calls[-1]
    assert "with pip" in capsys.readouterr().out
    monkeypatch.setenv("MCFL_INSTALLER", "conda")
    assert install.main("/v/bin/python") == 2
