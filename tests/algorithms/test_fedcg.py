"""FedCG: the reconstructed equations on hand-checkable cases, the model's equivalences, and the
algorithm's server steps (teacher update, adjacency update, FedAvg of everything)."""

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from conftest import make_run
from mcfl.data import load, prepare
from mcfl.engine import FlatModel
from mcfl.models import build, init_weights
from mcfl.models.fedcg import (DomainLayer, FedCGNet, distance_adjacency, hamming_adjacency,
                               inverse_distances, normalise_adjacency, random_adjacency,
                               uniform_adjacency)

LAM = 0.3


# ----------------------------------------------------------------------------------- Eq. 6
def test_distance_adjacency_matches_hand_computation():
    x = torch.tensor([[0.0], [1.0], [3.0]])          # distances d01 = 1, d02 = 3, d12 = 2
    s = inverse_distances(x)
    assert torch.allclose(s, s.T) and torch.all(s.diag() == 0)
    assert torch.allclose(s, torch.tensor([[0, 1, 1 / 3], [1, 0, 1 / 2], [1 / 3, 1 / 2, 0]]))
    a = distance_adjacency(x, LAM)
    o = 1 - LAM
    expected = torch.tensor([[LAM, 0.75 * o, 0.25 * o],
                             [2 / 3 * o, LAM, 1 / 3 * o],
                             [0.4 * o, 0.6 * o, LAM]])
    assert torch.allclose(a, expected, atol=1e-6)
    assert torch.allclose(a.sum(1), torch.ones(3))
    assert not torch.allclose(a, a.T)                # row-normalised: symmetric only when the rows'
    two = distance_adjacency(x[:2], LAM)              # normalisers agree, e.g. K = 2
    assert torch.allclose(two, two.T) and torch.allclose(two, torch.tensor([[LAM, o], [o, LAM]]))


def test_uniform_hamming_and_random_graphs_are_symmetric_with_unit_rows():
    u = uniform_adjacency(4, LAM)
    assert torch.allclose(u, u.T) and torch.allclose(u.sum(1), torch.ones(4))
    assert torch.allclose(u[0], torch.tensor([LAM, (1 - LAM) / 3, (1 - LAM) / 3, (1 - LAM) / 3]))
    h = hamming_adjacency(4, LAM)                    # codes 00 01 10 11: Hamming 1, 1, 2 from 00
    assert torch.allclose(h, h.T) and torch.allclose(h.sum(1), torch.ones(4))
    assert torch.allclose(h[0], torch.tensor([LAM, 0.4 * (1 - LAM), 0.4 * (1 - LAM), 0.2 * (1 - LAM)]))
    r = random_adjacency(5, LAM, torch.Generator().manual_seed(0))
    assert torch.allclose(r.sum(1), torch.ones(5)) and torch.allclose(r.diag(), torch.full((5,), LAM))
    assert torch.equal(normalise_adjacency(torch.zeros(1, 1), LAM), torch.ones(1, 1))


# ----------------------------------------------------------------------------------- Eqs. 4-5
def _layer(K=3, **kw):
    torch.manual_seed(0)
    layer = DomainLayer(nn.Linear(4, 2), K, **kw)
    layer.reset_domain_parameters(torch.Generator().manual_seed(1))
    return layer


def test_residual_layer_and_gcn_match_equations_4_and_5():
    layer = _layer(K=2, relu=True)
    with torch.no_grad():
        layer.alpha.fill_(0.7)
        layer.adjacency.copy_(torch.tensor([[0.6, 0.4], [0.2, 0.8]]))
        layer.weights[0].copy_(torch.randn(layer.d, layer.d) * 0.3)
    x_hat = torch.relu(layer.adjacency @ layer.theta @ layer.weights[0])          # Eq. 5
    assert torch.allclose(layer.gcn(layer.theta), x_hat)
    h = torch.randn(5, 4)
    w = torch.softmax(torch.randn(5, 2), 1)
    layer.assign = w
    out = layer(h)
    W = [x_hat[k, :8].view(2, 4) for k in range(2)]
    b = [x_hat[k, 8:] for k in range(2)]
    res = sum(w[:, k:k + 1] * (h @ W[k].T + b[k]) for k in range(2))
    assert torch.allclose(out, layer.base(h) + 0.7 * res, atol=1e-6)               # Eq. 4


def test_k1_with_alpha_zero_is_the_plain_network():
    plain = build("digits_cnn", (1, 12, 12), 10)
    init_weights(plain, 3)
    x = torch.rand(7, 1, 12, 12)
    for layers in ("last", "conv", "all"):
        net = FedCGNet(_copy(plain), (1, 12, 12), 1, layers=layers, dc_width=4, dc_kernel=3,
                       bottleneck=64)
        net.reset_extras(5)
        for mode in (net.train, net.eval):
            mode()
            plain.train(net.training)
            assert torch.allclose(net(x), plain(x), atol=1e-6)
        with torch.no_grad():                         # and alpha != 0 does change it
            for _, m in net.domain_layers():
                m.alpha.fill_(1.0)
        assert not torch.allclose(net(x), plain(x), atol=1e-3)


def test_a_step_on_one_domain_reaches_every_connected_domain_through_the_gcn():
    # domains 0 and 1 connected, 2 isolated; no W: the GCN output of a domain moves iff it is
    # connected to the domain whose samples produced the gradient
    for projection in (False, True):
        layer = _layer(K=3, projection=projection, relu=False)
        with torch.no_grad():
            layer.adjacency.copy_(torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]))
            layer.alpha.fill_(1.0)
        fm = FlatModel(layer)
        before = layer.gcn(layer.theta).detach().clone()
        layer.assign = torch.zeros(6, dtype=torch.long)           # a batch of domain-0 samples only
        fm.grad.zero_()
        layer(torch.randn(6, 4)).pow(2).sum().backward()
        assert fm.grad[fm.slices["theta"]].view(3, -1)[2].abs().sum() == 0   # A_02 = 0: no gradient
        with torch.no_grad():
            fm.flat[:fm.n_params] -= 0.1 * fm.grad
        moved = (layer.gcn(layer.theta).detach() - before).abs().sum(1)
        assert moved[0] > 0 and moved[1] > 0
        assert (moved[2] > 0) == projection               # only the shared W reaches domain 2


@pytest.mark.parametrize("one_pass", [0, 8])
def test_soft_assignment_with_one_hot_probabilities_equals_hard_assignment(monkeypatch, one_pass):
    # one_pass 0: hard assignment runs one pass per domain on its rows; 8: all K kernels, one-hot
    monkeypatch.setattr("mcfl.models.fedcg.ONE_PASS_MAX_K", one_pass)
    plain = build("digits_cnn", (1, 12, 12), 10)
    net = FedCGNet(plain, (1, 12, 12), 3, layers="conv", dc_width=4, dc_kernel=3, bottleneck=64)
    net.reset_extras(0)
    with torch.no_grad():
        for _, m in net.domain_layers():
            m.alpha.fill_(0.8)
    net.eval()
    x = torch.rand(9, 1, 12, 12)
    ids = torch.tensor([0, 1, 2, 2, 1, 0, 0, 2, 1])
    with net.assigned(ids):
        hard = net(x)
    with net.assigned(torch.nn.functional.one_hot(ids, 3).float()):
        soft = net(x)
    assert torch.allclose(hard, soft, atol=1e-5)
    net.test_assignment = "hard"
    student_hard = net(x)
    with net.assigned(torch.nn.functional.one_hot(net.student(x).argmax(1), 3).float()):
        assert torch.allclose(student_hard, net(x), atol=1e-5)
    net.test_assignment = "soft"
    assert not torch.allclose(net(x), student_hard, atol=1e-4)   # real probabilities do mix


def test_gcn_output_is_precomputed_at_inference_and_refreshed_when_weights_change():
    layer = _layer(K=3)
    fm = FlatModel(layer)
    with torch.no_grad():
        first = layer.domain_parameters()
        assert layer.domain_parameters() is first                  # cached
        fm.load(fm.get() * 2)
        second = layer.domain_parameters()
    assert second is not first and torch.allclose(second, layer.gcn(layer.theta))


def test_a_too_large_projection_asks_for_a_bottleneck():
    with pytest.raises(ValueError, match="bottleneck"):
        DomainLayer(nn.Linear(12000, 1), 2)
    small = DomainLayer(nn.Linear(12000, 1), 2, bottleneck=64)
    assert [tuple(w.shape) for w in small.weights] == [(12001, 188), (188, 12001)]


def _copy(m):
    import copy

    return copy.deepcopy(m)


# ------------------------------------------------------------------------------- the algorithm
@pytest.fixture(scope="module")
def domains_store(tmp_path_factory):
    return prepare("digits_domains", tmp_path_factory.mktemp("data") / "dd", clients=8, seed=0)


def _algo(store, rounds=2, executor="sequential", **params):
    from mcfl.algorithms import get
    from mcfl.federation import build_federation

    run = make_run("digits_domains", "FedCG", dict(K=3, dc_width=4, dc_kernel=3, bottleneck=64, **params),
                   rounds=rounds, clients_per_round=4, model={"name": "digits_cnn"}, executor=executor)
    fed = build_federation(load(store), run["model"], run["train"], 0)
    cls = get("FedCG")
    return cls(fed, cls.Params(**run["params"])), fed


def test_backbone_starts_from_the_same_weights_as_every_other_method(domains_store):
    algo, fed = _algo(domains_store)
    state = algo.init()
    algo.flat.load(state.w)
    plain = dict(fed.model.module.named_parameters())
    for name, p in algo.net.backbone.named_parameters():
        key = name.replace(".base.", ".")
        if key in plain:
            assert torch.equal(p, plain[key]), name
    assert fed.model.size < algo.flat.size


def test_teacher_takes_the_student_every_R_rounds_and_adjacency_follows_the_parameters(domains_store):
    algo, fed = _algo(domains_store, teacher_every=2, calibrate_teacher=False)
    s0 = algo.init()
    assert torch.equal(s0.w[algo.layers[0][3]].view(3, 3), torch.eye(3))          # eye init
    s1, d1 = algo.round(s0, fed.clients(1), 1)
    assert torch.equal(s1.w[algo.teacher_sl], s0.w[algo.teacher_sl])             # fixed in between
    assert not torch.equal(s1.w[algo.student_sl], s0.w[algo.student_sl])
    assert torch.equal(s1.w[algo.layers[0][3]].view(3, 3), torch.eye(3))
    s2, d2 = algo.round(s1, fed.clients(2), 2)
    assert torch.equal(s2.w[algo.teacher_sl], s2.w[algo.student_sl])             # round R
    _, _, theta, adj = algo.layers[0]
    expected = distance_adjacency(s2.w[theta].view(3, -1), algo.p.self_weight)
    assert torch.allclose(s2.w[adj].view(3, 3), expected)
    assert {"train_loss", "cls_loss", "domain_loss", "domain_entropy", "alpha_3"} <= set(d2)


@pytest.mark.slow
def test_batched_executor_stacks_fedcg_and_matches_sequential(domains_store, monkeypatch):
    """FedCG's loss is batchable: under ``executor: batched`` a round trains its clients stacked
    (never one at a time) to the sequential round's weights up to float rounding (clipping on, as
    in the default config), with the same diagnostics (domain counts exactly)."""
    from mcfl.algorithms import get
    from mcfl.engine import LocalTrainer
    from mcfl.executors import BatchedTrainer
    from mcfl.federation import build_federation

    out = {}
    for ex in ("sequential", "batched"):
        run = make_run("digits_domains", "FedCG", dict(K=3, dc_width=4, dc_kernel=3, bottleneck=64),
                       rounds=2, clients_per_round=4, model={"name": "digits_cnn"}, executor=ex,
                       max_grad_norm=5.0)
        fed = build_federation(load(domains_store), run["model"], run["train"], 0)
        algo = get("FedCG")(fed, get("FedCG").Params(**run["params"]))
        if ex == "batched":
            assert isinstance(algo.fed.trainer, BatchedTrainer) and algo.fed.trainer.fallback == "stacked"
            monkeypatch.setattr(LocalTrainer, "train", None)        # no client trained on its own
        state = algo.init()
        for r in (1, 2):
            state, diag = algo.round(state, fed.clients(r), r)
        out[ex] = state.w, diag
    (ws, ds), (wb, db) = out["sequential"], out["batched"]
    assert torch.allclose(ws, wb, atol=1e-5, rtol=0), float((ws - wb).abs().max())
    assert ds["domain_entropy"] == db["domain_entropy"]
    for key in ("train_loss", "cls_loss", "domain_loss", "alpha_3"):
        assert ds[key] == pytest.approx(db[key], rel=1e-5), key


ZERO = dict(relu=False, residual_init="zero", alpha_init=1.0)        # the default config's
CONV = dict(layers="conv", relu=False, alpha_init=1.0)
DEEP = dict(layers="conv", gcn_layers=2, alpha_init=1.0)


@pytest.mark.parametrize("clip, extra", [(None, ZERO), (0.5, ZERO), (0.5, CONV), (None, DEEP)],
                         ids=["plain", "clip", "conv", "deep"])
def test_projected_path_equals_the_stacked_path(domains_store, monkeypatch, clip, extra):
    """The batched executor's projected path (the GCN's projection matrices kept as W0 minus lr
    times the clients' rank-K step history, never materialised; clipping from K x K Gram matrices)
    gives the stacked path's round (``lowrank=0``: every projection gradient formed and stepped)
    to float rounding: the default config's GCN, both convolutions' GCNs (four matrices), and two
    propagations with a ReLU between them. A bound of 0.5 clips most steps. (Clipping with a ReLU
    in the GCN is left out: a ReLU's kink turns rounding into different gradients, so there even
    the stacked and the sequential path differ by up to 2e-4 after one round.)"""
    from mcfl.algorithms import get
    from mcfl.executors import ProjectedPath
    from mcfl.federation import build_federation

    taken = []
    chunk = ProjectedPath._train_chunk_projected
    monkeypatch.setattr(ProjectedPath, "_train_chunk_projected",
                        lambda self, *a: taken.append(len(a[0])) or chunk(self, *a))
    out = {}
    for lowrank in (0.0, 0.5):
        run = make_run("digits_domains", "FedCG", dict(K=3, dc_width=4, dc_kernel=3, bottleneck=64, **extra),
                       rounds=1, clients_per_round=4, model={"name": "digits_cnn"}, executor="batched",
                       max_grad_norm=clip)
        fed = build_federation(load(domains_store), run["model"], run["train"], 0)
        algo = get("FedCG")(fed, get("FedCG").Params(**run["params"]))
        algo.fed.trainer.lowrank = lowrank
        state, diag = algo.round(algo.init(), fed.clients(1), 1)
        out[lowrank] = state.w, diag
    assert taken == [4]                                 # one chunk of 4 clients, lowrank > 0 only
    (ws, ds), (wp, dp) = out[0.0], out[0.5]
    assert torch.allclose(wp, ws, rtol=1e-5, atol=1e-6), float((wp - ws).abs().max())
    for key in ("train_loss", "cls_loss", "domain_loss", "alpha_3"):
        assert dp[key] == pytest.approx(ds[key], rel=1e-5), key
    w0 = algo.init().w
    names = [f"{n}.weights.{j}" for n, m in algo.net.projected_layers() for j in range(len(m.weights))]
    assert len(names) == (2 if extra is ZERO else 4)
    for name in names:                                  # every projection trained
        assert not torch.equal(wp[algo.flat.slices[name]], w0[algo.flat.slices[name]]), name


def test_projected_path_rule(domains_store):
    """The projected path applies while the history (steps x K rows of each matrix's input and
    output gradient) holds at most PROJECTED = 3 times the matrices' entries: the digits CNN's last
    convolution has d = 16 x 32 x 3 x 3 + 32 = 4,640 parameters, bottleneck 64 -> 73, so with K = 3
    up to S steps where S x 3 x 2 x (4,640 + 73) <= 3 x 2 x 4,640 x 73, i.e. S <= 71; never with
    a proximal term or with ``lowrank=0``."""
    from mcfl.engine import Task
    from mcfl.executors import PROJECTED

    algo, _ = _algo(domains_store, executor="batched")
    trainer, w0, loss = algo.fed.trainer, algo.fed.w0, algo.objective(algo.init())
    assert PROJECTED == 3.0
    assert [m.weights[0].shape for _, m in algo.net.projected_layers()] == [(4640, 73)]
    task = Task(0, w0, loss=loss)
    assert trainer._projected_applies([task], 71) and not trainer._projected_applies([task], 72)
    assert not trainer._projected_applies([Task(0, w0, loss=loss, mu=0.1, anchor=w0)], 1)
    trainer.lowrank = 0
    assert not trainer._projected_applies([task], 1)


def test_calibrated_teacher_spreads_pseudo_labels_over_the_domains(domains_store):
    algo, fed = _algo(domains_store)
    shares = []
    for calibrate in (False, True):
        algo.p.calibrate_teacher = calibrate
        w = algo.init().w
        algo.flat.load(w)
        x = fed.dev.inputs(torch.arange(int(fed.dev.offsets["train"][-1])))
        with torch.no_grad():
            shares.append(torch.bincount(algo.net.teacher(x).argmax(1), minlength=3).float() / len(x))
    assert shares[1].max() < 0.6 and shares[1].min() > 0.1
    assert shares[0].max() > shares[1].max()


def test_oracle_and_kmeans_clustering_feed_their_domains(domains_store):
    algo, fed = _algo(domains_store, clustering="oracle")
    state = algo.init()
    rows = torch.arange(10)
    assert torch.equal(algo.objective(state).targets(algo.net, fed.dev.inputs(rows), rows),
                       torch.from_numpy(np.array(fed.data.domain_train[:10])))
    ext = algo.evaluation.external(torch.arange(int(fed.dev.offsets["test"][-1])), "source", state)
    dom = np.asarray(fed.data.domain_test)
    assert torch.equal(ext[dom == 3], torch.full(((dom == 3).sum(), 3), 1 / 3))   # unseen: uniform
    assert torch.equal(ext[dom == 1].argmax(1), torch.ones((dom == 1).sum(), dtype=torch.long))
    km, fed2 = _algo(domains_store, clustering="kmeans", restarts=2)
    s = km.init()
    assert s.client_cluster.min() >= 0 and s.client_cluster.max() < 3
    assert np.array_equal(km.assignments(s), s.client_cluster.numpy())
    rows = torch.arange(int(fed2.dev.offsets["train"][-1]))
    per_row = s.client_cluster[torch.from_numpy(np.repeat(np.arange(fed2.n_clients), fed2.dev.n_train))]
    assert torch.equal(km.objective(s).targets(km.net, fed2.dev.inputs(rows), rows), per_row)


def test_oracle_needs_per_sample_domains(digits_store):
    from mcfl.algorithms import get
    from mcfl.federation import build_federation

    run = make_run("digits", "FedCG", {"K": 2, "clustering": "oracle"})
    fed = build_federation(load(digits_store), run["model"], run["train"], 0)
    with pytest.raises(ValueError, match="per-sample domains"):
        get("FedCG")(fed, get("FedCG").Params(**run["params"]))


def test_bad_params_name_the_key():
    from mcfl.algorithms.fedcg import Params

    with pytest.raises(ValueError, match="clustering must be one of"):
        Params(clustering="spectral")
    with pytest.raises(ValueError, match="self_weight"):
        Params(self_weight=1.5)
    for kw in (dict(K=2, self_weight=0.5), dict(K=4, self_weight=0.25, adjacency="uniform")):
        with pytest.raises(ValueError, match="every domain would get the same parameters"):
            Params(**kw)
    Params(K=2, self_weight=0.5, gcn=False)           # no GCN, no mixing: allowed


def test_self_weight_one_over_k_merges_the_domains_and_above_one_half_keeps_them_apart():
    # Eq. 6 with K = 2: one other domain per row, so A = [[l, 1-l], [1-l, l]] whatever the distance
    theta = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    merged = distance_adjacency(theta, 0.5) @ theta
    assert torch.allclose(merged, torch.tensor([[0.5, 1.5], [0.5, 1.5]]))      # identical rows
    kept = distance_adjacency(theta, 0.75) @ theta
    assert torch.allclose(kept, torch.tensor([[0.75, 0.75], [0.25, 2.25]]))
    assert torch.allclose(kept[0] - kept[1], 0.5 * (theta[0] - theta[1]))      # (2l - 1) of it
    # uniform similarities shrink differences by (K l - 1)/(K - 1): K = 4, l = 0.75 -> 2/3
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    y = uniform_adjacency(4, 0.75) @ x
    assert torch.allclose(y[0] - y[2], (x[0] - x[2]) * 2 / 3, atol=1e-6)
    # above 1/2, A is strictly diagonally dominant, so invertible for any similarities
    s = torch.rand(6, 6, generator=torch.Generator().manual_seed(1))
    a = normalise_adjacency((s + s.T) / 2, 0.51)
    assert torch.linalg.matrix_rank(a) == 6


@pytest.mark.slow
def test_runner_reports_soft_hard_and_unseen_domain_accuracy(domains_store, tmp_path):
    from mcfl.runner import train

    run = make_run("digits_domains", "FedCG", dict(K=3, dc_width=4, dc_kernel=3, bottleneck=64,
                                                    teacher_every=1), rounds=2, clients_per_round=4,
                   model={"name": "digits_cnn"})
    res = train(run, domains_store, tmp_path / "out", progress=False)
    f = res["final"]
    for key in ("micro_acc", "soft_acc", "hard_acc", "acc_unseen", "soft_acc_unseen",
                "hard_acc_unseen", "soft_only_unseen", "hard_only_unseen", "acc_dom0", "domain_nmi",
                "alpha_3", "ari"):
        assert key in f, key
    assert f["micro_acc"] == pytest.approx(f["soft_acc"])           # default test assignment: soft
    history = pd.read_csv(tmp_path / "out" / "history.csv")
    assert (history["local_s"] > 0).all()            # FedCG's own trainer is the one timed
    again = train(run, domains_store, tmp_path / "again", progress=False)
    assert again["final"] == f                                       # seeded: bitwise repeatable
    # assignments.csv: each client's mix of discovered domains beside its majority domain
    a = pd.read_csv(tmp_path / "out" / "assignments.csv")
    share = a[[f"domain_share_{k}" for k in range(3)]].to_numpy()
    assert np.allclose(share.sum(1), 1, atol=1e-3) and (share >= 0).all()
    assert (share.max(1) >= 1 / 3).all()
    assert (share[np.arange(len(a)), a["cluster"]] == share.max(1)).all()   # cluster = the majority


def test_discordant_counts_pair_soft_and_hard_on_the_unseen_domain(domains_store):
    # random residuals and an untrained student: soft and hard assignment disagree on some images
    algo, fed = _algo(domains_store, residual_init="zero", alpha_init=1.0, relu=False)
    state = algo.init()
    g = torch.Generator().manual_seed(0)
    for *_, theta, _ in algo.layers:
        state.w[theta] = 0.5 * torch.randn(theta.stop - theta.start, generator=g)
    f = algo.extra_metrics(state)
    unseen = np.isin(fed.data.domain_test, fed.data.unseen_domains)
    rows = torch.arange(len(unseen))
    hit = {m: (algo.evaluation.predict(state.w, rows, m, state)[0] == fed.dev.y["test"]).numpy()[unseen]
           for m in ("soft", "hard")}
    assert f["soft_only_unseen"] == (hit["soft"] & ~hit["hard"]).sum() > 0
    assert f["hard_only_unseen"] == (hit["hard"] & ~hit["soft"]).sum()
    # the paired counts are the accuracy difference, image by image
    assert (f["soft_only_unseen"] - f["hard_only_unseen"]) / unseen.sum() == pytest.approx(
        f["soft_acc_unseen"] - f["hard_acc_unseen"])


def test_zero_residual_branch_starts_as_the_plain_network_but_trains_at_once():
    # residual_init: zero, alpha 1: the same function as the plain network at the start (like
    # alpha 0), but the domain parameters get gradient from the first step; with alpha 0 and the
    # default random theta they get none (the gradient reaching theta is alpha times its signal)
    plain = build("digits_cnn", (1, 12, 12), 10)
    init_weights(plain, 3)
    x, y = torch.rand(8, 1, 12, 12), torch.randint(0, 10, (8,))
    grads = {}
    for zero, alpha in ((True, 1.0), (False, 0.0)):
        net = FedCGNet(_copy(plain), (1, 12, 12), 3, layers="last", dc_width=4, dc_kernel=3,
                       relu=False, bottleneck=64)
        net.reset_extras(5, alpha=alpha, zero_theta=zero)
        net.train()
        with net.assigned(torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])):
            assert torch.allclose(net(x), plain(x), atol=1e-6)
            torch.nn.functional.cross_entropy(net(x), y).backward()
        (_, layer), = net.domain_layers()
        grads[zero] = layer.theta.grad.abs().sum(1)
    assert (grads[True] > 0).all()                  # every domain present in the batch moves
    assert (grads[False] == 0).all()


def test_zero_residual_init_is_refused_where_it_could_never_train():
    from mcfl.algorithms.fedcg import Params

    with pytest.raises(ValueError, match="relu: false"):
        Params(residual_init="zero", alpha_init=1.0)
    with pytest.raises(ValueError, match="alpha_init"):
        Params(residual_init="zero", relu=False)
    Params(residual_init="zero", relu=False, alpha_init=1.0)


# ------------------------------------------------------------ positive control: domains that matter
@pytest.fixture(scope="module")
def conflict_store(tmp_path_factory):
    """Digits 0-3 whose label is shifted by one in domain 1 ((y + d) mod 4), with the domain drawn
    at random per image: the same image has a different label in each domain, and nothing in the
    image tells the domains apart. One shared model can be right on at most about half of them."""
    from sklearn.datasets import load_digits

    from mcfl.data.store import ClientData
    from mcfl.data.write import write_store

    d = load_digits()
    keep = d.target < 4
    x, y = d.images[keep].astype(np.uint8)[:, None], d.target[keep]
    rng = np.random.default_rng(0)
    dom = rng.integers(0, 2, len(y))
    label = (y + dom) % 4
    clients = []
    for i, idx in enumerate(np.array_split(rng.permutation(len(y)), 4)):
        tr, te = idx[: 3 * len(idx) // 4], idx[3 * len(idx) // 4:]
        clients.append(ClientData(str(i), x[tr], label[tr], x[te], label[te], 0, dom[tr], dom[te]))
    return write_store(tmp_path_factory.mktemp("data") / "conflict", clients, n_classes=4,
                       source="test", params={}, x_scale=1 / 16, domains={"names": ["a", "b"], "unseen": []})


@pytest.mark.slow
def test_domain_specific_parameters_learn_what_one_shared_model_cannot(conflict_store, tmp_path):
    # true domains in training (oracle) and at test (source): FedCG's defaults, GCN included, must
    # keep the two domains' parameters apart; with self_weight 1/2 the GCN made them identical
    from mcfl.runner import train

    def acc(method, **params):
        run = make_run("conflict", method, params, rounds=20, lr=0.1, batch_size=10, eval_every=20)
        return train(run, conflict_store, tmp_path / f"{method}-{len(params)}", progress=False)["final"]

    fedavg = acc("FedAvg")["micro_acc"]
    f = acc("FedCG", K=2, clustering="oracle", test_assignment="source", layers="all", dc_width=4,
            dc_kernel=3, residual_init="zero", alpha_init=1.0, relu=False)
    assert fedavg < 0.6
    assert f["micro_acc"] > 0.95
    # the student cannot see the domain, so its soft mixture is no better than one shared model
    assert f["soft_acc"] < 0.6


def test_test_assignment_is_set_for_a_block_only():
    """Evaluation picks the test-time w(x) for a block (``FedCGNet.testing``): the student's argmax
    under ``hard`` is its one-hot, and the network is back to ``soft`` afterwards, errors included."""
    plain = build("digits_cnn", (1, 12, 12), 10)
    init_weights(plain, 3)
    net = FedCGNet(plain, (1, 12, 12), 3, layers="last", dc_width=4, dc_kernel=3).eval()
    net.reset_extras(5)
    x = torch.rand(6, 1, 12, 12)
    p = torch.softmax(net.student(x), 1)
    assert torch.equal(net.assignment(x), p)
    with net.testing("hard"):
        assert torch.equal(net.assignment(x), p.argmax(1))
    assert net.test_assignment == "soft"
    with pytest.raises(RuntimeError), net.testing("teacher"):
        assert torch.equal(net.assignment(x), net.teacher(x).argmax(1))
        raise RuntimeError("stop")
    assert net.test_assignment == "soft"
    with pytest.raises(ValueError, match="unknown test assignment 'source'"), net.testing("source"):
        pass
