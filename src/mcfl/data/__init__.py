"""Federated datasets: sources that prepare a store, and :func:`load` to open one.

>>> import mcfl.data
>>> d = mcfl.data.load("data/digits")
>>> d.client_ids[:2], d.n_classes
(['c0000', 'c0001'], 10)
>>> x, y = d.train(0)          # float32 inputs (scaled), int64 labels of client 0
"""

from mcfl.data.store import ClientData, FederatedData, StoreError, load, write_store

__all__ = ["ClientData", "FederatedData", "StoreError", "load", "write_store", "SOURCES"]

#: name -> function(out, **params) that prepares a store. LEAF sources register here too.
SOURCES = {
    "digits": "mcfl.data.digits:make_digits",
    "synthetic": "mcfl.data.synthetic:make_synthetic",
    "femnist": "mcfl.data.leaf.femnist:make_femnist",
    "celeba": "mcfl.data.leaf.celeba:make_celeba",
    "digits_domains": "mcfl.data.digits_domains:make_digits_domains",
}


def prepare(source: str, out, **params):
    """Prepare ``source`` into a store at ``out`` with ``params`` (see each source's docstring)."""
    import importlib

    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; known: {sorted(SOURCES)}")
    module, fn = SOURCES[source].split(":")
    return getattr(importlib.import_module(module), fn)(out, **params)
