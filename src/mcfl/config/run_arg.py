"""A run given on the command line (``mcfl train --run JSON``): :func:`parse_run` checks it as the
config's runs are checked, with one-line errors naming the flag and the key."""

from __future__ import annotations

from pathlib import Path

from mcfl import methods
from mcfl.config.files import ConfigError, _path
from mcfl.config.validate import _check_kwargs, _check_numbers, _schema, method_params, model_zoo
from mcfl.paths import plain_name

RUN_KEYS = ("dataset", "method", "label", "run_id", "seed", "params", "model", "train")
SPEC_KEYS = ("dataset", "seed", "model", "train", "K")
FIRST_MODELS_KEYS = ("dataset", "seed", "model", "train")


def parse_run(text: str, *, flag: str = "--run", spec_ok: bool | tuple[str, ...] = False) -> dict:
    """A run's (or, with ``spec_ok``, a centre spec's; with ``spec_ok`` a tuple of keys, a spec with
    those keys, e.g. :data:`FIRST_MODELS_KEYS`) JSON text from the command line, checked:
    JSON, the keys training reads, every number finite, a run's ``train`` against the schema and
    its ``params`` against the method. Errors are one-line ConfigErrors naming ``flag`` and the key."""
    import json

    import jsonschema
    from jsonschema.exceptions import best_match

    try:
        run = json.loads(text)
    except json.JSONDecodeError as e:
        hint = " (that is a file name)" if Path(text).exists() else ""
        raise ConfigError(f"{flag}: not JSON text{hint} ({e}); pass the run's JSON itself, as "
                          f"`mcfl check-config` and the workflow make it") from None
    spec_keys = spec_ok if isinstance(spec_ok, tuple) else SPEC_KEYS
    keys = spec_keys if spec_ok and isinstance(run, dict) and "params" not in run else RUN_KEYS
    missing = [k for k in keys if not isinstance(run, dict) or k not in run]
    if missing:
        raise ConfigError(f"{flag}: missing keys {', '.join(missing)}; pass a run's JSON as "
                          f"`mcfl.config.expand_runs` makes it")
    try:
        for key in ("dataset", "label", "run_id", "method"):    # parts of paths (mcfl.paths)
            if key in run:
                try:
                    plain_name(run[key], key)
                except ValueError as e:
                    raise ConfigError(str(e)) from None
        _check_numbers(run, [])
        for key in ("train", "model") + (("params",) if keys is RUN_KEYS else ()):
            if not isinstance(run[key], dict):
                raise ConfigError(f"{key}: must be an object, found {run[key]!r:.40}")
        seed = run["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"seed: {seed!r:.40} is not allowed: a seed is a non-negative integer")
        _check_model(run["model"])
        train_schema = {"$ref": "#/$defs/train", "$defs": _schema()["$defs"]}     # its $refs resolve
        errors = list(jsonschema.Draft202012Validator(train_schema).iter_errors(run["train"]))
        if errors:
            e = best_match(errors)
            raise ConfigError(f"{_path(['train', *e.absolute_path])}: {e.message}")
        if keys is RUN_KEYS and "rounds" not in run["train"]:
            raise ConfigError("train.rounds: missing")
        if keys is RUN_KEYS and run["params"].get("K") != "auto":
            try:
                methods.get(run["method"])
            except methods.MethodError as e:
                raise ConfigError(f"method: {e}") from None
            entry = {"method": run["method"], **{k: v for k, v in run["params"].items() if k != "K"}}
            method_params(entry, "params", run["params"].get("K"))
    except ConfigError as e:
        raise ConfigError(f"{flag}: {e}") from None
    return run




def _check_model(model: dict) -> None:
    """A run's ``model``: a known builder's ``name`` and that builder's keyword arguments."""
    name = model.get("name")
    if not isinstance(name, str) or name not in model_zoo():
        raise ConfigError(f"model.name: {name!r:.40} is not allowed; known models: "
                          f"{', '.join(sorted(model_zoo()))}")
    _check_kwargs("model", model_zoo()[name], model, skip=("name",))
