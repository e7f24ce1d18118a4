"""LEAF's federated benchmarks (Caldas et al. 2018): FEMNIST and FedCelebA, from the raw downloads
to the store, with LEAF's semantics; LEAF JSON import and export.

Modules, in pipeline order:

* :mod:`~mcfl.data.leaf.fetch`    find, download (HTTP Range resume) and MD5-verify raw files;
* :mod:`~mcfl.data.leaf.archive`  read members of a zip (or a directory) in place, rejecting unsafe names;
* :mod:`~mcfl.data.leaf.sampling` LEAF's ``sample.py`` / ``remove_users.py`` / ``split_data.py``;
* :mod:`~mcfl.data.leaf.images`   decode the selected images (in worker processes) into the store;
* :mod:`~mcfl.data.leaf.femnist`, :mod:`~mcfl.data.leaf.celeba`: the two sources (``mcfl prepare``);
* :mod:`~mcfl.data.leaf.leafjson` ``mcfl import-leaf`` / ``mcfl export-leaf``;
* :mod:`~mcfl.data.leaf.cli`      the ``download``, ``import-leaf`` and ``export-leaf`` subcommands.

A LEAF source function carries attributes besides its keyword arguments: ``raw_files`` (file
name -> expected MD5; the Snakemake download rule and ``mcfl download`` read it), optionally
``raw_alternatives`` (a zip that may also sit extracted, as a folder) and ``cli_aliases``
(parameter -> extra option strings of ``mcfl prepare``, e.g. LEAF's ``-k`` and ``-t``).
"""


class DataSourceError(ValueError):
    """A raw source is missing, corrupt or malformed; the message names the file (and user)."""

