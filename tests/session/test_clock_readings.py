"""Issue 56: a lone request reads the clock once when its read is handled and once for its answer.

The request's time (the item's add time, the ``now`` expiries are checked against, the start of
its latency) is the one reading its read callback made (``_clock.TURN``); the answer's latency
and delivery time share the second. A real server runs in a fresh interpreter on the pure-Python
source (``KESTREL_ACTORS_PURE=1``: the compiled build makes the same calls, but a profiler sees
only the interpreter's), on a thread of its own whose calls a profiler counts; one client sends
requests one at a time over a real socket. Counted by instrumentation, not by time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kestrel_actors

ROOT = Path(kestrel_actors.__file__).parent.parent
REQUESTS = 200

SCRIPT = """
import json, sys, threading, time
from kestrel_actors.logs import configure_logging
from kestrel_actors.loadtests.loop_bench import WARM_UP, InProcessServer, _Client

configure_logging(level="warning")
CLOCKS = {time.time, time.time_ns, time.perf_counter, time.perf_counter_ns, time.monotonic, time.monotonic_ns}
readings = [0]

def count(_frame, event, arg):
    if event == "c_call" and arg in CLOCKS:
        readings[0] += 1

requests = int(sys.argv[1])
item = b"x" * 1024
SET = b"set q 0 0 1024\\r\\n" + item + b"\\r\\n"
GET = b"get q\\r\\n"
HIT = b"VALUE q 0 1024\\r\\n" + item + b"\\r\\nEND\\r\\n"
threading.setprofile(count)  # the server's thread only: it starts now, the client's runs already
server = InProcessServer(None)
threading.setprofile(None)
client = _Client(server.port)
per = {}
try:
    for _ in range(WARM_UP):
        client.ask(SET, b"\\r\\n")
        client.ask(GET, b"END\\r\\n")
    for name, request, end, reply in (("set", SET, b"\\r\\n", b"STORED\\r\\n"), ("get", GET, b"END\\r\\n", HIT)):
        before = readings[0]
        for _ in range(requests):
            assert client.ask(request, end) == reply
        time.sleep(0.05)  # what follows a reply belongs to its request
        per[name] = (readings[0] - before) / requests
finally:
    client.close()
    server.stop()
print(json.dumps(per))
"""


@pytest.fixture(scope="module")
def readings() -> dict[str, float]:
    env = dict(os.environ, KESTREL_ACTORS_PURE="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(REQUESTS)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("request_kind", ["set", "get"])
def test_a_lone_request_reads_the_clock_twice(readings: dict[str, float], request_kind: str) -> None:
    # once when the dispatcher tells the read's requests (the request's time), once for the
    # answer's latency and delivery figures; a SET read it three times, a GET hit four
    assert readings[request_kind] == pytest.approx(2.0, abs=0.05), readings
