"""The methods' registry: config name -> algorithm class (one short file per method under
:mod:`mcfl.algorithms`; each cites its paper). It names classes by ``module:Class`` and imports
nothing of them until asked, so the config, the planning and the tracking look a method up by name
without importing the training code (PyTorch) or sitting above it.

A method's module is imported when its class is first asked for (like :data:`mcfl.data.SOURCES`):
a training job imports its own method, not all of them (``benchmarks/job_overhead.py``).

A config's ``method`` names one of

* a built-in method (:data:`REGISTRY`) or an alias of one (:data:`ALIASES`: the field's name for a
  method the FeSEM paper names otherwise; the same runs);
* a class outside the package, as ``module:Class`` (``method: mypkg.fedfoo:FedFoo``);
* a method an installed package registers in the ``mcfl.methods`` entry-point group (as
  Snakemake's executor plugins and pytest's plugins register themselves), under the name the
  entry point gives (``method: FedFoo``).

:func:`get` resolves all three; :func:`canonical` gives the name a run records (what a training job
resolves again), :func:`plain_name` the name its labels and paths use, :func:`origin` where it
comes from. A name that resolves to nothing gets a "did you mean" of the known names; a plugin that
cannot be used gets one line saying why (:class:`MethodError`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from mcfl import plugins as _plugins

if TYPE_CHECKING:                      # annotations only: the registry sits below the methods
    from mcfl.algorithms.base import Algorithm

#: config name -> "module:Class" under mcfl.algorithms, in the papers' order
REGISTRY = {
    # FeSEM's Table 2 (Long et al., World Wide Web 2022)
    "NoFed": "nofed:NoFed", "FedSGD": "fedsgd:FedSGD", "FedAvg": "fedavg:FedAvg",
    "FedDist": "feddist:FedDist", "FedDWS": "feddist:FedDWS", "Robust": "robust:Robust",
    "FedCluster": "fedcluster:FedCluster", "HypoCluster": "hypocluster:HypoCluster",
    "FedDANE": "feddane:FedDANE", "FedProx": "fedprox:FedProx", "FeSEM": "fesem:FeSEM",
    "FeSEM-MA": "fesem_ma:FeSEMMA",
    # FedGSP's Table 1 (Zeng et al., DASFAA 2022)
    "FedGSP": "fedgsp:FedGSP", "NaiveGSP": "fedgsp:NaiveGSP", "NaiveGSP+ICG": "fedgsp:NaiveGSPICG",
    "FedAdagrad": "fedopt:FedAdagrad", "FedAdam": "fedopt:FedAdam", "FedYogi": "fedopt:FedYogi",
    "IDA": "ida:IDA", "FedMMD": "fedmmd:FedMMD", "FedFusion": "fedfusion:FedFusion",
    # FedCG (Caldarola et al., CVPR-W 2021)
    "FedCG": "fedcg:FedCG",
    "FL+HC": "flhc:FLHC",
    "PACFL": "pacfl:PACFL",
    "FedSoft": "fedsoft:FedSoft",
}


class _Algorithms(Mapping):
    """:data:`REGISTRY` as a mapping name -> class, importing a class's module on first access."""

    def __getitem__(self, name: str) -> type[Algorithm]:
        module, cls = REGISTRY[name].split(":")
        return getattr(importlib.import_module(f"mcfl.algorithms.{module}"), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)

    def __contains__(self, name) -> bool:
        return name in REGISTRY


ALGORITHMS: Mapping[str, type[Algorithm]] = _Algorithms()


#: the field's names of built-in methods -> the built-in (the same runs: a run records the built-in)
ALIASES = {
    # Sattler, Müller, Samek, "Clustered federated learning", IEEE TNNLS 2021
    "CFL": "FedCluster",
    # Ghosh, Chung, Yin, Ramchandran, "An efficient framework for clustered federated learning", NeurIPS 2020
    "IFCA": "HypoCluster",
}

#: the entry-point group through which an installed package registers its methods
ENTRY_POINT_GROUP = "mcfl.methods"

#: ``module:Class``: a dotted module path and a class name (nothing else is imported)
SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$", re.ASCII)
#: the names labels and run folders may use (the config schema's ``name``)
PLAIN = re.compile(r"^[A-Za-z][A-Za-z0-9_+.-]*$")


class MethodError(ValueError):
    """A method name that resolves to no usable algorithm (one line, saying why)."""


def _entry_points() -> dict:
    return _plugins.entry_points(ENTRY_POINT_GROUP)


def _builtin_names() -> set[str]:
    return set(REGISTRY) | set(ALIASES)


def _distribution(ep) -> str:
    return _plugins.distribution(ep)


def _load(spec: str) -> type:
    """The class ``module:Class`` names (importing its module)."""
    return _plugins.load(spec, MethodError, spec)


def _checked(cls, spec: str, plain: str) -> type[Algorithm]:
    """``cls`` if it is an :class:`Algorithm` subclass whose plain name is usable and not taken."""
    base = importlib.import_module("mcfl.algorithms.base").Algorithm      # looked up as REGISTRY's are
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise MethodError(f"{spec}: {cls!r:.60} is not a subclass of mcfl.algorithms.base.Algorithm")
    if not dataclasses.is_dataclass(cls.Params):
        raise MethodError(f"{spec}: its Params is not a dataclass")
    if plain in _builtin_names():
        raise MethodError(f"{spec}: its name {plain!r} is the name of a built-in method; name it "
                          f"otherwise (the class's `name`)")
    if not isinstance(plain, str) or not PLAIN.match(plain):
        raise MethodError(f"{spec}: its name {plain!r} is not a plain name (letters, digits, _+.-, "
                          f"starting with a letter); set the class's `name`")
    return cls


def _own_name(cls) -> str:
    """A plugin class's plain name: the ``name`` it declares itself, else its class name (a
    subclass of a built-in does not inherit the built-in's name)."""
    return cls.__dict__.get("name") or cls.__name__


@functools.cache
def _resolve(name: str) -> tuple[type[Algorithm], str, str, str]:
    """(class, canonical name, plain name, origin) of a config's ``method`` value."""
    if not isinstance(name, str):
        raise MethodError(f"{name!r:.40}: a method is named by a string")
    name = ALIASES.get(name, name)
    if name in REGISTRY:
        return ALGORITHMS[name], name, name, "built-in"
    if ":" in name:
        if not SPEC.match(name):
            raise MethodError(f"{name}: not of the form module:Class (e.g. mypkg.fedfoo:FedFoo)")
        cls = _load(name)
        plain = _own_name(cls) if isinstance(cls, type) else name
        return _checked(cls, name, plain), name, plain, name
    eps = _entry_points()
    if name in eps:
        ep = eps[name]
        where = f"entry point {ep.value} of {_distribution(ep)}"
        try:
            cls = ep.load()
        except Exception as e:  # noqa: BLE001 - any failure of a plugin's import is the plugin's
            raise MethodError(f"{name}: {where} cannot be loaded ({type(e).__name__}: {e})") from None
        return _checked(cls, f"{name} ({where})", name), name, name, where
    known = sorted(_builtin_names() | set(eps))
    lower = {k.lower(): k for k in known}             # case-blind: "fesem" -> FeSEM
    close = [lower[k] for k in difflib.get_close_matches(name.lower(), lower, n=3, cutoff=0.6)]
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise MethodError(f"unknown method {name!r}; {hint}known: {', '.join(known)} "
                      f"(or module:Class for a class outside the package)")


def get(name: str) -> type[Algorithm]:
    """The algorithm class a config's ``method`` names (raises :class:`MethodError`)."""
    return _resolve(name)[0]


def canonical(name: str) -> str:
    """The name a run records for ``name``: the built-in's for an alias, else ``name`` itself."""
    return _resolve(name)[1]


def plain_name(name: str) -> str:
    """The name labels, run ids and folders use: a built-in's name, a plugin class's own ``name``
    (else its class name), an entry point's name."""
    return _resolve(name)[2]


def origin(name: str) -> str:
    """Where the method comes from: ``built-in``, the ``module:Class`` it was imported as, or the
    entry point and its distribution's name and version."""
    return _resolve(name)[3]


def plugins() -> dict[str, str | MethodError]:
    """The methods installed packages register (entry-point name -> origin, or the error that
    makes it unusable), for ``mcfl methods``."""
    out: dict[str, str | MethodError] = {}
    for name, ep in sorted(_entry_points().items()):
        if name in _builtin_names():
            out[name] = MethodError(f"{name}: entry point {ep.value} of {_distribution(ep)} has the "
                                    f"name of a built-in method, which it cannot replace")
            continue
        try:
            out[name] = origin(name)
        except MethodError as e:
            out[name] = e
    return out
