"""Configuration: one loader and validator for the CLI, the Snakefile and the Python API.

``load_config(*paths)`` reads YAML (a base config, then overlays merged over it; :mod:`.files`), fills defaults from the JSON schema
(``mcfl/schema/config.schema.yaml``), validates it, then checks what a schema cannot: each method
entry against its algorithm's ``Params`` dataclass, each data ``prepare`` block against its source
function's signature, each ``model`` block against its builder's, and K against the number of
clients. Every error is a :class:`ConfigError` naming the key (``methods[2].K``,
``datasets.digits.train.lr``) and, where there is a list, the allowed values. Nothing is run before
the whole config passes.

Values of source, model and method parameters are checked against the function's or ``Params``'
type annotations with pydantic (strict: no string-to-number coercion), including ``Literal``
choices and ``Annotated`` bounds (``Annotated[int, Ge(1)]``, from ``annotated_types``); a parameter
without an annotation must have the type of its default.

``expand_runs(cfg)`` turns the config into the list of runs, one per (dataset, method entry, K,
seed); each run is a plain dict that fully determines the training job (it is the job's Snakemake
``params`` value and its MLflow params).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from mcfl.config.files import ConfigError, command_line_values, merge, name_defaults, read_configs, read_yaml
from mcfl.config.run_arg import parse_run
from mcfl.config.validate import SCHEMA_PATH, SECTIONS, _schema, expand_runs, method_params, n_clients, validate

__all__ = ["ConfigError", "SCHEMA_PATH", "SECTIONS", "_schema", "command_line_values", "expand_runs", "load_config",
           "merge", "method_params", "n_clients", "name_defaults", "parse_run", "read_configs", "read_yaml", "validate",
           "validate_with_overrides"]


def load_config(*paths: str | Path) -> dict:
    """Read and merge in order (a base config, then overlays), complete (:func:`name_defaults`: from
    the last file's name; the schema's defaults) and validate config files."""
    source = " + ".join(map(str, paths))
    cfg = name_defaults(read_configs(paths), paths[-1])
    try:
        return validate(cfg, source)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def validate_with_overrides(cfg: dict, overrides: dict[str, Any], source: str) -> dict:
    """``cfg`` (config files read and merged) with Snakemake's ``--config KEY=VALUE`` values
    ``overrides`` merged over it (:func:`command_line_values`, then as an overlay file would be),
    validated; returned. An error the files alone do not have is blamed on the command line
    (``--config seeds=abc: seeds: 'abc' is not of type 'array'``), not on the files."""
    values = command_line_values(copy.deepcopy(dict(overrides or {})))
    files_only = copy.deepcopy(cfg) if values else None
    merged = merge(cfg, values, "--config") if values else cfg
    try:
        return validate(merged, source)
    except ConfigError as e:
        if files_only is None:
            raise
        try:
            validate(files_only, source)
        except ConfigError:
            raise e from None                   # the files are at fault (too)
        given = " ".join(f"{k}={v}" for k, v in overrides.items())
        msg = str(e).removeprefix(f"{source}: ")
        raise ConfigError(f"--config {given}: {msg}") from None
