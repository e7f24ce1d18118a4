"""Evaluation: the standard protocol, and named protocols that switch on the FeSEM authors' choices.

**Standard** (:func:`evaluate`; the ``micro_acc`` ... columns of every run): every client with test
data is tested on the model its method gives it (its own cluster's centre for clustered methods),
with no fine-tuning, and the four scores are pooled over clients as :mod:`mcfl.metrics` defines.

**Named protocols** (``train.eval_protocols: {NAME: {...}}``; columns ``NAME/micro_acc`` ...) score
the same trained model at the same rounds with any of the authors' evaluation choices switched on
(docs/methods/original-code.md, "Evaluation"), so one training run is evaluated both ways and each
difference can be switched on alone:

* ``clients: active``: only the round's active clients (the authors' V1 code evaluates each round's
  sampled clients; with ``clients_per_cluster``, those drawn from each cluster); default ``all``;
* ``finetune_epochs: E``: each tested client first trains E epochs on its own training data from
  the model it is given (V1: one epoch, batch 10); default 0;
* ``combine``: how per-client results become the four numbers:

  - ``clients`` (default): as the standard protocol;
  - ``cluster_mean`` (V1): per cluster (clients tested on one model) the accuracy averaged with
    weights n_i = the client's train + test samples, then the unweighted mean over clusters is
    ``micro_acc``; ``macro_acc`` and ``micro_f1`` are the mean over clusters of the mean device
    accuracy (per-device micro-F1 equals accuracy), ``macro_f1`` of the mean device macro-F1;
  - ``cluster_max`` (V2): every tested client is tested on *every* cluster's model; ``micro_acc``
    and ``micro_f1`` are the maximum over the models of the test-sample-weighted accuracy / F1,
    ``macro_acc`` and ``macro_f1`` the mean over clients under the *last* model (as V2's code does).
    For unclustered methods this is the standard protocol: one model, or NoFed's model per client
    (personal models, not cluster centres: V2's code has no NoFed, and testing every writer on
    every other writer's model would score nothing the authors compared).

The protocols of one evaluation round share a :class:`RoundCache`: each client is predicted on
each model, and fine-tuned from it, at most once a round, whichever protocols ask (on the real
writers' Table-2 config, FedAvg: 18.7 s -> 8.2 s an evaluation, the same scores).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import torch

from mcfl.engine import Task
from mcfl.metrics import clustering_scores, domain_scores, per_client_scores, summarize
from mcfl.streams import FINETUNE

COMBINE = ("clients", "cluster_mean", "cluster_max")
CLIENTS = ("all", "active")


class RoundCache:
    """One evaluation round's test predictions, shared by the standard protocol and every named one.

    The protocols of a round test the same trained models: a client tested on model k (after E
    epochs of fine-tuning from it, or none) gets the same predictions whichever protocol asks, so
    each (k, E, client) is predicted, and fine-tuned, once a round (``v1`` and ``finetune`` share their
    fine-tuning; the standard protocol, ``cluster_mean`` and ``v2`` their plain predictions). A
    request for clients not yet predicted on model k is one ``predict`` over all their rows."""

    def __init__(self, algo, state, fed, rnd: int, active: np.ndarray | None = None):
        self.algo, self.state, self.fed, self.rnd = algo, state, fed, rnd
        self.active = active             # the clients round ``rnd`` trained (None: drawn again)
        self.models = list(algo.eval_models(state))     # [(weights, clients tested on them)]
        self._done: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def tested(self, k: int, clients: np.ndarray, finetune_epochs: int) -> tuple[np.ndarray, ...]:
        """(client of each test row, test rows, predictions, losses) of ``clients`` on model k,
        each client after ``finetune_epochs`` of local fine-tuning from it (0: none)."""
        fed, off = self.fed, self.fed.dev.offsets["test"]
        todo = [int(c) for c in clients if (k, finetune_epochs, int(c)) not in self._done]
        w = self.models[k][0]
        if finetune_epochs:   # each client adapts the model on its train data (the algorithm's own
            trainer = self.algo.fed.trainer      # trainer, all of them in one call: batched, they stack)
            spec = dataclasses.replace(trainer.spec, epochs=finetune_epochs, steps=None)
            batches = ((res.weights, [task.client]) for task, res in
                       trainer.run([Task(c, w) for c in todo], self.rnd, FINETUNE, spec))
        else:
            batches = [(w, todo)] if todo else []
        for wg, mine in batches:
            rows = np.concatenate([np.arange(off[c], off[c + 1]) for c in mine])
            p, loss = self.algo.predict(wg, torch.from_numpy(rows).to(fed.device), self.state)
            p, loss = p.cpu().numpy(), loss.cpu().numpy()
            at = 0
            for c in mine:
                n = int(off[c + 1] - off[c])
                self._done[k, finetune_epochs, c] = (rows[at:at + n], p[at:at + n], loss[at:at + n])
                at += n
        parts = [self._done[k, finetune_epochs, int(c)] for c in clients]
        owners = np.repeat(np.asarray(clients, dtype=np.int64), [len(part[0]) for part in parts])
        return (owners, *(np.concatenate([part[i] for part in parts]) for i in range(3)))


def _tested(cache: RoundCache, models, finetune_epochs: int) -> Iterator[tuple]:
    """For each (model k, its clients): (k, client of each test row, test rows, predictions, losses),
    optionally after each client's local fine-tuning."""
    n_test = cache.fed.dev.n_test
    for k, members in models:
        members = np.asarray(members)
        members = members[n_test[members] > 0]
        if len(members):
            yield (k, *cache.tested(k, members, finetune_epochs))


def evaluate(algo, state, fed, *, finetune_epochs: int = 0, rnd: int = 0,
             cache: RoundCache | None = None) -> tuple[dict[str, float], np.ndarray]:
    """The standard protocol (module docstring): metrics per :mod:`mcfl.metrics`, and the predicted
    label of every test row (store order). ``cache``: the round's, shared with its named protocols."""
    cache = cache or RoundCache(algo, state, fed, rnd)
    parts = list(_tested(cache, enumerate(m for _, m in cache.models), finetune_epochs))
    counts = np.zeros(fed.n_clients, dtype=np.int64)      # models per client: exactly one
    for part in parts:
        counts[np.unique(part[1])] += 1
    wrong = np.flatnonzero((counts != 1) & (fed.dev.n_test > 0))
    if len(wrong):
        raise RuntimeError(f"{algo.name}.eval_models must give every client exactly one model; clients "
                           f"{wrong[:10].tolist()} got {counts[wrong[:10]].tolist()}")
    owners, rows, preds, losses = (np.concatenate([part[i] for part in parts]) for i in (1, 2, 3, 4))
    y = fed.dev.y["test"].cpu().numpy()[rows]
    out = summarize(per_client_scores(owners, y, preds, fed.n_clients, fed.dev.n_classes))
    out["test_loss"] = float(losses.mean())
    out.update(clustering_scores(algo.assignments(state), fed.data.true_clusters))
    if fed.data.domain_test is not None:     # stores that label each test sample with its domain
        out.update(domain_scores(np.asarray(fed.data.domain_test)[rows], y == preds,
                                 fed.data.unseen_domains))
    out.update(algo.extra_metrics(state))
    pred = np.full(int(fed.dev.offsets["test"][-1]), -1, dtype=np.int64)
    pred[rows] = preds
    return out, pred


@dataclasses.dataclass(frozen=True)
class Protocol:
    """One named evaluation protocol (module docstring)."""

    clients: str = "all"
    finetune_epochs: int = 0
    combine: str = "clients"

    def __post_init__(self):
        if self.clients not in CLIENTS:
            raise ValueError(f"clients must be one of {', '.join(CLIENTS)}, got {self.clients!r}")
        if self.combine not in COMBINE:
            raise ValueError(f"combine must be one of {', '.join(COMBINE)}, got {self.combine!r}")
        if not (isinstance(self.finetune_epochs, int) and self.finetune_epochs >= 0):
            raise ValueError(f"finetune_epochs must be an integer >= 0, got {self.finetune_epochs!r}")


def evaluate_protocol(p: Protocol, algo, state, fed, rnd: int,
                      cache: RoundCache | None = None) -> dict[str, float]:
    """The four scores of protocol ``p`` at round ``rnd`` (after that round's update); ``cache``: the
    round's (:class:`RoundCache`), shared with its other protocols."""
    cache = cache or RoundCache(algo, state, fed, rnd)
    if p.clients == "active" and rnd > 0:
        chosen = cache.active if cache.active is not None else fed.clients(rnd)
    else:
        chosen = np.arange(fed.n_clients)
    keep = np.zeros(fed.n_clients, dtype=bool)
    keep[chosen] = True
    models = [(k, np.asarray(m)[keep[np.asarray(m)]]) for k, (_, m) in enumerate(cache.models)]
    combine = p.combine if p.combine != "cluster_max" or algo.clustered else "clients"
    if combine == "cluster_max":             # every chosen client on every cluster's model
        models = [(k, np.flatnonzero(keep)) for k, _ in models]
    y = fed.dev.y["test"].cpu().numpy()
    per_model: dict[int, dict[str, np.ndarray]] = {}
    parts = list(_tested(cache, models, p.finetune_epochs))
    for k in dict.fromkeys(part[0] for part in parts):
        mine = [part for part in parts if part[0] == k]
        owners, rows, preds = (np.concatenate([m[i] for m in mine]) for i in (1, 2, 3))
        per_model[k] = per_client_scores(owners, y[rows], preds, fed.n_clients, fed.dev.n_classes)
    if not per_model:
        raise ValueError(f"round {rnd}: no chosen client has test samples")
    if combine == "clients":
        total = {key: sum(s[key] for s in per_model.values()) for key in ("n", "acc", "f1")}
        return summarize(total)              # each client is in exactly one model's scores
    if combine == "cluster_max":
        summaries = [summarize(s) for s in per_model.values()]
        last = summaries[-1]
        return {"micro_acc": max(s["micro_acc"] for s in summaries),
                "micro_f1": max(s["micro_f1"] for s in summaries),
                "macro_acc": last["macro_acc"], "macro_f1": last["macro_f1"]}
    size = fed.dev.n_train + fed.dev.n_test                # cluster_mean: the authors' V1
    per_cluster = []
    for s in per_model.values():
        has = s["n"] > 0
        per_cluster.append({"micro_acc": float(np.average(s["acc"][has], weights=size[has])),
                            "macro_acc": float(s["acc"][has].mean()),
                            "macro_f1": float(s["f1"][has].mean())})
    out = {k: float(np.mean([c[k] for c in per_cluster])) for k in ("micro_acc", "macro_acc", "macro_f1")}
    out["micro_f1"] = out["macro_acc"]
    return out


def protocols(specs: dict | None) -> dict[str, Protocol]:
    """The run's named protocols (its ``train.eval_protocols``), checked."""
    return {name: Protocol(**spec) for name, spec in (specs or {}).items()}
