"""The helpers' own promises that a flaky test would otherwise be the first to notice."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .helpers import REPO, _ephemeral_ports


def _ports_of_worker(worker: str, count: int) -> list[int]:
    script = ("import json; from tests.helpers import free_port; "
              f"print(json.dumps([free_port() for _ in range({count})]))")
    env = {**os.environ, "PYTEST_XDIST_WORKER": worker}
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_free_ports_of_two_workers_never_meet_nor_the_kernels_ephemeral_range():
    first, second = _ports_of_worker("gw0", 300), _ports_of_worker("gw1", 300)
    assert len(set(first)) == len(first) and len(set(second)) == len(second)
    assert not set(first) & set(second)
    assert not {port for port in first + second if port in _ephemeral_ports()}

