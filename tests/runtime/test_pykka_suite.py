"""pykka's own test suite, run against our gevent runtime (issue 25.2; ADR 0001).

pykka's tests are not in its wheel; its sdist has them. The sdist of the installed pykka is
fetched once into ``build/`` (pip, as ``make install`` fetches everything else) and its
``tests/`` run in a subprocess, with pykka's sdist as the rootdir (its tests are a package
named ``tests``, as ours are) and ``pykka_suite/kestrel_pykka_runtime.py`` as a plugin that
parametrises pykka's ``runtime`` fixture over our runtime's variants.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = Path(__file__).resolve().parent / "pykka_suite"
BUILD = ROOT / "build"


def pykka_sdist_tests(pykka_version: str) -> Path:
    """The unpacked sdist of ``pykka_version`` in ``build/`` (fetched the first time)."""
    unpacked = BUILD / f"pykka-{pykka_version}"
    if (unpacked / "tests" / "conftest.py").exists():
        return unpacked
    downloads = BUILD / "pykka-sdist"
    # only pykka as source: with ":all:" pip also built pykka's build backend from source to read
    # its metadata, 3-4 minutes of CPU (past the timeout under load) where this takes seconds
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", "pykka", "--no-deps",
         f"pykka=={pykka_version}", "-d", str(downloads)],
        check=True, timeout=300,
    )
    with tarfile.open(downloads / f"pykka-{pykka_version}.tar.gz") as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(BUILD, filter="data")
        else:
            # CPython before 3.11.4 (Debian's 3.11.2, ADR 0017) has no extraction filters: only
            # plain files and folders inside BUILD, as the "data" filter would allow
            archive.extractall(BUILD, members=[member for member in archive.getmembers() if _plain(member)])
    return unpacked


def _plain(member: tarfile.TarInfo) -> bool:
    parts = Path(member.name).parts
    return (member.isfile() or member.isdir()) and not member.name.startswith("/") and ".." not in parts


@pytest.mark.timeout(600)
def test_pykka_own_suite_passes_against_the_gevent_runtime():
    sdist = pykka_sdist_tests(version("pykka"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGIN_DIR), str(ROOT)]))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "kestrel_pykka_runtime", "-p", "no:cacheprovider",
         "-c", "pyproject.toml", "--rootdir", ".", "-o", "addopts=", "--timeout", "60", "tests"],
        cwd=sdist, env=env, capture_output=True, text=True, timeout=540,
    )
    summary = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, summary
    passed = {"gevent": 0, "gevent-inline": 0, "gevent-on-demand": 0}
    for test_id in re.findall(r"\[([^\]]*gevent[^\]]*)\] PASSED", run.stdout):
        variant = next(name for name in ("gevent-on-demand", "gevent-inline", "gevent") if name in test_id)
        passed[variant] += 1
    # every variant of the runtime ran pykka's suite (pykka 4.5: 145 tests each; the
    # on-demand one skips the 7 that need on_start at start)
    assert min(passed.values()) >= 130, (passed, summary)
