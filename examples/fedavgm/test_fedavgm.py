"""The example's own tests: mcfl's conformance kit, and FedAvgM with beta = 0 and server_lr = 1
against FedAvg."""

from mcfl.check import parametrize_with_checks


@parametrize_with_checks(["fedavgm:FedAvgM"])
def test_conformance(method, check):
    check(method)
