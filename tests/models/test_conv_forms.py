"""The convolution forms of mcfl.models.conv (grouped, Toeplitz), the per-CPU choice between them
(mcfl.executors.forms) and its record in a run's metadata."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from conftest import make_run
from mcfl.executors import forms
from mcfl.models import build
from mcfl.models.conv import Conv2d, conv_form, toeplitz_index
from mcfl.runner import train


def test_toeplitz_index_by_hand():
    """One input channel 3x3, one 2x2 kernel, no padding: output pixel (p, q) reads inputs
    (p..p+1, q..q+1) with kernel entries 0..3; every other entry is the zero slot (4)."""
    idx = toeplitz_index(1, 1, (2, 2), (3, 3), (1, 1), (0, 0))
    assert idx.shape == (9, 4)
    expected = torch.full((9, 4), 4)
    for p in range(2):
        for q in range(2):
            for dh in range(2):
                for dw in range(2):
                    expected[(p + dh) * 3 + q + dw, p * 2 + q] = dh * 2 + dw
    assert torch.equal(idx, expected)


def test_toeplitz_forward_by_hand():
    """x = 1..9 on a 3x3 grid, kernel [[1, 0], [0, -1]], bias 10: y[p, q] = x[p, q] - x[p+1, q+1] + 10
    = -4 + 10 everywhere."""
    m = Conv2d(1, 1, 2)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[[[1.0, 0.0], [0.0, -1.0]]]]))
        m.bias.fill_(10.0)
    x = torch.arange(1.0, 10.0).view(1, 1, 3, 3)
    with conv_form(m, "toeplitz"):
        y = m(x)
    assert torch.equal(y, torch.full((1, 1, 2, 2), 6.0))


# (in, out, kernel, image, stride, padding): the digits CNN's two layers, the FEMNIST CNN's 5x5
# 'same' kernels on a small image, a strided and an unpadded one
SHAPES = [(1, 16, 3, 8, 1, 1), (16, 32, 3, 4, 1, 1), (1, 4, 5, 6, 1, 2), (2, 3, 3, 7, 2, 1), (3, 2, 3, 5, 1, 0)]


@pytest.mark.parametrize("cin, cout, k, size, stride, pad", SHAPES)
def test_toeplitz_equals_conv2d_with_gradients_under_vmap(cin, cout, k, size, stride, pad):
    """Stacked clients (vmap over per-client weights, as the batched executor runs them): values and
    the gradients of kernel, bias and input equal F.conv2d's, client by client (float64)."""
    torch.manual_seed(0)
    m = Conv2d(cin, cout, k, stride=stride, padding=pad).double()
    C, B = 3, 4
    w = torch.randn(C, cout, cin, k, k, dtype=torch.double, requires_grad=True)
    b = torch.randn(C, cout, dtype=torch.double, requires_grad=True)
    x = torch.randn(C, B, cin, size, size, dtype=torch.double, requires_grad=True)
    stacked = vmap(lambda wi, bi, xi: functional_call(m, {"weight": wi, "bias": bi}, (xi,)))
    with conv_form(m, "toeplitz"):
        y = stacked(w, b, x)
    ref = torch.stack([F.conv2d(x[c], w[c], b[c], stride, pad) for c in range(C)])
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad((y * g).sum(), [w, b, x]), torch.autograd.grad((ref * g).sum(), [w, b, x])):
        torch.testing.assert_close(got, want)


def test_form_is_restored_and_unknown_form_refused():
    model = build("digits_cnn", (1, 8, 8), 10)
    layers = [m for m in model.modules() if isinstance(m, Conv2d)]
    assert len(layers) == 2 and all(m.form == "grouped" for m in layers)
    with conv_form(model, "toeplitz"):
        assert all(m.form == "toeplitz" for m in layers)
    assert all(m.form == "grouped" for m in layers)
    with pytest.raises(ValueError, match="unknown convolution form 'dense'"):
        with conv_form(model, "dense"):
            pass
    # same parameters and names as nn.Conv2d: the flat layout and state_dict do not change
    assert list(model.state_dict()) == ["0.weight", "0.bias", "3.weight", "3.bias", "7.weight", "7.bias",
                                        "9.weight", "9.bias"]


def test_large_layers_stay_grouped(monkeypatch):
    """The FEMNIST CNN's Toeplitz matrices (19.7M entries for the first layer) are over the limit:
    its layers compute PyTorch's convolution in either form, and the chooser does not time it."""
    monkeypatch.delenv(forms.ENV, raising=False)
    model = build("femnist_cnn", (1, 28, 28), 62, hidden=16)
    x = torch.randn(2, 1, 28, 28)
    with conv_form(model, "toeplitz"):
        y = model(x)
    assert torch.equal(y, model(x))
    assert not forms.toeplitz_fits(model, x[:1])
    assert forms.toeplitz_fits(build("digits_cnn", (1, 8, 8), 10), torch.zeros(1, 1, 8, 8))
    assert forms.choose_conv_form(model, (1, 28, 28), 10, torch.device("cpu"))[0] == "grouped"


def test_override_switch(monkeypatch):
    model = build("digits_cnn", (1, 8, 8), 10)
    for value in ("grouped", "toeplitz"):
        monkeypatch.setenv(forms.ENV, value)
        assert forms.choose_conv_form(model, (1, 8, 8), 10, torch.device("cpu")) == (value, f"MCFL_CONV_FORM={value}")
    monkeypatch.setenv(forms.ENV, "dense")
    with pytest.raises(ValueError, match="MCFL_CONV_FORM='dense': use one of grouped, toeplitz, auto"):
        forms.choose_conv_form(model, (1, 8, 8), 10, torch.device("cpu"))


def test_auto_choice_times_once_and_keeps_grouped_on_a_near_tie(monkeypatch):
    monkeypatch.delenv(forms.ENV, raising=False)
    monkeypatch.setattr(forms, "_chosen", {})
    calls = []

    def timed(*args, **kwargs):
        calls.append(args)
        return {"grouped": 1.1, "toeplitz": 1.0}                 # 1.1x: under the margin

    monkeypatch.setattr(forms, "time_forms", timed)
    model = build("digits_cnn", (1, 8, 8), 10)
    for _ in range(2):
        form, why = forms.choose_conv_form(model, (1, 8, 8), 10, torch.device("cpu"))
        assert form == "grouped" and "start-up timing" in why
    assert len(calls) == 1
    monkeypatch.setattr(forms, "_chosen", {})
    monkeypatch.setattr(forms, "time_forms", lambda *a, **k: {"grouped": 1.3, "toeplitz": 1.0})
    assert forms.choose_conv_form(model, (1, 8, 8), 10, torch.device("cpu"))[0] == "toeplitz"


def test_time_forms_measures_both_forms_and_leaves_the_rng():
    model = build("digits_cnn", (1, 8, 8), 10)
    state = torch.random.get_rng_state()
    t = forms.time_forms(model, (1, 8, 8), 4, torch.device("cpu"), clients=2, repeats=1)
    assert set(t) == {"grouped", "toeplitz"} and all(0 < s < 60 for s in t.values())
    assert torch.equal(state, torch.random.get_rng_state())


def _run(store, out, monkeypatch, form):
    monkeypatch.setenv(forms.ENV, form)
    train(make_run(rounds=2, executor="batched"), store, out, progress=False)
    return (out / "predictions.csv").read_bytes(), json.loads((out / "metrics.json").read_text())


def test_same_form_repeats_bitwise_and_is_recorded(digits_store, tmp_path, monkeypatch):
    """Two runs in the Toeplitz form give identical predictions; the form is in metrics.json (and
    its segment); the grouped form's run differs from it by float rounding only."""
    a, ma = _run(digits_store, tmp_path / "a", monkeypatch, "toeplitz")
    b, mb = _run(digits_store, tmp_path / "b", monkeypatch, "toeplitz")
    assert a == b and ma["final"] == mb["final"]
    assert ma["conv_form"] == "toeplitz"
    g, mg = _run(digits_store, tmp_path / "g", monkeypatch, "grouped")
    assert mg["conv_form"] == "grouped"
    assert mg["final"]["micro_acc"] == pytest.approx(ma["final"]["micro_acc"], abs=0.05)


def test_round_benchmark_counts_peak_and_times_both_forms(monkeypatch):
    """benchmarks/conv_forms_round.py: peak = cores x GHz x lanes x 2 x FMA units, and its digits
    step table has both forms with the Toeplitz gradients within float rounding of the grouped."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import conv_forms_round as bench

    with monkeypatch.context() as m:
        m.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
        assert bench.peak_gflops(2, 3.0, 2) == 2 * 3.0 * 8 * 2 * 2
    rows = bench.digits_step_forms(clients=2, batch=4, reps=1)
    assert [r[0] for r in rows] == ["grouped", "toeplitz"] and rows[0][2] == "bitwise equal"
    assert rows[1][2] == "bitwise equal" or float(rows[1][2].split()[-1]) < 1e-5
