"""How the rules' wildcards name a run, and the files a training job writes."""

from __future__ import annotations

#: the files a training job writes into its run directory (the ``train`` rule's outputs)
RUN_FILES = ("metrics", "history", "assignments", "predictions", "state")
SUFFIX = {"state": "pt", "metrics": "json"}

#: what a wildcard may match besides a configured dataset name
RUN_PATTERN = "[A-Za-z0-9_+.()-]+"


def run_key(run: dict) -> tuple[str, str, str]:
    """(dataset, run id, seed as a string): how the rules' wildcards name a run."""
    return run["dataset"], run["run_id"], str(run["seed"])
