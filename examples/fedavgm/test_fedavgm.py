"""The example's own tests: mcfl's conformance kit on the installed method."""

from mcfl.check import parametrize_with_checks


@parametrize_with_checks(["FedAvgM"])
def test_conformance(method, check):
    check(method)
