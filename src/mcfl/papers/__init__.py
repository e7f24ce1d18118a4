"""Paper registry: name -> :class:`Paper`. One home per paper: ``mcfl/papers/<paper>/`` holds its
planner, tables, figures and published numbers; the methods it compares stay in
:mod:`mcfl.algorithms` (they are methods, not papers).

A paper is reached by its name, from

* a built-in paper (:data:`REGISTRY`: FeSEM, FedCG, FedGSP), or
* a paper an installed package registers in the ``mcfl.papers`` entry-point group, as methods
  register in ``mcfl.methods`` (:mod:`mcfl.algorithms`): the entry point names a :class:`Paper`.

Every registered paper's outputs are made by one generic rule file (``workflow/rules/papers.smk``:
one rule per :class:`Job` its planner lists) through one command shape,
``mcfl paper <paper> <output> ...``, so adding a paper's table touches its own module, its
registration, its config and (optionally) its docs page; not the Snakefile, the CLI or the schema.

This module imports nothing of mcfl: the config's validation reads the papers' sections from it, and
each paper's parts are named as ``module:attribute`` strings, imported when first used.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mcfl import plugins

#: the entry-point group through which an installed package registers its papers
ENTRY_POINT_GROUP = "mcfl.papers"


@dataclass(frozen=True)
class Paper:
    """A paper's parts, each a ``module:attribute`` string imported on first use.

    * ``planner``: a class built with the workflow's :class:`mcfl.plan.Plan`, with ``jobs()`` (the
      :class:`Job` list its outputs need; empty when the config does not ask for them) and
      ``targets()`` (its final outputs, which ``rule all`` requests);
    * ``cli``: a module with ``add_outputs(subparsers)`` (one sub-parser per output, the output's
      name as its command) and ``write(args) -> int`` (makes the output ``args.output`` names);
    * ``section``: the top-level config key the paper owns, ``schema`` its JSON-schema fragment
      (``module:DICT``; None when the package's own schema has it) and ``check`` a
      ``module:function(cfg, source)`` run after the rest of the config validated;
    * ``published``: the paper's own numbers (a file beside its module, or ``module:NAME``);
    * ``docs``: its documentation page.
    """

    name: str
    title: str
    planner: str
    cli: str
    section: str | None = None
    schema: str | None = None
    check: str | None = None
    published: str | None = None
    docs: str | None = None

    def commands(self) -> Any:
        """The module ``cli`` names, with its ``add_outputs`` and ``write``."""
        for function in ("add_outputs", "write"):
            _attribute(f"{self.cli}:{function}", f"paper {self.name}: cli")
        return importlib.import_module(self.cli)

    def load(self, what: str) -> Any:
        """The object one of the ``module:attribute`` fields names (``"planner"``, ``"check"``, ...)."""
        return _attribute(getattr(self, what), f"paper {self.name}: {what}")


@dataclass
class Job:
    """One rule of ``workflow/rules/papers.smk``: ``mcfl <command...> <args...>`` making
    ``outputs`` from ``input``. ``args`` (and each input) may be a function of the job's wildcards;
    ``reports`` names the outputs Snakemake's report shows: output key -> (caption file under
    ``workflow/report/``, category)."""

    rule: str
    command: list[str]
    input: dict[str, Any]
    outputs: dict[str, str]
    args: list[str] | Callable
    log: str
    reports: dict[str, tuple[str, str]] = field(default_factory=dict)
    benchmark: str | None = None
    threads: int = 1
    gpu: int = 0


class PaperError(ValueError):
    """A paper name that resolves to no usable paper (one line, saying why)."""


#: paper name -> "module:PAPER" of its declaration, in the order the DAG lists their outputs
REGISTRY = {
    # Long, Xie, Shen, Zhou, Wang, Jiang, "Multi-Center Federated Learning: Clients Clustering for
    # Better Personalization", World Wide Web 2022
    "fesem": "mcfl.papers.fesem:PAPER",
    # Caldarola, Mancini, Galasso, Ciccone, Rodolà, Caputo, "Cluster-driven Graph Federated Learning
    # over Multiple Domains", CVPR Workshops 2021
    "fedcg": "mcfl.papers.fedcg:PAPER",
    # Zeng, Liu, Pan, Li, Yu, "FedGSP: Accelerating Federated Learning on Non-IID Data via Grouped
    # Sequential-to-Parallel Training", DASFAA 2022
    "fedgsp": "mcfl.papers.fedgsp:PAPER",
}


def _attribute(spec: str, what: str) -> Any:
    return plugins.load(spec, PaperError, what)


def _entry_points() -> dict:
    return plugins.entry_points(ENTRY_POINT_GROUP)


def _checked(paper: Any, where: str) -> Paper:
    if not isinstance(paper, Paper):
        raise PaperError(f"{where}: {paper!r:.60} is not an mcfl.papers.Paper")
    return paper


@functools.cache
def papers() -> dict[str, Paper]:
    """Every registered paper, built-in ones first; a plugin may not take a built-in's name."""
    out = {name: _checked(_attribute(spec, f"paper {name}"), spec) for name, spec in REGISTRY.items()}
    for name, ep in sorted(_entry_points().items()):
        where = f"entry point {ep.value} ({ENTRY_POINT_GROUP})"
        if name in out:
            raise PaperError(f"{where}: the paper name {name!r} is a built-in paper's; name it otherwise")
        try:
            paper = ep.load()
        except Exception as e:  # noqa: BLE001 - any failure of a plugin's import is the plugin's
            raise PaperError(f"{where}: cannot be loaded ({type(e).__name__}: {e})") from None
        if _checked(paper, where).name != name:
            raise PaperError(f"{where}: names its paper {paper.name!r}, not {name!r}")
        out[name] = paper
    return out


def get(name: str) -> Paper:
    """The paper registered as ``name`` (a :class:`PaperError` naming the known ones if none)."""
    known = papers()
    if name not in known:
        raise PaperError(f"unknown paper {name!r}; known: {', '.join(known)}")
    return known[name]


def sections() -> dict[str, Paper]:
    """Config key -> the paper that owns it (what :func:`mcfl.config.validate` checks)."""
    return {p.section: p for p in papers().values() if p.section}
