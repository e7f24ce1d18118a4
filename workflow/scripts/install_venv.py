"""Install mcfl and its pinned dependencies (requirements.lock) into a virtual environment: with uv
when it can be had, else with pip. `make` calls it; the result is the same set of packages.

uv installs the lock in about 36 s where pip takes about 2 min 45 s (2-core machine, local wheels).
uv does not read pip's configuration, so the package indexes pip would use (``pip config list``:
its files and ``PIP_*`` variables; keys ``index-url``, ``extra-index-url``, ``find-links``, ``cert``)
are passed to it, with pip's rule for several indexes (the best version over all of them: uv's
``unsafe-best-match``). Any failure of uv (not installable, no network, a resolution error) falls
back to pip, which is what ``MCFL_INSTALLER=pip`` asks for directly.

Usage: python workflow/scripts/install_venv.py VENV_PYTHON
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

EXTRAS = ".[dev,docs,slurm]"
LOCK = "requirements.lock"
KEYS = ("index-url", "extra-index-url", "find-links", "cert")


def pip_settings(python: str) -> dict[str, list[str]]:
    """pip's effective index settings: a ``PIP_*`` variable wins over the ``install`` section of
    its config files, which wins over ``global`` (``pip config list`` has already merged the files)."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[tuple[str, str], str] = {}
    for line in out.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        found[(section.strip(), key.strip())] = value.strip().strip("'\"")
    settings = {}
    for key in KEYS:
        for section in (":env:", "install", "global"):
            if (section, key) in found:
                settings[key] = found[(section, key)].split()
                break
    return settings


def uv_command(python: str, settings: dict[str, list[str]]) -> list[str]:
    # --compile-bytecode: pip writes .pyc files at install time, uv does not by default; where
    # Python may not write them later (PYTHONDONTWRITEBYTECODE, read-only installs) every process
    # would compile torch's modules again: `import torch, sklearn.metrics, pandas` took 10.5-11.2 s
    # instead of 4.4-4.6 s on the 2-core VM, about 6 s more for every training job
    cmd = [os.path.join(os.path.dirname(python), "uv"), "pip", "install", "--quiet", "--python", python,
           "-e", EXTRAS, "-c", LOCK, "--index-strategy", "unsafe-best-match", "--compile-bytecode"]
    for url in settings.get("index-url", [])[:1]:
        cmd += ["--index-url", url]
    for url in settings.get("extra-index-url", []):
        cmd += ["--extra-index-url", url]
    for link in settings.get("find-links", []):
        cmd += ["--find-links", link]
    return cmd


def run(cmd: list[str], env: dict | None = None) -> bool:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env).returncode == 0


def with_uv(python: str) -> bool:
    if not run([python, "-m", "pip", "install", "-q", "uv"]):
        return False
    settings = pip_settings(python)
    env = dict(os.environ)
    if settings.get("cert"):                     # the CA bundle pip trusts (a proxy's, say)
        env.setdefault("SSL_CERT_FILE", settings["cert"][0])
    return run(uv_command(python, settings), env)


def with_pip(python: str) -> bool:
    return (run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"])
            and run([python, "-m", "pip", "install", "-q", "-e", EXTRAS, "-c", LOCK]))


def main(python: str) -> int:
    start = time.perf_counter()
    installer = os.environ.get("MCFL_INSTALLER", "uv")
    if installer not in ("uv", "pip"):
        print(f"MCFL_INSTALLER must be 'uv' or 'pip', got {installer!r}", file=sys.stderr)
        return 2
    if installer == "uv" and with_uv(python):
        used = "uv"
    else:
        if installer == "uv":
            print("install_venv: uv failed; installing with pip instead", flush=True)
        if not with_pip(python):
            return 1
        used = "pip"
    print(f"install_venv: installed {EXTRAS} with {used} in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
