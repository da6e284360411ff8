"""The helpers' own promises that a flaky test would otherwise be the first to notice."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .helpers import REPO, _ephemeral_ports, default_ports_held, processes_in_group, stop_process_group, wait_for


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



def test_stopping_a_process_group_waits_for_the_server_a_shell_left_behind(tmp_path):
    # a stand-in for `serve &` in a documented example: it outlives the shell and takes a while
    # to shut down on SIGTERM; the lock on the default ports must not be released before it ends
    child = ("import os, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))\n"
             f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
             "time.sleep(600)\n")
    (tmp_path / "server.py").write_text(child)
    shell = subprocess.Popen(["bash", "-c", f"{sys.executable} {tmp_path / 'server.py'} &"],
                             start_new_session=True)
    shell.wait(60)
    assert wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text())
    server = int((tmp_path / "pid").read_text())
    assert server in processes_in_group(shell.pid)
    stop_process_group(shell)
    assert processes_in_group(shell.pid) == []


def test_the_default_ports_lock_is_one_for_runs_with_different_temporary_directories(tmp_path):
    released = tmp_path / "released"
    script = ("import sys, time; from tests.helpers import default_ports_held\n"
              "with default_ports_held(free_within=0):\n"
              "    print('held', flush=True); time.sleep(1)\n"
              f"    open({str(released)!r}, 'w').close()\n")
    other = tmp_path / "other-tmp"
    other.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                              env={**os.environ, "TMPDIR": str(other)}, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with default_ports_held(free_within=0):
            assert released.exists()  # taken only once the other run let go
    finally:
        holder.wait(60)
