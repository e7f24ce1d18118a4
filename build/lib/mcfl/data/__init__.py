"""Federated datasets: sources that prepare a store, and :func:`load` to open one.

>>> import mcfl.data
>>> d = mcfl.data.load("data/digits")
>>> d.client_ids[:2], d.n_classes
(['c0000', 'c0001'], 10)
>>> x, y = d.train(0)          # float32 inputs (scaled), int64 labels of client 0
"""

from mcfl.data.store import ClientData, FederatedData, StoreError, load
from mcfl.data.write import write_store

__all__ = ["ClientData", "FederatedData", "StoreError", "load", "write_store", "SOURCES", "prepare",
           "source_fn"]

#: name -> function(out, **params) that prepares a store. A source function may carry hooks:
#: ``check(**params)`` (option rules, run by config validation), ``inputs(**params)`` (the files
#: it reads, the workflow's inputs of its prepare job), ``raw_files`` (LEAF downloads).
SOURCES = {
    "digits": "mcfl.data.digits:make_digits",
    "synthetic": "mcfl.data.synthetic:make_synthetic",
    "femnist": "mcfl.data.leaf.femnist:make_femnist",
    "celeba": "mcfl.data.leaf.celeba:make_celeba",
    "leaf_json": "mcfl.data.leaf.leafjson:make_leaf_json",
    "femnist_sample": "mcfl.data.femnist_sample:make_femnist_sample",
    "digits_domains": "mcfl.data.digits_domains:make_digits_domains",
}


def source_fn(source: str):
    """The function that prepares ``source`` (imported on first use)."""
    import importlib

    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; known: {sorted(SOURCES)}")
    module, fn = SOURCES[source].split(":")
    return getattr(importlib.import_module(module), fn)


def prepare(source: str, out, **params):
    """Prepare ``source`` into a store at ``out`` with ``params`` (see each source's docstring)."""
    return source_fn(source)(out, **params)
