"""A conformance kit for methods: does an algorithm keep the contract of
:mod:`mcfl.algorithms.base`?

``mcfl check-method mypkg.fedfoo:FedFoo`` runs every check and prints one line per check; a
plugin's own tests run the same checks through :func:`parametrize_with_checks` (the idea of
scikit-learn's ``check_estimator`` / ``parametrize_with_checks``)::

    from mcfl.check import parametrize_with_checks

    @parametrize_with_checks(["mypkg.fedfoo:FedFoo"])
    def test_conformance(method, check):
        check(method)

The checks run on a small built-in federation (:func:`kit_store`: 8 clients of the digits data in
2 rotation groups, the digits CNN, 4 clients a round, 2 local steps, 3 rounds), with the cheap
settings of :data:`SMALL` where the method has those hyperparameters. Each check raises
:class:`CheckFailed` with the reason; :func:`check_method` runs them all and collects the results.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import functools
import io
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from mcfl import methods
from mcfl.config import ConfigError
from mcfl.config.validate import params_of
from mcfl.data import load, prepare
from mcfl.federation import build_federation
from mcfl.trainspec import FILLED

#: settings that make a method cheap without changing what the checks check (applied where a method
#: has the hyperparameter): K=2, few k-means restarts; FedCG's GCN projection through a bottleneck
#: and a narrow domain classifier
SMALL = (("K", 2), ("restarts", 2), ("bottleneck", 64), ("dc_width", 4), ("dc_kernel", 3))

#: the kit's federation: model and train settings (the schema's defaults for the rest)
MODEL = {"name": "digits_cnn"}
TRAIN = {"rounds": 3, "clients_per_round": 4, "local_steps": 2, "batch_size": 5, "lr": 0.05,
         "executor": "sequential"}
#: the round after which the resume check "kills" the run
KILL_AFTER = 2
#: float tolerance of the order and executor checks (sums taken in another order; the batched
#: executor's stacked arithmetic rounds differently)
ATOL = 1e-5


class CheckFailed(AssertionError):
    """A method broke one check of the kit (the message says how)."""


@dataclass(frozen=True)
class Result:
    check: str
    passed: bool
    reason: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.check:<12} {self.reason}"


def small_params(cls) -> dict[str, Any]:
    """The :data:`SMALL` settings a method's ``Params`` has."""
    fields = {f.name for f in dataclasses.fields(cls.Params)}
    return {k: v for k, v in SMALL if k in fields}


@functools.cache
def kit_store() -> str:
    """The kit's federation store, prepared once per process in a temporary folder (removed when
    the process exits)."""
    folder = tempfile.mkdtemp(prefix="mcfl-check-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return str(prepare("digits", Path(folder) / "digits", clients=8, clusters=2, alpha=0.5, seed=0))


def _federation(**train):
    return build_federation(load(kit_store()), MODEL, {**FILLED, **TRAIN, **train}, seed=0)


def _algorithm(cls, **train):
    return cls(_federation(**train), cls.Params(**small_params(cls)))


def _rounds(algo, state, rounds, order: int = 1):
    for r in rounds:
        state, _ = algo.round(state, algo.fed.clients(r)[::order].copy(), r)
    return state


@functools.lru_cache(maxsize=32)
def _run(cls, order: int = 1, executor: str = "sequential") -> tuple[dict, list[str]]:
    """An uninterrupted run of the kit's rounds (computed once per class and setting): its final
    state dict, and which global generators (NumPy's, PyTorch's) its ``init`` and rounds drew from."""
    algo = _algorithm(cls, executor=executor)
    np_before, torch_before = np.random.get_state(), torch.random.get_rng_state()
    state = _rounds(algo, algo.init(), range(1, TRAIN["rounds"] + 1), order)
    drew = [name for name, moved in (
        ("NumPy's", not _same_np_state(np_before, np.random.get_state())),
        ("PyTorch's", not torch.equal(torch_before, torch.random.get_rng_state()))) if moved]
    return algo.state_dict(state), drew


@functools.lru_cache(maxsize=32)
def _one_round(cls):
    """An algorithm, its state after ``init`` and after round 1, and the attributes ``init`` and
    ``round`` assigned on the instance (computed once per class)."""
    algo = _algorithm(cls)
    before = dict(vars(algo))
    first = algo.init()
    start = copy.deepcopy(first)
    after = _rounds(algo, first, [1])
    assigned = sorted(k for k in vars(algo) if k not in before or vars(algo)[k] is not before[k])
    return algo, start, after, assigned


def _same_np_state(a, b) -> bool:
    return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b))


def _differences(a: dict, b: dict, atol: float | None) -> list[str]:
    """The fields of two state dicts that differ: bit for bit (``atol`` None) or beyond ``atol``."""
    if a.keys() != b.keys():
        return [f"fields {sorted(a)} against {sorted(b)}"]
    out = []
    for key in a:
        x, y = torch.as_tensor(a[key]), torch.as_tensor(b[key])
        if x.shape != y.shape:
            out.append(f"{key} (shape {tuple(x.shape)} against {tuple(y.shape)})")
        elif atol is not None and x.is_floating_point():
            gap = float((x - y).abs().max()) if x.numel() else 0.0
            if not gap <= atol:
                out.append(f"{key} (max |difference| {gap:.2g} > {atol:g})")
        elif not torch.equal(x, y):
            out.append(key)
    return out


# -- the checks ------------------------------------------------------------------------------------
def check_state(cls) -> str:
    """Everything kept between rounds is in the state (``init`` and ``round`` assign no attribute
    on the instance), and the state after a round survives ``torch.save`` and
    ``torch.load(weights_only=True)`` unchanged (fields of tensors, ints, floats and bools only)."""
    algo, _, state, assigned = _one_round(cls)
    if assigned:
        raise CheckFailed(f"init/round assign attributes outside the state: {', '.join(assigned)}")
    saved = algo.state_dict(state)
    foreign = [f"{k} ({type(v).__name__})" for k, v in saved.items()
               if not isinstance(v, (torch.Tensor, int, float, bool))]
    if foreign:
        raise CheckFailed(f"torch.load(weights_only=True) refuses state fields that are not tensors, "
                          f"ints, floats or bools: {', '.join(foreign)}")
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    try:
        loaded = torch.load(buf, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any refusal is the failure this check reports
        raise CheckFailed(f"torch.load(weights_only=True) refuses the state ({type(e).__name__})") from None
    diff = _differences(saved, algo.state_dict(algo.load_state(loaded)), None)
    if diff:
        raise CheckFailed(f"the reloaded state differs in {', '.join(diff)}")
    return f"{len(saved)} fields reload with weights_only=True"


def check_resume(cls) -> str:
    """A run killed after round ``KILL_AFTER`` and resumed by a fresh instance (``load_state`` of the
    saved state, no ``init``) ends bit for bit where the uninterrupted run ends."""
    algo = _algorithm(cls)
    state = _rounds(algo, algo.init(), range(1, KILL_AFTER + 1))
    saved = copy.deepcopy(algo.state_dict(state))
    fresh = _algorithm(cls)
    resumed = _rounds(fresh, fresh.load_state(saved), range(KILL_AFTER + 1, TRAIN["rounds"] + 1))
    straight, _ = _run(cls)
    diff = _differences(straight, fresh.state_dict(resumed), None)
    if diff:
        raise CheckFailed(f"killed after round {KILL_AFTER} and resumed, the run differs in {', '.join(diff)}")
    return f"killed after round {KILL_AFTER} and resumed: bit for bit the uninterrupted run"


def check_order(cls) -> str:
    """Handing each round's sampled clients over in reverse order changes the result only by float
    rounding (``ATOL``)."""
    forward, _ = _run(cls)
    reverse, _ = _run(cls, order=-1)
    diff = _differences(forward, reverse, ATOL)
    if diff:
        raise CheckFailed(f"the clients' order changes {', '.join(diff)}")
    return f"clients in reverse order: the same state within {ATOL:g}"


def check_global_rng(cls) -> str:
    """A run draws nothing from NumPy's or PyTorch's global random generators (server randomness
    comes from ``fed.rng``, local randomness through the engine)."""
    _, drew = _run(cls)
    if drew:
        raise CheckFailed(f"the run drew from {' and '.join(drew)} global generator")
    return "no draw from NumPy's or PyTorch's global generators"


def check_executors(cls) -> str:
    """The batched executor's run agrees with the sequential executor's within float tolerance
    (``ATOL``); where a local task cannot be batched, the batched executor falls back and says so."""
    sequential, _ = _run(cls)
    batched, _ = _run(cls, executor="batched")
    diff = _differences(sequential, batched, ATOL)
    if diff:
        raise CheckFailed(f"batched and sequential executors differ in {', '.join(diff)}")
    return f"batched and sequential executors agree within {ATOL:g}"


def check_params(cls) -> str:
    """``Params()`` constructs from its defaults, and a config value of the wrong type for any
    hyperparameter is refused by config validation."""
    try:
        cls.Params()
    except Exception as e:  # noqa: BLE001 - any failure is the failure this check reports
        raise CheckFailed(f"Params() does not construct from its defaults: {e}") from None
    accepted = []
    for field in dataclasses.fields(cls.Params):
        bad = {"not": "a value"}
        entry, K = ({"method": "-"}, bad) if field.name == "K" else ({"method": "-", field.name: bad}, None)
        try:
            params_of(cls, cls.__name__, entry, "check", K)
        except ConfigError:
            continue
        accepted.append(field.name)
    if accepted:
        raise CheckFailed(f"config validation accepts a mapping as {', '.join(accepted)} "
                          f"(annotate the Params fields with their types)")
    return f"defaults construct; a wrong-typed value is refused for each of {len(dataclasses.fields(cls.Params))} fields"


def check_eval_models(cls) -> str:
    """``eval_models`` gives every client exactly one model, after ``init`` and after a round."""
    algo, first, after, _ = _one_round(cls)
    for when, state in (("after init", first), ("after round 1", after)):
        counts = np.zeros(algo.fed.n_clients, dtype=int)
        for _, clients in algo.eval_models(state):
            np.add.at(counts, np.asarray(clients, dtype=int), 1)
        if not (counts == 1).all():
            missing, twice = np.flatnonzero(counts == 0), np.flatnonzero(counts > 1)
            what = ([f"leaves out clients {missing.tolist()[:5]}"] if len(missing) else []) + (
                [f"gives several models to clients {twice.tolist()[:5]}"] if len(twice) else [])
            raise CheckFailed(f"{when}: eval_models {' and '.join(what)}")
    return f"every one of {algo.fed.n_clients} clients gets exactly one model"


def check_assignments(cls) -> str:
    """A clustered method's ``assignments`` gives one cluster id (an integer >= 0, below K where the
    method takes K) per client; a method that does not cluster gives None."""
    algo, _, state, _ = _one_round(cls)
    a = algo.assignments(state)
    if not cls.clustered:
        if a is not None:
            raise CheckFailed("the method is not clustered (clustered = False) but gives assignments")
        return "not clustered: no assignments"
    m, K = algo.fed.n_clients, getattr(algo.p, "K", None)
    a = np.asarray(a) if a is not None else None
    if a is None or a.shape != (m,) or not np.issubdtype(a.dtype, np.integer):
        what = "None" if a is None else f"shape {a.shape}, dtype {a.dtype}"
        raise CheckFailed(f"assignments must be {m} integers, one per client; got {what}")
    if a.min() < 0 or (isinstance(K, int) and a.max() >= K):
        raise CheckFailed(f"cluster ids range over {a.min()}..{a.max()}, outside 0..{K - 1 if K else 'K-1'}")
    return f"one cluster per client ({len(np.unique(a))} clusters in use)"


#: the checks, in the order they run: name -> function(cls) returning what it found
CHECKS: dict[str, Callable[[type], str]] = {
    "params": check_params, "state": check_state, "resume": check_resume, "order": check_order,
    "global-rng": check_global_rng, "executors": check_executors, "eval-models": check_eval_models,
    "assignments": check_assignments,
}


def resolve(method) -> type:
    """An algorithm class from a config's method name (built-in, alias, ``module:Class``, entry
    point) or the class itself."""
    return methods.get(method) if isinstance(method, str) else method


def check_method(method, checks=None) -> list[Result]:
    """Run the kit's checks (default: all of :data:`CHECKS`) on ``method``; one :class:`Result` each."""
    cls = resolve(method)
    results = []
    for name in checks or CHECKS:
        try:
            results.append(Result(name, True, CHECKS[name](cls)))
        except CheckFailed as e:
            results.append(Result(name, False, str(e)))
        except Exception as e:  # noqa: BLE001 - a crash inside a check fails that check
            results.append(Result(name, False, f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    return results


def parametrize_with_checks(methods):
    """A ``pytest.mark.parametrize`` over (method, check) pairs: each test case calls
    ``check(method)``, which raises :class:`CheckFailed` with the reason."""
    import pytest

    def bound(name):
        def check(method):
            return CHECKS[name](resolve(method))
        check.__name__ = f"check_{name}"
        return check

    cases = [pytest.param(m, bound(n), id=f"{m if isinstance(m, str) else m.__name__}-{n}")
             for m in methods for n in CHECKS]
    return pytest.mark.parametrize("method, check", cases)
