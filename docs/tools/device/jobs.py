"""Turn ``snakemake -n -p`` dry runs into one shell script per job, for a queue on a lent GPU machine.

The device machine has torch but not Snakemake, so the jobs run as the plain ``mcfl`` commands the
workflow would run (``--device auto`` becomes ``--device cuda``, or ``--device`` given here). A job whose run needs initial
centres makes them first; jobs that need the same centres wait for the first one's file.

    snakemake TARGETS -n -p --cores 1 --rerun-triggers mtime --configfile CONFIG > dry.txt
    python docs/tools/device/jobs.py dry.txt [more.txt] --out .devrun/jobs [--first NAME ...]

A job whose centres exist here already (no init command in the dry runs) needs that command added:
``--centres-needed`` lists those files; ``snakemake FILES -f -n -p --configfile CONFIG >> dry.txt``
adds it (``plan.sh`` does both).

Scripts are named ``NN-<results dir>-<run id>-s<seed>.sh``, in the order the dry runs list them
(names given with ``--first``, e.g. ``results-femnist-sample-fedcg-FedCG-K4-s0``, go first, those
given with ``--last`` last; NN has
as many digits as the last number needs, so name order stays priority order past 100 jobs);
``queue.sh`` beside this file runs them.

A run finished on another machine and kept in git by ``docs/tools/archive_runs.py`` (its
``metrics.json`` under ``--archived``, default ``docs/results/runs``) gets no job: the results
directory here lacks it, so the dry run lists it, but training it again would only repeat it.
"""
from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def commands(path: Path) -> list[str]:
    pre = "Shell command: "
    return [line[len(pre):] for line in path.read_text().splitlines() if line.startswith(pre)]


def run_dir(cmd: str) -> Path | None:
    """A train command's output folder, ``<results>/runs/<dataset>/<run>/seed<s>`` (None if it has none)."""
    m = re.search(r'--out "\$\(dirname ([^)]*)\)"', cmd)
    return Path(shlex.split(m.group(1))[0]).parent if m else None


def _dirs(cmd: str) -> list[str]:
    """The folders a command writes into (Snakemake makes them; here the script must)."""
    dirs = {str(d)} if (d := run_dir(cmd)) else set()
    for m in re.finditer(r"(?:--checkpoint|--out) ([^\s\"]\S*)", cmd):
        dirs.add(str(Path(shlex.split(m.group(1))[0]).parent))
    m = re.search(r"> (\S+) 2>&1", cmd)
    if m:
        dirs.add(str(Path(shlex.split(m.group(1))[0]).parent))
    return sorted(dirs)


def script(cmd: str, device: str = "cuda") -> str:
    cmd = cmd.replace("--device auto", f"--device {device}")
    return f"mkdir -p {' '.join(_dirs(cmd))}\n{cmd}\n"


def archived(cmd: str, kept: Path) -> bool:
    """Whether ``archive_runs.py`` kept this run's finished outputs under ``kept``."""
    d = run_dir(cmd)
    if d is None or len(d.parts) < 3 or d.parts[1] != "runs":
        return False
    results, _, *rest = d.parts
    return (kept / results / Path(*rest) / "metrics.json").is_file()


def name(cmd: str) -> str:
    run = re.search(r'"run_id":"([^"]+)"', cmd).group(1)
    seed = re.search(r'"seed":(\d+)', cmd).group(1)
    results = re.search(r'--out "\$\(dirname ([^/]+)/', cmd).group(1)
    return f"{results}-{run}-s{seed}"


def _inits(cmds: list[str]) -> dict[str, str]:
    return {re.search(r"--out (\S+)", c).group(1): c for c in cmds if c.startswith("mcfl init-centres")}


def _missing(cmds: list[str]) -> list[str]:
    made = _inits(cmds)
    return sorted({m.group(1) for c in cmds if c.startswith("mcfl train")
                   for m in [re.search(r"--centres (\S+)", c)] if m and m.group(1) not in made})


def centres_needed(dry_runs: list[Path]) -> list[str]:
    """Initial-centre files that training jobs read but no command of the dry runs makes (they
    exist here, in a results directory the device machine does not get)."""
    return _missing([c for p in dry_runs for c in commands(p)])


def jobs(dry_runs: list[Path], device: str = "cuda", kept: Path | None = None) -> dict[str, str]:
    cmds = [c for p in dry_runs for c in commands(p)]
    inits = _inits(cmds)
    missing = _missing(cmds)
    if missing:
        raise SystemExit("these jobs read initial centres no dry run makes: " + " ".join(missing)
                         + "\nadd `snakemake FILES -f -n -p --configfile CONFIG` of them to the dry runs"
                         " (plan.sh does; --centres-needed lists them)")
    out: dict[str, str] = {}
    for c in cmds:
        if not c.startswith("mcfl train") or (kept is not None and archived(c, kept)):
            continue
        body = "set -e\n"
        m = re.search(r"--centres (\S+)", c)
        if m:          # the first job to need these centres makes them; the others wait for the file
            init = m.group(1)
            body += (f"mkdir -p $(dirname {init}); if mkdir {init}.making 2>/dev/null; then\n"
                     f"{script(inits[init], device)}else while [ ! -e {init} ]; do sleep 2; done; fi\n")
        out.setdefault(name(c), body + script(c, device))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dry_runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--first", nargs="*", default=[])
    ap.add_argument("--last", nargs="*", default=[])
    ap.add_argument("--device", default="cuda", help="what `--device auto` becomes (default cuda)")
    ap.add_argument("--archived", type=Path, default=ROOT / "docs" / "results" / "runs",
                    help="archived finished runs, which get no job (default docs/results/runs)")
    ap.add_argument("--centres-needed", action="store_true",
                    help="only print the initial-centre files the jobs read that no dry run makes")
    a = ap.parse_args()
    if a.centres_needed:
        print(" ".join(centres_needed(a.dry_runs)))
        return 0
    js = jobs(a.dry_runs, a.device, a.archived)
    unknown = [n for n in a.first + a.last if n not in js]
    if unknown:
        raise SystemExit(f"--first/--last: no such job {', '.join(unknown)} (jobs: {', '.join(js)})")
    a.out.mkdir(parents=True, exist_ok=True)
    for old in a.out.glob("*.sh"):
        old.unlink()
    order = a.first + [n for n in js if n not in a.first + a.last] + [n for n in a.last if n not in a.first]
    width = max(2, len(str(len(order) - 1)))
    for i, n in enumerate(order):
        (a.out / f"{i:0{width}d}-{n}.sh").write_text(js[n])
    print(f"{len(order)} jobs in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
