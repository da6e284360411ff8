"""Which CPython `make` builds `.venv` on (ADR 0017): the distribution's `/usr/bin/python3.11`
when it can make a venv and has its headers, else `python3.11` from PATH; `PYTHON=` overrides.

The Makefile's choice is read from the recipe `make -n` prints for `.venv/bin/python` (`-B`: as if
the venv were missing), so nothing is installed. ``make test`` sets
``KESTREL_ACTORS_EXPECT_PYTHON`` to its choice: the suite must then run on a venv made by it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3.11"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")


def venv_recipe(*assignments: str) -> str:
    """The command `make` would run to create `.venv`, with ``assignments`` on its command line."""
    # run by `make test`, the environment carries the outer make's level and flags (its command
    # line's variables included): this make must see only ``assignments``
    outer = {"PYTHON", "MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES"}
    env = {name: value for name, value in os.environ.items() if name not in outer}
    done = subprocess.run(["make", "--no-print-directory", "-n", "-B", *assignments, ".venv/bin/python"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    # the recipe is wrapped in the Makefile's progress `step`: the command is the first
    # ``PYTHON -m venv .venv`` in it
    match = re.search(r"\S+ -m venv \.venv", done.stdout)
    assert match is not None, done.stdout
    return done.stdout[match.start():]


def can_make_a_compiled_venv(python: str) -> bool:
    """What the Makefile asks of the distribution's interpreter, asked here another way."""
    if not os.access(python, os.X_OK):
        return False
    done = subprocess.run([python, "-c", "import ensurepip, sysconfig; print(sysconfig.get_paths()['include'])"],
                          capture_output=True, text=True, timeout=60, check=False)
    return done.returncode == 0 and (Path(done.stdout.strip()) / "Python.h").is_file()


def test_make_builds_the_venv_on_the_distributions_python_when_it_can():
    expected = SYSTEM_PYTHON if can_make_a_compiled_venv(SYSTEM_PYTHON) else "python3.11"
    assert venv_recipe().startswith(f"{expected} -m venv .venv")


def test_without_the_distributions_python_make_takes_python311_from_path(tmp_path):
    assert venv_recipe(f"SYSTEM_PYTHON={tmp_path / 'missing'}").startswith("python3.11 -m venv .venv")


def test_a_distribution_python_that_cannot_make_a_venv_is_passed_over(tmp_path):
    # an interpreter whose ensurepip is missing (Debian without python3-venv) fails the probe
    stand_in = tmp_path / "python3.11"
    stand_in.write_text("#!/bin/sh\nexit 1\n")
    stand_in.chmod(0o755)
    assert venv_recipe(f"SYSTEM_PYTHON={stand_in}").startswith("python3.11 -m venv .venv")


def test_python_on_the_command_line_is_used_as_given():
    assert venv_recipe("PYTHON=/opt/other/python3.11").startswith("/opt/other/python3.11 -m venv .venv")


def test_make_test_runs_on_the_venv_it_chose():
    expected = os.environ.get("KESTREL_ACTORS_EXPECT_PYTHON")
    if not expected:
        pytest.skip("not run by make test")
    # asked of the interpreter itself: python3.11 on PATH may be a shim (pyenv's) that runs another
    chosen = subprocess.run([expected, "-c", "import sys; print(sys.executable)"], capture_output=True,
                            text=True, timeout=60, check=True).stdout.strip()
    # a venv's python links to the interpreter it was made with; sys._base_executable names it
    made_with = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    assert made_with == os.path.realpath(chosen), (
        f".venv was made with {made_with}, but make chose {expected}: `make clean`, then `make test`")
