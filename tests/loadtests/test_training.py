"""The training load of the profile-guided build (``kestrel_actors.loadtests.training``): every
``make bench`` row, small, each on its own real server, which must exit cleanly on SIGTERM
(an instrumented build writes its profile only at a normal exit)."""

from __future__ import annotations

import subprocess
import sys

from kestrel_actors.loadtests.bench import BENCHMARKS

from ..helpers import REPO


def test_each_row_trains_with_its_quick_count_scaled():
    one_client = next(bench for bench in BENCHMARKS if bench.args[:3] == ("put-many", "-c", "1"))
    assert one_client.load_args() == ["put-many", "-c", "1", "-n", "20000"]
    assert one_client.load_args(quick=True) == ["put-many", "-c", "1", "-n", "2000"]
    assert one_client.load_args(quick=True, scale=0.25) == ["put-many", "-c", "1", "-n", "500"]
    assert one_client.load_args(quick=True, scale=0.0)[-1] == "1"


def test_the_training_runs_every_bench_row_on_servers_that_exit_cleanly():
    done = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.training", "--scale", "0.05"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"training: {len(BENCHMARKS)} rows in" in done.stderr
