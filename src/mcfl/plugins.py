"""The one mechanism behind the package's extension points (methods, :mod:`mcfl.methods`; papers,
:mod:`mcfl.papers`): an object named ``module:attribute``, built in or registered by an installed
package under an entry-point group (``mcfl.methods``, ``mcfl.papers``), and loaded only when asked
for, so that a broken plugin stops only what uses it, with one line saying why."""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint


def entry_points(group: str) -> dict[str, EntryPoint]:
    """The installed packages' entry points of ``group``, by name."""
    from importlib.metadata import entry_points as installed

    return {ep.name: ep for ep in installed(group=group)}


def distribution(ep: EntryPoint) -> str:
    """``name version`` of the package that registered ``ep``."""
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"


def load(spec: str, error: type[Exception], what: str) -> object:
    """The object ``spec`` (``module:attribute``) names, importing its module; any failure is one
    ``error`` naming ``what``."""
    module, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure of a plugin's import is the plugin's
        raise error(f"{what}: module {module!r} cannot be imported ({type(e).__name__}: {e})") from None
    if not hasattr(mod, attr):
        raise error(f"{what}: module {module!r} has no attribute {attr!r}")
    return getattr(mod, attr)
