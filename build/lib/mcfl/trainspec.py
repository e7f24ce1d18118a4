"""A run's training settings, typed: :class:`TrainSpec`, built once from its ``train`` dict.

The defaults live in one place, the config schema (``mcfl/schema/config.schema.yaml``,
``$defs.train``): :data:`DEFAULTS` is read from it, and every reader (the runner, the federation,
the engine's :class:`~mcfl.engine.LocalSpec`, the centre spec) takes its values from a
``TrainSpec`` instead of re-defaulting the dict. A validated config's ``train`` dicts are already
complete; a hand-made one (tests, the API) gets the schema's defaults for what it leaves out. The
dict itself stays the run's record (``metrics.json``, the configuration hash), unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

SCHEMA_PATH = Path(__file__).parent / "schema" / "config.schema.yaml"


#: the schema, parsed once per process (with libyaml where PyYAML has it: ~10x faster than its
#: pure-Python parser, the same objects; ``tests/test_trainspec.py`` compares them)
_SCHEMA: dict = yaml.load(SCHEMA_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
_PROPS: dict[str, dict] = _SCHEMA["$defs"]["train"]["properties"]


def read_schema() -> dict:
    """The config schema (a fresh copy: :mod:`mcfl.config` fills in its enums)."""
    return copy.deepcopy(_SCHEMA)


#: every train setting with its schema default (None where the schema has none: absent = off)
DEFAULTS: dict[str, Any] = {k: p.get("default") for k, p in _PROPS.items()}
#: the settings validation fills in where a config leaves them out (those with a schema default;
#: the others stay absent, so that runs without them keep their configuration hash)
FILLED: dict[str, Any] = {k: p["default"] for k, p in _PROPS.items() if "default" in p}


@dataclass(frozen=True)
class TrainSpec:
    rounds: int
    clients_per_round: int | None
    clients_per_cluster: int | None
    lr: float
    batch_size: int
    local_epochs: int
    local_steps: int | None
    max_grad_norm: float | None
    eval_every: int
    finetune_epochs: int
    eval_protocols: dict | None
    checkpoint_every: int
    executor: str
    executor_chunk: int | None
    precision: str | None        # None (absent): fp32

    #: the settings a client's local update depends on (hence a clustered run's initial centres)
    LOCAL_KEYS: ClassVar[tuple[str, ...]] = ("lr", "batch_size", "local_epochs", "local_steps",
                                             "max_grad_norm", "executor", "executor_chunk", "precision")

    @classmethod
    def of(cls, train: dict | TrainSpec) -> TrainSpec:
        """The spec of a ``train`` dict (the schema's defaults for what it leaves out)."""
        if isinstance(train, TrainSpec):
            return train
        unknown = set(train) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"unknown train settings: {', '.join(sorted(unknown))}")
        return cls(**{**DEFAULTS, **train})

    def __post_init__(self):
        missing = {f.name for f in dataclasses.fields(self)} ^ set(DEFAULTS)
        if missing:                                    # the schema and this class must list the same keys
            raise RuntimeError(f"TrainSpec and the schema's train settings differ in {sorted(missing)}")
