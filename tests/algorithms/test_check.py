"""The conformance kit (mcfl.check, mcfl check-method): every built-in method passes it, and each
deliberately broken method (tests/broken_methods.py) fails exactly the check for its flaw."""

from __future__ import annotations

import pytest
from broken_methods import BROKEN

from mcfl.algorithms import ALGORITHMS
from mcfl.check import CHECKS, check_method, parametrize_with_checks
from mcfl.cli import main

#: the checks that need no more than one round (the rest run the kit's rounds several times)
CHEAP = ("params", "state", "eval-models", "assignments")


def test_every_broken_method_names_a_check():
    assert set(BROKEN.values()) == set(CHECKS)


@pytest.mark.parametrize("method", sorted(ALGORITHMS))
def test_every_built_in_method_passes_the_cheap_checks(method):
    failed = [r.line() for r in check_method(method, CHEAP) if not r.passed]
    assert not failed


@pytest.mark.slow
@parametrize_with_checks(sorted(ALGORITHMS))
def test_every_built_in_method_passes_the_kit(method, check):
    check(method)


@pytest.mark.parametrize("cls", list(BROKEN), ids=lambda c: c.__name__)
def test_a_broken_method_fails_exactly_its_check(cls):
    failed = [r.check for r in check_method(cls) if not r.passed]
    assert failed == [BROKEN[cls]]


def test_check_method_cli_names_the_failed_check(capsys):
    rc = main(["check-method", "broken_methods:LeavesOneOut", "--check", "eval-models", "--check", "params"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL  eval-models  after init: eval_models leaves out clients [7]" in out
    assert "PASS  params" in out
    assert out.splitlines()[-1] == "broken_methods:LeavesOneOut: failed 1 check(s): eval-models"


def test_check_method_cli_passes_a_good_method(capsys):
    assert main(["check-method", "CFL", "--check", "assignments"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "CFL: all 1 checks passed"


@pytest.mark.parametrize("argv, message", [
    (["check-method", "FedAvgg"], "unknown method 'FedAvgg'; did you mean FedAvg"),
    (["check-method", "FedAvg", "--check", "speed"], "--check: unknown check 'speed'; known: params,"),
])
def test_check_method_cli_refuses_bad_input_in_one_line(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
