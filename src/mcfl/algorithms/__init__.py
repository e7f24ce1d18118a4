"""The methods, one short file each, citing its paper; :mod:`mcfl.methods` is their registry (config
name -> class), re-exported here."""

from mcfl.methods import (ALGORITHMS, ALIASES, ENTRY_POINT_GROUP, PLAIN, REGISTRY, SPEC,  # noqa: F401
                          MethodError, _resolve, canonical, get, origin, plain_name, plugins)
