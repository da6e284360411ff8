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
    # the measured runs flush nothing: every item of the warm-up and of both runs is still queued
    # (a flush inside a run took 0.4 of a REMOVE off each SET's figure)
    dump = subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "journal", "dump",
                           str(tmp_path / "cg" / "data" / "spam")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0, dump.stderr
    assert "0 of them open (reserved), 500 queued." in dump.stdout, dump.stdout[-300:]


def test_durable_callgrind_measures_redis_with_appendfsync_always_by_the_same_recipe(tmp_path):
    redis = shutil.which("redis-server")
    if shutil.which("valgrind") is None or redis is None:
        pytest.skip("valgrind or redis-server is not installed (make valgrind redis installs them)")
    proc = subprocess.run(
        [sys.executable, "-m", "kestrel_actors.loadtests.durable_callgrind", "--warm-up", "100",
         "--small", "100", "--big", "300", "--clients", "10", "--top", "5", "--keep", str(tmp_path / "cg"),
         "--redis", redis],
        cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^instructions per durable SET: [\d,]+$", proc.stdout, re.M), proc.stdout
    assert "python3" not in proc.stdout, proc.stdout  # Redis's own code measured, not our server's
    # appendfsync always: Redis's append-only file holds every SET of the three runs
    aof = b"".join(path.read_bytes() for path in (tmp_path / "cg" / "data").rglob("*.aof*") if path.is_file())
    assert aof.count(b"RPUSH") == 500, len(aof)
