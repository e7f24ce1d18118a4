"""FedCG at test time (§3.2) and what the run reports of its domains.

"At test time, we want our model to deal with data from arbitrary domains by simply combining
residuals of seen ones": w(x) = g_s(x), the student's probabilities (``test_assignment: soft``), so
an unseen domain is a mix of seen ones; ``hard`` uses the student's argmax; ``source`` the
training-time source (teacher argmax, the client's k-means cluster, the oracle domain).

Evaluation rounds also report ``soft_acc``/``hard_acc`` (on stores with per-sample domains also
``*_acc_unseen``/``*_acc_seen``, and ``soft_only_unseen``/``hard_only_unseen``: how many
unseen-domain test images only soft / only hard assignment classifies correctly, for a paired test),
each layer's alpha (Eq. 4) and, with true domains, ``domain_nmi`` between the student's argmax and the
true domain of the training samples. A client's cluster is its k-means cluster, else its most
frequent domain among its training samples.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import normalized_mutual_info_score

from mcfl.algorithms.fedcg.params import Params, State
from mcfl.metrics import domain_scores, paired_counts, per_client_scores, summarize
from mcfl.models.fedcg import FedCGNet


def alphas(p: Params, flat, layers: list, w: torch.Tensor) -> dict[str, float]:
    """Each domain layer's alpha of Eq. 4 (none without the domain-agnostic residual)."""
    if not p.agnostic:
        return {}
    return {f"alpha_{n}": float(w[flat.slices[f"backbone.{n}.alpha"]]) for n, *_ in layers}


class Evaluation:
    """Test-time assignment and the domain metrics of a FedCG run on federation ``fed`` (whose
    trainer is FedCG's own); ``domains`` each test row's true domain (``clustering: oracle``)."""

    def __init__(self, fed, net: FedCGNet, flat, p: Params, layers: list, *,
                 row_client: torch.Tensor, domains: torch.Tensor | None = None):
        self.fed, self.net, self.flat, self.p, self.layers = fed, net, flat, p, layers
        self.row_client, self.domains = row_client, domains

    def external(self, rows: torch.Tensor, mode: str, state: State) -> torch.Tensor | None:
        """The test-time assignment of ``rows`` when it does not come from the network itself."""
        if mode != "source" or self.p.clustering == "classifier":
            return None
        K = self.p.K
        if self.p.clustering == "kmeans":
            ids = state.client_cluster.to(rows.device)[self.row_client[rows]]
        else:
            ids = self.domains[rows]
        out = torch.full((len(rows), K), 1.0 / K, device=rows.device)   # unseen oracle domains: uniform
        known = ids < K
        out[known] = F.one_hot(ids[known], K).float()
        return out

    def predict(self, w: torch.Tensor, rows: torch.Tensor, mode: str, state: State, chunk: int = 4096):
        """Predictions and losses of test ``rows`` under test assignment ``mode``."""
        preds, losses = [], []
        with self.net.testing({"source": "teacher"}.get(mode, mode)):
            for i in range(0, len(rows), chunk):
                r = rows[i:i + chunk]
                ext = self.external(r, mode, state)
                if ext is None:
                    p, l = self.fed.trainer.predict(w, r, chunk=chunk)
                else:
                    with self.net.assigned(ext):
                        p, l = self.fed.trainer.predict(w, r, chunk=chunk)
                preds.append(p)
                losses.append(l)
        return torch.cat(preds), torch.cat(losses)

    def metrics(self, state: State) -> dict[str, float]:
        """Soft and hard test assignment side by side, alpha per layer, and clustering quality."""
        fed = self.fed
        rows = torch.arange(int(fed.dev.offsets["test"][-1]), device=fed.device)
        owner = self.row_client.cpu().numpy()
        truth = fed.dev.y["test"].cpu().numpy()
        out, hit = {}, {}
        for mode in ("soft", "hard"):
            pred = self.predict(state.w, rows, mode, state)[0].cpu().numpy()
            s = summarize(per_client_scores(owner, truth, pred, fed.n_clients, fed.dev.n_classes))
            out[f"{mode}_acc"] = s["micro_acc"]
            hit[mode] = truth == pred
            if fed.data.domain_test is not None:
                d = domain_scores(np.asarray(fed.data.domain_test), hit[mode], fed.data.unseen_domains)
                out.update({f"{mode}_{k}": v for k, v in d.items() if k in ("acc_seen", "acc_unseen")})
        if "soft_acc_unseen" in out:    # the discordant unseen images, for a paired (sign) test
            new = np.isin(np.asarray(fed.data.domain_test), list(fed.data.unseen_domains))
            only = paired_counts(hit["soft"][new], hit["hard"][new])
            out["soft_only_unseen"], out["hard_only_unseen"] = map(float, only)
        if fed.data.domain_train is not None:
            labels = self.student_labels(state.w)
            out["domain_nmi"] = float(normalized_mutual_info_score(np.asarray(fed.data.domain_train),
                                                                   labels))
        out.update(alphas(self.p, self.flat, self.layers, state.w))
        return out

    @torch.no_grad()
    def student_labels(self, w: torch.Tensor, chunk: int = 4096) -> np.ndarray:
        """The student's argmax on every training sample."""
        self.flat.load(w)
        self.net.eval()
        n = int(self.fed.dev.offsets["train"][-1])
        out = [self.net.student(self.fed.dev.inputs(torch.arange(i, min(i + chunk, n),
                                                                 device=self.fed.device))).argmax(1)
               for i in range(0, n, chunk)]
        return torch.cat(out).cpu().numpy() if out else np.zeros(0, dtype=np.int64)

    def domain_counts(self, state: State) -> np.ndarray:
        """(clients, K): how many of each client's training samples fall in each domain (oracle
        domain, or the student's argmax)."""
        labels = (np.asarray(self.fed.data.domain_train) if self.p.clustering == "oracle"
                  else self.student_labels(state.w))
        off = self.fed.dev.offsets["train"]
        return np.stack([np.bincount(labels[off[c]:off[c + 1]], minlength=self.p.K)
                         for c in range(self.fed.n_clients)])

    def assignments(self, state: State) -> np.ndarray:
        """Cluster per client: its k-means cluster, else its most frequent domain among its training
        samples (oracle domain, or the student's argmax)."""
        if self.p.clustering == "kmeans":
            return state.client_cluster.cpu().numpy().copy()
        return self.domain_counts(state).argmax(1)

    def client_columns(self, state: State) -> dict[str, np.ndarray]:
        """With discovered domains, each client's share of training samples the student puts in
        each domain (``domain_share_<k>``): a client's mix of domains, where its majority alone
        (``cluster``) can hide that every client spreads over the same few."""
        if self.p.clustering != "classifier":
            return {}
        counts = self.domain_counts(state)
        share = counts / np.maximum(counts.sum(1, keepdims=True), 1)
        return {f"domain_share_{k}": np.round(share[:, k], 4) for k in range(self.p.K)}
