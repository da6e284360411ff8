"""The build: metadata is in setup.cfg; this file only decides whether the request path is compiled.

``KESTREL_ACTORS_MYPYC``: ``1`` compiles the modules of ``kestrel_actors/_compiled.py`` with mypyc
and fails if it cannot; ``0`` installs pure Python; unset compiles when a C compiler works and mypy
(which ships mypyc) is importable, else installs pure Python and says so in one line. ADR 0015.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import tempfile
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

SWITCH = "KESTREL_ACTORS_MYPYC"
HERE = os.path.dirname(os.path.abspath(__file__))


def compiled_modules() -> tuple[str, ...]:
    """The list from ``kestrel_actors/_compiled.py``, loaded by path: importing the package would
    run its import-time guard, and the build must not depend on its dependencies."""
    spec = importlib.util.spec_from_file_location(
        "_kestrel_actors_compiled", os.path.join(HERE, "kestrel_actors", "_compiled.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.COMPILED_MODULES)


def why_not_compilable() -> str | None:
    """None when mypyc can build here: mypy imports and a C file that includes Python.h compiles."""
    try:
        import mypyc.build  # noqa: F401
    except ImportError as exc:
        return f"mypyc is not importable ({exc})"
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write("#include <Python.h>\nint kestrel_probe(void) { return Py_IsInitialized(); }\n")
        try:
            compiler.compile([source], output_dir=tmp, include_dirs=[sysconfig.get_paths()["include"]])
        except Exception as exc:  # noqa: BLE001 - whatever stops the probe stops the build (distutils
            # raises its errors from either of its two module names)
            return f"no working C compiler ({str(exc).strip().splitlines()[-1] if str(exc).strip() else exc})"
    return None


def ext_modules() -> list[Any]:
    switch = os.environ.get(SWITCH, "").strip()
    if switch == "0":
        return []
    if switch not in ("", "1"):
        sys.exit(f"{SWITCH} must be 1 (compile), 0 (pure Python) or unset (compile when possible)")
    reason = why_not_compilable()
    if reason is not None:
        if switch == "1":
            sys.exit(f"kestrel-actors: {SWITCH}=1 but {reason}")
        print(f"kestrel-actors: installing pure Python: {reason}", file=sys.stderr)
        return []
    from mypyc.build import mypycify

    paths = [os.path.join("kestrel_actors", *name.split(".")[1:]) + ".py" for name in compiled_modules()]
    # The build type-checks only what it compiles, with mypy's defaults: the lint (setup.cfg's
    # strict sections) is the judge of the code, and the build must work in pip's isolated build
    # environment, where the dependencies (pykka, gevent, ...) are absent and so typed as Any.
    return mypycify(["--config-file=", "--follow-imports=silent", "--ignore-missing-imports", *paths],
                    opt_level="3")


class BuildExt(build_ext):
    """``build_ext`` that gives every extension it outputs the build's time: mypyc rewrites only
    the C files whose code changed, so an extension can come out older than a ``.py`` edited
    before the build, and the package's stale-build guard (``_compiled.py``) compares the two."""

    def run(self) -> None:
        super().run()
        for ext in self.extensions:
            path = self.get_ext_fullpath(ext.name)
            if os.path.exists(path):
                os.utime(path)


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
