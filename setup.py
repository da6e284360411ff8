"""The build: metadata is in setup.cfg; this file only decides whether and how the request path is
compiled. Its switches (``KESTREL_ACTORS_MYPYC``, ``KESTREL_ACTORS_PGO``) and the package's
fall-back to pure Python are stated in docs/build.md; the decision is ADR 0015.
"""

from __future__ import annotations

import gc
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

from setuptools import setup
from setuptools.command.build_ext import build_ext

SWITCH = "KESTREL_ACTORS_MYPYC"
PGO_SWITCH = "KESTREL_ACTORS_PGO"
HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE_DIR = os.path.join(HERE, "build", "pgo")
"""Where the instrumented build writes its counts (``.gcda``), emptied before each training."""
TRAINING_SECONDS = 900
LEAN_CALL_FLAGS = ["-fvisibility=hidden", "-fno-semantic-interposition", "-fno-plt"]
"""Added to the interpreter's compile flags for every compiled module (gcc and clang; ADR 0020).
mypyc's modules call each other's functions and read each other's statics (``CPyStatic_*``,
``CPyType_*``) by exported symbol, so a default-visibility build reached each static through the
GOT and each call into the interpreter through a PLT stub (a second, indirect jump). Hidden
symbols (the modules' ``PyInit_*`` stay exported: ``PyMODINIT_FUNC``) make the reads direct and let
gcc inline within a file (as ``-fno-semantic-interposition`` does), ``-fno-plt`` calls through the
GOT without the stub. Debian's ``-fstack-protector-strong`` stays: the extension parses what
clients send, and its canaries cost ~250 instructions and ~25 I1 misses a request (~1.5%)."""
PROGRESS_SECONDS = 10.0
"""How often a long step of the build says how far it is: never more than this without a line."""


def say(what: str) -> None:
    print(f"kestrel-actors: {what}", file=sys.stderr, flush=True)


class Progress:
    """One line on stderr when a step starts, then one every :data:`PROGRESS_SECONDS` saying how
    long it has run and, given ``how_far``, how far it is, then one when it ends: a build that
    prints nothing for minutes looks hung."""

    def __init__(self, step: str, how_far: Callable[[], str] | None = None) -> None:
        self.step = step
        self.how_far = how_far
        self.done = threading.Event()
        self.started = time.monotonic()

    def __enter__(self) -> Self:
        say(self.step)
        threading.Thread(target=self.tick, daemon=True).start()
        return self

    def tick(self) -> None:
        while not self.done.wait(PROGRESS_SECONDS):
            far = f", {self.how_far()}" if self.how_far is not None else ""
            say(f"... {self.step}: {time.monotonic() - self.started:.0f} s{far}")

    def __exit__(self, kind: object, *_: object) -> None:
        self.done.set()
        if kind is None:
            say(f"done in {time.monotonic() - self.started:.0f} s: {self.step}")


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
    """The C compiler setuptools would use here, with the interpreter's settings (``distutils``
    is setuptools' own copy once setuptools is imported, as it is above)."""
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

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
        say(f"installing pure Python: {reason}")
        return []
    from mypyc.build import mypycify

    paths = [os.path.join("kestrel_actors", *name.split(".")[1:]) + ".py" for name in SETTINGS.COMPILED_MODULES]
    # The build type-checks only what it compiles, with mypy's defaults: the lint (setup.cfg's
    # strict sections) is the judge of the code, and the build must work in pip's isolated build
    # environment, where the dependencies (pykka, gevent, ...) are absent and so typed as Any.
    # group_name: the group's shared library is then kestrel_actors/_native__mypyc.*.so, inside
    # the package, where an editable install that was made pure (the Makefile's) still finds it;
    # by default it is named by a hash and sits beside the package, outside the editable mapping.
    # multi_file: one C file per module, not one 12 MB file, so that gcc runs on every core
    # (BuildExt.build_extensions) for no measured loss at run time (ADR 0015, eighth pass).
    with Progress(f"mypyc: type-checking the {len(paths)} compiled modules and writing their C"):
        extensions = mypycify(["--config-file=", "--follow-imports=silent", "--ignore-missing-imports", *paths],
                              opt_level="3", group_name="kestrel_actors._native", multi_file=True)
    # mypy's build (millions of objects) stays alive to the end of the process, and the collector's
    # passes over it at exit took 27 s, silent, on a loaded machine: frozen, it skips them (0.4 s)
    gc.freeze()
    for ext in extensions:
        # mypyc 2.4.1 writes a dotted group's headers into build/kestrel_actors/ but includes them
        # from the modules' C files in build/ as if they sat beside them
        ext.include_dirs.append(os.path.join("build", "kestrel_actors"))
        if sys.platform != "win32":
            ext.extra_compile_args += LEAN_CALL_FLAGS
    return extensions


def c_compiler_is_gcc(command: list[str]) -> bool:
    try:
        version = subprocess.run([command[0], "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in version


def one_file_per_call(compile_sources: Callable[..., list[str]], jobs: int) -> Callable[..., list[str]]:
    """``compile_sources`` (a compiler's public ``compile``) called once per C file, ``jobs`` calls
    at a time, each waiting on its gcc process. distutils compiles one extension's files one after
    another, and ``build_ext --parallel`` only builds whole extensions side by side; mypyc's group
    is one extension of 47 files (split into several groups, mypyc 2.4.1's multi-file build does
    not link: ADR 0015)."""

    def compile_each(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
        with ThreadPoolExecutor(jobs) as pool:
            batches = list(pool.map(lambda source: compile_sources([source], *args, **kwargs), sources))
        return [obj for batch in batches for obj in batch]

    return compile_each


class BuildExt(build_ext):
    """``build_ext`` that can build profile-guided (``KESTREL_ACTORS_PGO=1``, docs/build.md), that
    compiles C files in parallel and says how far it is, and that gives
    every extension it outputs the build's time: mypyc rewrites only the C files whose code
    changed, so an extension can come out older than a ``.py`` edited before the build, and the
    package's stale-build guard (``_compiled.py``) compares the two."""

    def build_extensions(self) -> None:
        sources = [source for ext in self.extensions for source in ext.sources]
        started = time.time()
        jobs = os.cpu_count() or 1
        if jobs > 1:
            self.compiler.compile = one_file_per_call(self.compiler.compile, jobs)

        def how_far() -> str:
            compiled = 0
            for path in glob.glob(os.path.join(self.build_temp, "**", "*.o"), recursive=True):
                try:
                    compiled += os.stat(path).st_mtime >= started
                except OSError:  # being written
                    pass
            return f"{compiled} of {len(sources)} C files compiled"

        with Progress(f"gcc: compiling {len(sources)} C files into {len(self.extensions)} extensions, "
                      f"{jobs} at a time", how_far):
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
                say("profile-guided build, step 1 of 3: compiling instrumented")
                self.compile_with(["-fprofile-generate", profile, "-fprofile-update=single"], ["-fprofile-generate"])
                with Progress("profile-guided build, step 2 of 3: the training load "
                              "(python -m kestrel_actors.loadtests.training)"):
                    self.train()
                say("profile-guided build, step 3 of 3: compiling from the profile")
                # -fprofile-partial-training: what the training did not run (the text and thrift
                # protocols, the admin's calls) stays optimised for speed, not for size.
                self.compile_with(["-fprofile-use", profile, "-fprofile-correction", "-fprofile-partial-training",
                                   "-Wno-missing-profile"], [])
                with open(PROFILE_MARKER, "w") as marker:
                    marker.write("profile-guided (gcc): trained by python -m kestrel_actors.loadtests.training\n")
                say("compiled profile-guided")
                return
            except Exception as exc:  # noqa: BLE001 - any failure falls back to the plain compile
                reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        say(f"compiled without a profile: {reason}")
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
