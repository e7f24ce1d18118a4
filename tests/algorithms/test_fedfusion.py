"""FedFusion: the fused network is the global model when the local branch's weight is 0 and the
plain model when both extractors are equal; clients train only their own extractor (and the
operator and head); the server makes the averaged local extractor the next global one."""

import numpy as np
import pytest
import torch

from mcfl.algorithms.fedfusion import FedFusion, Params
from mcfl.data import load
from mcfl.federation import build_federation
from mcfl.models import build
from mcfl.models.fusion import FusionNet

SHAPE = (1, 8, 8)


def plain():
    torch.manual_seed(0)
    return build("digits_cnn", SHAPE, 10, hidden=8)


@pytest.mark.parametrize("operator", ["conv", "multi", "single"])
def test_equal_extractors_give_the_plain_model(operator):
    m = plain()
    x = torch.randn(5, *SHAPE)
    assert torch.allclose(FusionNet(m, SHAPE, operator)(x), m(x), atol=1e-6)


def test_a_model_on_another_device_is_probed_there():
    """The probe that sizes the fusion operator runs where the model's weights are (a CUDA run's
    model is on the GPU; "meta" stands in for it here, and a hook checks the input's device)."""
    m = plain().to("meta")
    seen = []
    first = next(c for c in m.modules() if isinstance(c, torch.nn.Conv2d))
    first.register_forward_pre_hook(lambda mod, args: seen.append(args[0].device))
    net = FusionNet(m, SHAPE, "conv")
    assert seen and all(d.type == "meta" for d in seen)
    assert net.fuse.in_channels == 2 * net.fuse.out_channels


@pytest.mark.parametrize("operator", ["conv", "multi", "single"])
def test_local_weight_zero_is_the_global_model(operator):
    m = plain()
    net = FusionNet(m, SHAPE, operator)
    with torch.no_grad():
        for p in net.local.parameters():         # a different local extractor
            p.add_(torch.randn_like(p))
        if operator == "conv":                   # kernel [I | 0]: only the global maps
            c = net.fuse.out_channels
            net.fuse.weight.zero_()
            net.fuse.weight[:, :c] = torch.eye(c)[:, :, None, None]
        else:
            net.lam.zero_()
    x = torch.randn(5, *SHAPE)
    assert torch.allclose(net(x), m(x), atol=1e-6)                 # m has the global weights
    with torch.no_grad():
        if operator != "conv":                                     # and lambda = 1 is the local one
            net.lam.fill_(1.0)
            local = torch.nn.Sequential(*net.local, *net.head)
            assert torch.allclose(net(x), local(x), atol=1e-6)


def test_a_round_trains_the_local_half_and_passes_its_average_on(digits_store):
    fed = build_federation(load(digits_store), {"name": "digits_cnn", "hidden": 8},
                           {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 2}, seed=0)
    algo = FedFusion(fed, Params("multi"))
    state = algo.init()
    g, loc = algo.glob_sl, algo.local_sl
    assert torch.equal(state.w[g], state.w[loc])
    res = algo.fed.trainer.train(algo.local_task(0, state.w), 1)
    assert torch.equal(res.weights[g], state.w[g])                  # frozen
    assert not torch.equal(res.weights[loc], state.w[loc])          # trained
    new, diag = algo.round(state, np.array([0, 3, 5]), 1)
    assert torch.equal(new.w[g], new.w[loc]) and not torch.equal(new.w[loc], state.w[loc])
    assert np.isfinite(diag["train_loss"])


@pytest.mark.parametrize("path", ["sequential", "lowrank", "stacked"])
def test_the_global_extractor_takes_no_step_on_any_executor_path(digits_store, monkeypatch, path):
    """FedFusion trains with the plain loss: its frozen global extractor keeps its exact weights on
    the sequential executor and on both paths of the batched one (the low-rank path trains the
    first dense layer lazily here: 2 steps of 5 rows <= 0.5 x 32)."""
    from mcfl.executors import BatchedTrainer

    calls = []
    lowrank = BatchedTrainer._train_chunk_lowrank
    monkeypatch.setattr(BatchedTrainer, "_train_chunk_lowrank",
                        lambda self, *a: (calls.append(a[-1]), lowrank(self, *a))[1])
    fed = build_federation(load(digits_store), {"name": "digits_cnn", "hidden": 32},
                           {"lr": 0.1, "batch_size": 5, "local_steps": 2, "rounds": 1,
                            "executor": "sequential" if path == "sequential" else "batched"}, seed=0)
    algo = FedFusion(fed, Params("conv"))
    if path == "stacked":
        t = algo.fed.trainer
        algo.fed.trainer = BatchedTrainer(t.model, t.data, t.spec, t.seed, lowrank=0, fallback="stacked")
    state = algo.init()
    g, loc = algo.glob_sl, algo.local_sl
    results = [r for _, r in algo.fed.trainer.run([algo.local_task(c, state.w) for c in (0, 3, 5)], 1)]
    assert len(results) == 3
    for r in results:
        assert torch.equal(r.weights[g], state.w[g])                # frozen
        assert not torch.equal(r.weights[loc], state.w[loc])        # trained
    assert bool(calls) == (path == "lowrank")
    if calls:
        assert calls[0] == [2]             # the head's first Linear (child 2 of the fusion net)
