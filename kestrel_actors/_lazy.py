"""A package face whose names load their private modules on first use (PEP 562).

``client``, ``config`` and ``spark_bridge`` re-export names from small private modules, as every
room does; these three are also imported by processes that need few of them (Spark's per-query
Python processes, the bridge's driver without Spark's own packages loaded), so each name's module
is imported when the name is first read, then kept in the package's namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any

__all__ = ["lazy_face"]


def lazy_face(package: str, namespace: dict[str, Any], homes: Mapping[str, str],
              names: Sequence[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (its ``__name__``; ``namespace`` its
    ``globals()``): ``homes`` maps each lazily loaded name to its module, relative to the
    package; ``names`` is its ``__all__``."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(home, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
