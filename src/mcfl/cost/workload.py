"""What a run does, counted from its config and its data's size, with nothing measured: a client's
local steps, the clients of a round, the evaluations, and the sizes of a dataset (from its prepared
store, else from its source: the LEAF JSON files' ``num_samples``, the embedded writers, or the
dataset's published size, :data:`TYPICAL`). :func:`run_cost` turns them into a run's time given
the seconds of one local step and of one test sample: :mod:`mcfl.cost` measures those for
``mcfl check-config``; the workflow's job order (:mod:`mcfl.plan.train`) counts sample passes
instead."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np

from mcfl.config import n_clients
from mcfl.data.femnist_sample import embedded_file
from mcfl.trainspec import TrainSpec, read_schema

#: model -> (input shape, classes) of the data it was designed for (used before a store exists)
MODEL_SHAPES = {"femnist_cnn": ((1, 28, 28), 62), "celeba_cnn": ((3, 84, 84), 2),
                "digits_cnn": ((1, 8, 8), 10), "logreg": ((60,), 5)}

#: source -> (clients, training samples, test samples) as published, for a store not prepared yet:
#: LEAF's FEMNIST (3,550 writers, 805,263 images; LEAF's 90/10 split) and CelebA (9,343
#: celebrities, 200,288 images), sklearn's digits (1,797 images; the source's 80/20 default split)
#: and LEAF's synthetic generator (about 100 samples a client on average, 80/20)
TYPICAL = {"femnist": (3550, 724737, 80526), "celeba": (9343, 180259, 20029),
           "digits": (100, 1438, 359), "digits_domains": (20, 1348, 449),
           "synthetic": (100, 8000, 2000)}

@dataclasses.dataclass(frozen=True)
class DataSize:
    """What the estimate needs to know of a dataset."""
    x_shape: tuple
    n_classes: int
    n_clients: int
    n_train: int            # training samples, all clients
    n_test: int             # test samples, all clients
    origin: str             # where the sizes come from ("prepared store", "LEAF JSON", ...)


@dataclasses.dataclass(frozen=True)
class RunCost:
    dataset: str
    label: str
    seed: int
    rounds: int
    round_s: float          # one round's local training
    evals: int
    eval_s: float           # one evaluation
    init_s: float           # centre initialisation charged to this run (0 if shared or none)

    @property
    def total_s(self) -> float:
        return self.init_s + self.rounds * self.round_s + self.evals * self.eval_s


def local_steps(train, n_per_client: float) -> int:
    """A client's local SGD steps in a round: ``local_steps``, or ``local_epochs`` passes over
    ``n_per_client`` samples in batches of ``batch_size``."""
    if train.local_steps:
        return int(train.local_steps)
    return int(train.local_epochs) * max(1, math.ceil(n_per_client / int(train.batch_size)))


def evaluations(rounds: int, every: int) -> int:
    """Evaluations of a run: every ``every`` rounds, and after the last."""
    return rounds // every + (rounds % every != 0)


def round_clients(run: dict, n_clients: int) -> int:
    """The clients a round of ``run`` trains: ``clients_per_cluster`` x K (at most every client)
    with per-cluster sampling, else ``clients_per_round`` (null: every client)."""
    train = run["train"]
    if train.get("clients_per_cluster"):
        K = run.get("params", {}).get("K")
        return min(int(train["clients_per_cluster"]) * (K if isinstance(K, int) else 1), n_clients)
    return min(train.get("clients_per_round") or n_clients, n_clients)


def run_cost(run: dict, size: DataSize, step_s: float, sample_s: float, *,
             init_passes: int = 0) -> RunCost:
    """One run's cost from the per-step times (the arithmetic of the module docstring);
    ``init_passes``: local trainings of every client charged to it for the centre initialisation."""
    t = TrainSpec.of(run["train"])
    per_client = size.n_train / max(1, size.n_clients)
    steps = local_steps(t, per_client)
    clients = round_clients(run, size.n_clients)
    round_s = clients * steps * step_s
    finetune = int(t.finetune_epochs) * size.n_clients * max(1, math.ceil(per_client / int(t.batch_size)))
    eval_s = size.n_test * sample_s + finetune * step_s
    init_s = init_passes * size.n_clients * steps * step_s
    return RunCost(run["dataset"], run["label"], int(run["seed"]), int(t.rounds), round_s,
                   evaluations(int(t.rounds), int(t.eval_every)), eval_s, init_s)


def train_defaults() -> dict:
    props = read_schema()["$defs"]["train"]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


def data_size(ds: dict, store: Path, raw_store: Path) -> DataSize:
    """A dataset's shape and sizes: from its prepared store, else from its source (see module)."""
    model = ds["model"]["name"]
    shape, classes = MODEL_SHAPES.get(model, ((1, 28, 28), 10))
    prep = ds["prepare"]
    clients = n_clients(ds)
    for path in (store, raw_store):
        meta = _meta(path)
        if meta:
            m = int(meta["n_clients"])
            if path != store and clients:           # re-partitioned into this many clients
                m = clients
            return DataSize(tuple(meta["x_shape"]), int(meta["n_classes"]), m, int(meta["n_train"]),
                            int(meta["n_test"]), "prepared store")
    source = prep["source"]
    if source == "synthetic":
        shape, classes = (int(prep.get("dim", 60)),), int(prep.get("classes", 5))
    if source == "leaf_json":
        counts = _leaf_counts(Path(prep["dir"]))
        if counts:
            shape = tuple(prep.get("x_shape") or shape)
            return DataSize(shape, int(prep.get("n_classes") or classes), clients or counts[0],
                            counts[1], counts[2], "the LEAF JSON files")
    if source == "femnist_sample":
        with np.load(embedded_file(prep.get("run", "leaf-torch")), allow_pickle=False) as z:
            tr, te = z["offsets_train"], z["offsets_test"]
        return DataSize((1, 28, 28), 62, clients or len(tr) - 1, int(tr[-1]), int(te[-1]),
                        "the embedded writers")
    m, n_train, n_test = TYPICAL.get(source, (clients or 100, 100 * (clients or 100), 25 * (clients or 100)))
    if clients and source in ("femnist", "celeba"):        # a sample of the writers/celebrities
        n_train, n_test = n_train * clients // m, n_test * clients // m
    return DataSize(shape, classes, clients or m, n_train, n_test, f"the {source} dataset's published size")


def _meta(store: Path) -> dict | None:
    try:
        return json.loads((store / "meta.json").read_text())
    except (OSError, ValueError):
        return None


#: LEAF JSON folders larger than this are not scanned for their sizes (the check stays quick)
SCAN_BYTES = 512 << 20
_NUM_SAMPLES = re.compile(rb'"num_samples"\s*:\s*\[([^\]]*)\]')


def _leaf_counts(root: Path) -> tuple[int, int, int] | None:
    """(clients, training samples, test samples) from the ``num_samples`` lists of a LEAF data
    folder's train/ and test/ JSON files; None when absent or larger than :data:`SCAN_BYTES`."""
    files = {split: sorted((root / split).glob("*.json")) for split in ("train", "test")}
    if not files["train"] or sum(f.stat().st_size for fs in files.values() for f in fs) > SCAN_BYTES:
        return None
    out = {}
    for split, fs in files.items():
        counts = []
        for f in fs:
            m = _NUM_SAMPLES.search(f.read_bytes())
            if m:
                counts += [int(v) for v in m.group(1).split(b",") if v.strip()]
        out[split] = counts
    return len(out["train"]), sum(out["train"]), sum(out["test"])


def param_count(model: dict, x_shape: tuple, n_classes: int) -> int | None:
    """Trainable parameters of a model of the zoo (:mod:`mcfl.models`), counted from its
    architecture without building it (no torch; ``tests/plan/test_plan.py`` checks the counts against
    the built models); None for a model it does not know."""
    name, kw = model["name"], {k: v for k, v in model.items() if k != "name"}
    if name == "logreg":
        return (math.prod(x_shape) + 1) * n_classes
    if len(x_shape) != 3:
        return None
    c, h, w = x_shape
    if name in ("femnist_cnn", "digits_cnn"):
        k, (c1, c2), hidden = (25, (32, 64), kw.get("hidden", 2048)) if name == "femnist_cnn" else \
            (9, (16, 32), kw.get("hidden", 64))
        return ((c * k + 1) * c1 + (c1 * k + 1) * c2 + (c2 * (h // 4) * (w // 4) + 1) * hidden
                + (hidden + 1) * n_classes)
    if name == "celeba_cnn":                      # convolution and BatchNorm's scale and shift
        ch, total = kw.get("channels", 32), 0
        for _ in range(kw.get("blocks", 4)):
            total += (c * 9 + 1) * ch + 2 * ch
            c, h, w = ch, -(-h // 2), -(-w // 2)
        return total + (c * h * w + 1) * n_classes
    return None


def forward_macs(model: dict, x_shape: tuple, n_classes: int) -> int | None:
    """Multiply-adds of one sample's forward pass through a model of the zoo (:mod:`mcfl.models`),
    counted from its architecture without building it (no torch; ``tests/plan/test_plan.py`` checks
    the counts against the built models); None for a model it does not know."""
    name, kw = model["name"], {k: v for k, v in model.items() if k != "name"}
    if name == "logreg":
        return math.prod(x_shape) * n_classes
    if len(x_shape) != 3:                         # not images: training will say what is wrong
        return None
    c, h, w = x_shape
    if name in ("femnist_cnn", "digits_cnn"):     # two 'same' convolutions, each before a 2x2 pool
        k, (c1, c2), hidden = (25, (32, 64), kw.get("hidden", 2048)) if name == "femnist_cnn" else \
            (9, (16, 32), kw.get("hidden", 64))
        return (h * w * c1 * c * k + (h // 2) * (w // 2) * c2 * c1 * k
                + c2 * (h // 4) * (w // 4) * hidden + hidden * n_classes)
    if name == "celeba_cnn":                      # 3x3 'same' convolutions, each before a ceil pool
        ch, total = kw.get("channels", 32), 0
        for _ in range(kw.get("blocks", 4)):
            total += h * w * ch * c * 9
            c, h, w = ch, -(-h // 2), -(-w // 2)
        return total + c * h * w * n_classes
    return None
