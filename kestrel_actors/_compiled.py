"""Which modules the build compiles with mypyc, and the guard that keeps a stale build out of use.

``setup.py`` reads :data:`COMPILED_MODULES` (it loads this file by path, without importing the
package), and ``kestrel_actors/__init__.py`` calls :func:`install_guard` before anything else of
the package is imported. The guard decides once per process, from file times only (no imports):

* no compiled module is present (a pure install): nothing to do, ``compiled=no``;
* ``KESTREL_ACTORS_PURE=1``: the whole compiled set is imported from its ``.py`` source;
* any compiled module older than its ``.py`` (the source was edited, or another branch checked
  out, after the build): the same, with one line on stderr saying which and how to rebuild, and
  :func:`fallback` saying it for the admin port's ``/health`` and page (docs/build.md).

The set falls back as a whole, never a mix of a stale and a fresh build. ADR 0015 explains the
choice of modules; the Python source is the one source of truth (docs/design.md, "Compiled build").
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["COMPILED_MODULES", "PROFILE_MARKER", "PURE_ENV", "compiled_state", "fallback", "install_guard",
           "profile_guided"]

COMPILED_MODULES = (
    "kestrel_actors.queue_name",
    "kestrel_actors._malloc",
    "kestrel_actors._clock",
    "kestrel_actors.protocol._lines",
    "kestrel_actors.protocol._replies",
    "kestrel_actors.protocol._commands",
    "kestrel_actors.protocol._decoder",
    "kestrel_actors.protocol._memcache",
    "kestrel_actors.session._handler",
    "kestrel_actors.session._context",
    "kestrel_actors.session._opened",
    "kestrel_actors.session._transport",
    "kestrel_actors.session._budget",
    "kestrel_actors.session._connections",
    "kestrel_actors.session._actor",
    "kestrel_actors.session._memcache",
    "kestrel_actors.queue._rules",
    "kestrel_actors.queue._waitlist",
    "kestrel_actors.queue._journal",
    "kestrel_actors.queue._items",
    "kestrel_actors.queue._open",
    "kestrel_actors.queue._core",
    "kestrel_actors.journal._format",
    "kestrel_actors.journal._sequence",
    "kestrel_actors.journal._file",
    "kestrel_actors.journal._readbehind",
    "kestrel_actors.journal._writer",
    "kestrel_actors.stats._server",
    "kestrel_actors.messages._session_queue",
    "kestrel_actors.status",
    "kestrel_actors.runtime._actor",
    "kestrel_actors.runtime._dispatcher",
    "kestrel_actors.actors._queue",
    "kestrel_actors.client._scan",
)
"""The request path's modules that ``pip install .`` compiles (ADR 0015)."""

PURE_ENV = "KESTREL_ACTORS_PURE"
"""``KESTREL_ACTORS_PURE=1`` runs the pure-Python source of an installed compiled build."""

PROFILE_MARKER = "_profile_guided.txt"
"""The file beside this one that ``setup.py`` writes after a profile-guided compile, and removes
before any other: its first line says what trained the profile."""

_SLACK_SECONDS = 2.0
"""A wheel's files are unpacked in no set order: a ``.py`` written a moment after its extension is
not an edit."""

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

_state = "no"
_fallback: str | None = None


def _source_path(module: str) -> str:
    parts = module.split(".")[1:]
    return os.path.join(_PACKAGE_DIR, *parts) + ".py"


def _extension_path(module: str) -> str | None:
    stem = _source_path(module)[: -len(".py")]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.exists(stem + suffix):
            return stem + suffix
    return None


def _stale(modules: Sequence[str]) -> list[str]:
    """The compiled modules whose ``.py`` is newer than their extension (or that have none)."""
    stale = []
    for module in modules:
        extension = _extension_path(module)
        try:
            if extension is None or (os.stat(_source_path(module)).st_mtime
                                     > os.stat(extension).st_mtime + _SLACK_SECONDS):
                stale.append(module)
        except OSError:
            stale.append(module)
    return stale


class _SourceFirst:
    """A meta-path finder that imports each compiled module from its ``.py``, not its extension."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        return importlib.util.spec_from_file_location(fullname, _source_path(fullname))


def install_guard() -> str:
    """Decide once whether the compiled build is used; returns :func:`compiled_state`."""
    global _state, _fallback
    if any(isinstance(finder, _SourceFirst) for finder in sys.meta_path):
        return _state
    if not any(_extension_path(module) for module in COMPILED_MODULES):
        _state = "no"
        return _state
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        _state = f"no ({PURE_ENV}=1)"
        _fallback = f"pure-python ({PURE_ENV}=1)"
    else:
        stale = _stale(COMPILED_MODULES)
        if not stale:
            _state = "mypyc"
            return _state
        _state = "no (stale build)"
        sources = [os.path.relpath(_source_path(module), os.path.dirname(_PACKAGE_DIR)) for module in stale]
        named = ", ".join(sources[:3]) + (", ..." if len(sources) > 3 else "")
        _fallback = f"pure-python (compiled build stale: {named} newer)"
        sys.stderr.write(
            f"kestrel-actors: the compiled build is older than its source ({', '.join(stale[:3])}"
            f"{', ...' if len(stale) > 3 else ''}); running pure Python: rebuild it "
            f"(make compiled, pip install ., or python setup.py build_ext --inplace)\n")
    sys.meta_path.insert(0, _SourceFirst(COMPILED_MODULES))
    return _state


def compiled_state() -> str:
    """``mypyc`` when the compiled build is in use, else ``no`` and why: what the memcache port's
    "listening" log line reports as ``compiled=``."""
    return _state


def fallback() -> str | None:
    """Why the package runs pure Python although a compiled build is installed (``pure-python
    (compiled build stale: kestrel_actors/queue/_rules.py newer)``, ``pure-python
    (KESTREL_ACTORS_PURE=1)``), or None: the compiled build is in use, or none is installed. What
    the admin port's ``/health`` body and page say beside the stderr line (docs/build.md)."""
    return _fallback


def profile_guided() -> bool:
    """Whether the compiled build in use was compiled from a training profile (gcc PGO): what the
    "listening" log line reports as ``profile_guided``."""
    return _state == "mypyc" and os.path.exists(os.path.join(_PACKAGE_DIR, PROFILE_MARKER))
