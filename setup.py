"""The build: metadata is in setup.cfg; this file only decides whether the request path is compiled.

``KESTREL_ACTORS_MYPYC``: ``1`` compiles the modules of ``kestrel_actors/_compiled.py`` with mypyc
and fails if it cannot; ``0`` installs pure Python; unset compiles when a C compiler works and mypy
(which ships mypyc) is importable, else installs pure Python and says so in one line. ADR 0015.

``KESTREL_ACTORS_PGO=1`` (what ``make run`` and ``make test`` set) makes an in-place build
(``setup.py build_ext --inplace``) profile-guided with gcc: compile instrumented, run the training
load (``kestrel_actors.loadtests.training``, which needs the server's dependencies installed),
compile again from its profile. Any failure on the way falls back to the plain compile, and the
instrumented build is never left in place. ``pip install .`` compiles plainly: its isolated build
environment has no server to train.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

SWITCH = "KESTREL_ACTORS_MYPYC"
PGO_SWITCH = "KESTREL_ACTORS_PGO"
HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE_DIR = os.path.join(HERE, "build", "pgo")
"""Where the instrumented build writes its counts (``.gcda``), emptied before each training."""
TRAINING_SECONDS = 900


def compiled_settings() -> Any:
    """``kestrel_actors/_compiled.py``, loaded by path: importing the package would run its
    import-time guard, and the build must not depend on its dependencies."""
    spec = importlib.util.spec_from_file_location(
        "_kestrel_actors_compiled", os.path.join(HERE, "kestrel_actors", "_compiled.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SETTINGS = compiled_settings()
PROFILE_MARKER = os.path.join(HERE, "kestrel_actors", SETTINGS.PROFILE_MARKER)
"""Written after a profile-guided compile in place, removed before any other compile."""


def configured_compiler() -> Any:
    """The C compiler setuptools would use here, with the interpreter's settings."""
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    return compiler


def why_not_compilable() -> str | None:
    """None when mypyc can build here: mypy imports and a C file that includes Python.h compiles."""
    try:
        import mypyc.build  # noqa: F401
    except ImportError as exc:
        return f"mypyc is not importable ({exc})"
    compiler = configured_compiler()
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

    paths = [os.path.join("kestrel_actors", *name.split(".")[1:]) + ".py" for name in SETTINGS.COMPILED_MODULES]
    # The build type-checks only what it compiles, with mypy's defaults: the lint (setup.cfg's
    # strict sections) is the judge of the code, and the build must work in pip's isolated build
    # environment, where the dependencies (pykka, gevent, ...) are absent and so typed as Any.
    # group_name: the group's shared library is then kestrel_actors/_native__mypyc.*.so, inside
    # the package, where an editable install that was made pure (the Makefile's) still finds it;
    # by default it is named by a hash and sits beside the package, outside the editable mapping.
    # multi_file: one C file per module, not one 12 MB file, so that gcc runs on both cores
    # (compile_in_parallel) and a build takes half the time, for no measured loss at run time
    # (ADR 0015, eighth pass).
    extensions = mypycify(["--config-file=", "--follow-imports=silent", "--ignore-missing-imports", *paths],
                          opt_level="3", group_name="kestrel_actors._native", multi_file=True)
    for ext in extensions:
        # mypyc 2.4.1 writes a dotted group's headers into build/kestrel_actors/ but includes them
        # from the modules' C files in build/ as if they sat beside them
        ext.include_dirs.append(os.path.join("build", "kestrel_actors"))
    return extensions


def c_compiler_is_gcc(command: list[str]) -> bool:
    try:
        version = subprocess.run([command[0], "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in version


def compile_in_parallel(compiler: Any, jobs: int) -> None:
    """Make ``compiler.compile`` run ``jobs`` C files at a time: distutils compiles one extension's
    sources one after another (``build_ext --parallel`` runs whole extensions side by side), and
    mypyc's group is one extension of many files. The body is distutils' ``CCompiler.compile``
    (setuptools 65–80) with its loop handed to threads, each of which waits on a gcc process."""
    from concurrent.futures import ThreadPoolExecutor

    if jobs < 2 or not all(hasattr(compiler, name) for name in ("_setup_compile", "_get_cc_args", "_compile")):
        return  # one core, or a distutils without these steps: its own loop

    def compile_sources(sources: list[str], output_dir: str | None = None, macros: Any = None,
                        include_dirs: Any = None, debug: bool = False, extra_preargs: Any = None,
                        extra_postargs: Any = None, depends: Any = None) -> list[str]:
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj: str) -> None:
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, [obj for obj in objects if obj in build]))
        return list(objects)

    compiler.compile = compile_sources


class BuildExt(build_ext):
    """``build_ext`` that can build profile-guided (``KESTREL_ACTORS_PGO=1``, above) and that gives
    every extension it outputs the build's time: mypyc rewrites only the C files whose code
    changed, so an extension can come out older than a ``.py`` edited before the build, and the
    package's stale-build guard (``_compiled.py``) compares the two."""

    def build_extensions(self) -> None:
        compile_in_parallel(self.compiler, os.cpu_count() or 1)
        super().build_extensions()

    def run(self) -> None:
        if self.extensions and os.path.exists(PROFILE_MARKER):  # whatever is compiled now has no profile yet
            os.remove(PROFILE_MARKER)
        if self.extensions and os.environ.get(PGO_SWITCH, "").strip() == "1":
            self.run_profile_guided()
        else:
            super().run()
        for path in self.outputs_in_place():
            os.utime(path)

    def outputs_in_place(self) -> list[str]:
        return [path for path in map(self.get_ext_fullpath, (ext.name for ext in self.extensions))
                if os.path.exists(path)]

    def compile_with(self, compile_flags: list[str], link_flags: list[str]) -> None:
        """One full compile of every extension with these flags added to mypyc's own (as
        :meth:`run_profile_guided` found them)."""
        for ext in self.extensions:
            base_compile, base_link = self.base_flags[ext.name]
            ext.extra_compile_args = base_compile + compile_flags
            ext.extra_link_args = base_link + link_flags
        self.compiler = self.compiler_choice  # run() replaces the choice with the compiler it made
        self.force = True
        super().run()

    def why_not_profile_guided(self) -> str | None:
        if not self.inplace:
            return "not an in-place build (setup.py build_ext --inplace): no server to train"
        command = getattr(configured_compiler(), "compiler_so", None) or ["cc"]
        if not c_compiler_is_gcc(command):
            return f"the C compiler ({command[0]}) is not gcc"
        return None

    def run_profile_guided(self) -> None:
        self.base_flags = {ext.name: (list(ext.extra_compile_args), list(ext.extra_link_args))
                           for ext in self.extensions}
        self.compiler_choice = self.compiler
        reason = self.why_not_profile_guided()
        if reason is None:
            try:
                shutil.rmtree(PROFILE_DIR, ignore_errors=True)
                os.makedirs(PROFILE_DIR)
                profile = f"-fprofile-dir={PROFILE_DIR}"
                # -fprofile-update=single: the counters of the one thread that runs Python (the
                # others only wait on the disk); -fprofile-correction mends what a race costs.
                self.compile_with(["-fprofile-generate", profile, "-fprofile-update=single"], ["-fprofile-generate"])
                self.train()
                # -fprofile-partial-training: what the training did not run (the text and thrift
                # protocols, the admin's calls) stays optimised for speed, not for size.
                self.compile_with(["-fprofile-use", profile, "-fprofile-correction", "-fprofile-partial-training",
                                   "-Wno-missing-profile"], [])
                with open(PROFILE_MARKER, "w") as marker:
                    marker.write("profile-guided (gcc): trained by python -m kestrel_actors.loadtests.training\n")
                print("kestrel-actors: compiled profile-guided", file=sys.stderr)
                return
            except Exception as exc:  # noqa: BLE001 - any failure falls back to the plain compile
                reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        print(f"kestrel-actors: compiled without a profile: {reason}", file=sys.stderr)
        try:
            self.compile_with([], [])
        except BaseException:
            # never leave an instrumented (or half-built) extension to be imported
            for path in self.outputs_in_place():
                os.remove(path)
            raise

    def train(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])))
        env.pop("GCOV_PREFIX", None)
        run = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.training"], cwd=HERE, env=env,
                             timeout=TRAINING_SECONDS, check=False)
        if run.returncode != 0:
            raise RuntimeError(f"the training load failed (exit {run.returncode})")
        if not glob.glob(os.path.join(PROFILE_DIR, "*.gcda")):
            raise RuntimeError(f"the training load left no profile in {PROFILE_DIR}")


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
