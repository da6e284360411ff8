"""``kestrel_actors.loadtests.durable_callgrind``: ADR 0018's recipe, run small under a real valgrind.

Skipped where valgrind is missing (``make test`` installs Debian's). The counts are not judged
(they are a measurement); the run must end, and say how many instructions a durable SET took
and where they went."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from ..helpers import REPO

pytestmark = pytest.mark.slow


def test_durable_callgrind_prints_instructions_per_set_and_the_top_functions(tmp_path):
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        pytest.skip("valgrind is not installed (make valgrind installs Debian's)")
    proc = subprocess.run(
        [sys.executable, "-m", "kestrel_actors.loadtests.durable_callgrind", "--warm-up", "100",
         "--small", "100", "--big", "300", "--clients", "10", "--top", "5", "--keep", str(tmp_path / "cg")],
        cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    per_set = re.search(r"^instructions per durable SET: ([\d,]+)$", proc.stdout, re.M)
    assert per_set is not None, proc.stdout
    # a durable SET through the whole server: thousands of instructions, never none
    assert int(per_set.group(1).replace(",", "")) > 1000, proc.stdout
    functions = proc.stdout.split("by function (own instructions per SET):\n")[1].splitlines()
    assert len(functions) == 5 and all(re.match(r"^ +-?[\d.]+  \S", line) for line in functions), proc.stdout
    assert sorted((tmp_path / "cg").glob("callgrind.out.*.[12]*")), "no dumps kept"
