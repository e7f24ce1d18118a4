"""The fault suite, the workflow (``pytest -m faults``): every value in a rule's shell command is
quoted, config paths with spaces stay one word, and the Snakefile refuses a duplicated key."""

import re
import shutil
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.faults


# ====================================================================================== quoting
RULE_FILES = sorted((ROOT / "workflow" / "rules").glob("*.smk"))


def _shell_fields(path: Path) -> list[str]:
    """The {fields} of every shell command in a rule file."""
    text = path.read_text()
    blocks = re.findall(r"\n(\s+)shell:\n((?:\1\s+\".*\"\s*\n)+)", text)
    return [f for _, block in blocks for f in re.findall(r"\{([^{}]+)\}", "".join(re.findall(r'"(.*)"', block)))]


@pytest.mark.parametrize("path", RULE_FILES, ids=[p.name for p in RULE_FILES])
def test_every_value_in_a_shell_command_is_quoted(path):
    """The quoting rule (workflow/rules/common.smk): every {field} of a shell command is {field:q}."""
    fields = _shell_fields(path)
    assert [f for f in fields if not f.endswith(":q")] == []
    assert fields or path.name in ("common.smk",) or "shell:" not in path.read_text()


@pytest.mark.slow
def test_config_paths_with_spaces_and_semicolons_stay_one_word(tmp_path, cli_env):
    """`snakemake -n -p` with results, experiment and figure titles holding a space, a `;`, quotes
    and `$(...)`: every printed command still parses with each of them inside one word."""
    evil = "r s;touch INJECTED 'q\" $(touch INJECTED)"
    cfg = {"experiment": evil, "seeds": [0], "tracking": "deferred", "results": evil, "data_dir": evil,
           "datasets": {"digits": {"prepare": {"source": "digits", "clients": 12, "clusters": 2, "seed": 0},
                                   "model": {"name": "digits_cnn"}, "train": {"rounds": 2}}},
           "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2}, {"method": "FeSEM", "name": "A", "K": "auto",
                                                                          "select_k": {"K": [2, 3]}}],
           "figures": {"clusters": {"run": "FeSEM(2)"}, "cases": {"run": "FeSEM(2)"}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    smk = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or "snakemake"
    r = subprocess.run([smk, "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--configfile",
                        str(tmp_path / "c.yaml"), "-n", "-p", "--cores", "1"], env=cli_env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cmds = [x.split(": ", 1)[1] for x in r.stdout.splitlines() if x.startswith("Shell command: mcfl ")]
    rules = {c.split()[1] for c in cmds}
    assert {"train", "init-centres", "select-k", "report", "track", "paper", "report-select-k"} <= rules
    for c in cmds:
        words = list(shlex.shlex(c, posix=True, punctuation_chars=True))
        assert "touch" not in words and "INJECTED" not in words and ";" not in words, c
        assert any(evil in w for w in words), c


def test_the_snakefile_rejects_a_duplicated_key_before_any_job(tmp_path, cli_env):
    text = (ROOT / "config" / "config.yaml").read_text().replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2]\nseeds: [5]")
    (tmp_path / "c.yaml").write_text(text)
    smk = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or "snakemake"
    r = subprocess.run([smk, "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--configfile",
                        str(tmp_path / "c.yaml"), "-n", "--cores", "1"], env=cli_env,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr                       # Snakemake prints a WorkflowError on stdout
    assert r.returncode != 0 and re.search(r"c\.yaml: line \d+: duplicate key 'seeds'", out), out[-2000:]
