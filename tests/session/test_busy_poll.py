"""The hub's busy poll (``busy_poll``, ADR 0025): after a read the hub does not sleep until the
poll's time has passed since the last read, and an idle server does not poll at all.

Whether the hub's thread slept is read from the kernel: a thread asleep in ``epoll_wait`` counts
a voluntary context switch when it wakes; one that polls and yields counts none."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import gevent
import pytest

from kestrel_actors.config import load_config
from kestrel_actors.session._transport import WANTED_PAUSE, BusyPoll
from tests.helpers import ServerProcess, unique

REQUESTS = 20
GAP = 0.02
"""Seconds between two requests: long beside a request, short beside the poll below."""


@dataclass(frozen=True)
class Switches:
    """A thread's context switches: ``voluntary`` (it slept: the hub in ``epoll_wait``) and
    ``involuntary`` (another task took its CPU: at a yield or by preemption), and the machine's
    ``stolen`` ticks (the host ran something else on its vCPUs: the guest sees no switch)."""

    voluntary: int
    involuntary: int
    stolen: int

    def __sub__(self, before: Switches) -> Switches:
        return Switches(self.voluntary - before.voluntary, self.involuntary - before.involuntary,
                        self.stolen - before.stolen)


def _switches(pid: int) -> Switches:
    """The main thread's (the hub's) context switches so far."""
    counts = {}
    with open(f"/proc/{pid}/task/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            counts[name] = value.strip()
    with open("/proc/stat") as stat:
        stolen = int(stat.readline().split()[8])  # "cpu  user nice system idle iowait irq softirq steal"
    return Switches(int(counts["voluntary_ctxt_switches"]), int(counts["nonvoluntary_ctxt_switches"]),
                    stolen)


def _voluntary_switches(pid: int) -> int:
    return _switches(pid).voluntary


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _switches_between_requests(tmp_path, busy_poll: str, hog: bool = False) -> Switches:
    """The hub's context switches over ``REQUESTS`` requests ``GAP`` apart; with ``hog``, the hub and a
    process that computes without end share one CPU (both pinned to it)."""
    server = ServerProcess(tmp_path / busy_poll, args=("--busy-poll", busy_poll,
                                                       "--expiration-timer-frequency", "0")).start()
    hogging = None
    try:
        assert server.proc is not None
        if hog:
            cpu = max(os.sched_getaffinity(0))
            os.sched_setaffinity(server.proc.pid, {cpu})  # the hub's thread: the process's first
            hog_code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
            hogging = subprocess.Popen([sys.executable, "-c", hog_code])
        queue = unique()
        client = server.client()
        assert client.get(queue) is None  # makes the queue: from here on a GET touches no file
        time.sleep(GAP)
        before = _switches(server.proc.pid)
        for _ in range(REQUESTS):
            # a GET of an empty queue: no journal write, which a busy disk could make wait
            assert client.get(queue) is None
            time.sleep(GAP)
        switches = _switches(server.proc.pid) - before
        client.close()
        return switches
    finally:
        if hogging is not None:
            hogging.kill()
            hogging.wait()
        server.stop()


SLEEPS_PER_GIVE_WAY = math.ceil(WANTED_PAUSE / GAP) + 2
"""The most sleeps of a hub that gave way its vCPU once: one per request in its pause (none
starts the poll), the timer's that ends it, one more for a pause that straddles a gap."""


def test_the_hub_stays_awake_between_requests_within_its_busy_poll(tmp_path):
    # a poll of 5 s covers every gap: the hub sleeps only for a while after another task took
    # its CPU (an involuntary switch) or the host its vCPU (stolen time, counted in ticks: one
    # more for a part of one), when it gives way (the test below: on a loaded machine others do)
    switches = _switches_between_requests(tmp_path, "5s")
    gave_way_at_most = switches.involuntary + switches.stolen + 1
    assert switches.voluntary <= 2 + SLEEPS_PER_GIVE_WAY * gave_way_at_most


def test_without_a_busy_poll_the_hub_sleeps_between_requests(tmp_path):
    # the same requests with "0": the hub sleeps in epoll_wait after each (the test above's contrast)
    assert _switches_between_requests(tmp_path, "0").voluntary >= REQUESTS


def test_the_hub_does_not_poll_on_a_cpu_another_process_wants(tmp_path):
    # the same 5 s poll, with a process computing on the hub's CPU: it runs in the hub's yields
    # (the scheduler shares the CPU), and the hub gives way: it sleeps after each request (had
    # it polled on, it would have waited for the end of the other's slice to read the next one)
    assert _switches_between_requests(tmp_path, "5s", hog=True).voluntary >= REQUESTS


def test_an_idle_server_stops_polling_once_its_busy_poll_has_passed(tmp_path):
    server = ServerProcess(tmp_path / "data", args=("--busy-poll", "200ms",
                                                    "--expiration-timer-frequency", "0")).start()
    try:
        assert server.proc is not None
        client = server.client()
        assert client.set(unique(), b"x") == b"STORED"
        time.sleep(0.5)  # past the poll
        cpu, switches = _cpu_seconds(server.proc.pid), _voluntary_switches(server.proc.pid)
        time.sleep(1.0)
        # asleep: at most a tick of CPU (CPU used, not time passed: a loaded machine cannot raise a
        # sleeping server's, while a polling one's would be most of the second), and no wake-up
        assert _cpu_seconds(server.proc.pid) - cpu <= 0.05
        assert _voluntary_switches(server.proc.pid) - switches <= 2
        client.close()
    finally:
        server.stop()


def test_the_poll_runs_from_the_last_read_and_ends_by_itself():
    loop = gevent.get_hub().loop
    poll = BusyPoll(loop)
    poll.seconds = 30.0
    poll.wanted_gap = 30.0  # another process taking this CPU (a loaded machine) does not stop it here
    poll.touch()
    assert poll.polling
    gevent.sleep(0.05)
    assert poll.polling  # 30 s from the last read have not passed, however loaded the machine
    poll.seconds = 0.05
    poll.touch()  # a read: the poll now ends 0.05 s after the next empty turn
    gevent.sleep(0.5)
    assert not poll.polling
    assert not poll.watcher.active


def test_a_busy_poll_of_zero_never_polls():
    poll = BusyPoll(gevent.get_hub().loop)
    poll.touch()  # seconds is 0 until the server sets it
    assert not poll.polling
    assert not poll.watcher.active


def test_busy_poll_is_a_duration_in_the_config_file(tmp_path):
    path = tmp_path / "kestrel.toml"
    path.write_text('busy_poll = "50us"\n')
    assert load_config(str(path)).busy_poll == pytest.approx(0.00005)
    path.write_text("busy_poll = 0\n")
    assert load_config(str(path)).busy_poll == 0.0


def test_a_bad_busy_poll_flag_is_refused_with_its_name(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "serve", "--busy-poll", "soon",
                             "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--busy-poll" in result.stderr and "duration" in result.stderr


def test_a_read_does_not_start_the_poll_while_a_pool_thread_works():
    # a durable SET's read comes while its queue's fdatasync runs on the pool: starting the poll
    # then would only stop it at the next empty turn (ADR 0025)
    import threading

    poll = BusyPoll(gevent.get_hub().loop)
    poll.seconds = 5.0
    release = threading.Event()
    job = gevent.get_hub().threadpool.spawn(release.wait, 30)
    try:
        poll.touch()
        assert not poll.polling and not poll.watcher.active
    finally:
        release.set()
        job.get(timeout=30)
    poll.touch()
    assert poll.polling
    poll.seconds = 0.0
    gevent.sleep(0.01)
    assert not poll.polling
