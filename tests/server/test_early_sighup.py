"""A SIGHUP in the first instants of ``serve`` never kills the server (issue 53, point 4).

SIGHUP's default action kills, and the server installs its reload handler only once its
modules are imported (a second or more; 18 of 18 servers died of a SIGHUP 0.5 s after
spawn). ``serve`` ignores SIGHUP from the CLI's first line, before any import that takes
time, until the handler is in place.

What comes before that first line is the interpreter's own start-up, which no code of ours
runs in (a launcher that may signal that early starts the server with SIGHUP ignored: the
disposition is inherited). So each signal goes at its delay after spawn or, if the
interpreter has not yet imported the CLI by then, as soon as it has: ``-X importtime``
prints the line of ``kestrel_actors.cli`` once that import is done, which is after its first
line ran, whatever the machine's load.
"""

from __future__ import annotations

import signal
import time

import pytest

from ..helpers import ServerProcess, listening, spawn_logged, wait_for

pytestmark = pytest.mark.timeout(240)

DELAYS = (0.0, 0.05, 0.1, 0.2, 0.5)


def _cli_imported(server: ServerProcess) -> bool:
    text = server.log_path.read_text(errors="replace")
    return any(line.rstrip().endswith("| kestrel_actors.cli") for line in text.splitlines())


def test_sighup_at_any_moment_of_start_up_never_kills_the_server(tmp_path):
    outcomes = {}
    for delay in DELAYS:
        server = ServerProcess(tmp_path / f"data-{delay}")
        server.data_dir.mkdir()
        command = server.command()
        spawned = time.monotonic()
        server.proc = spawn_logged([command[0], "-X", "importtime", *command[1:]], server.log_path)
        try:
            time.sleep(max(0.0, spawned + delay - time.monotonic()))
            assert wait_for(lambda s=server: _cli_imported(s) or s.proc.poll() is not None, 60), server.log()
            server.proc.send_signal(signal.SIGHUP)
            up = wait_for(lambda s=server: listening(s.port) or s.proc.poll() is not None, 60)
            outcomes[delay] = server.proc.poll()
            if outcomes[delay] is None:
                assert up and listening(server.port), server.log()
                c = server.client()
                assert c.set("q", b"alive") == b"STORED" and c.get("q") == b"alive"
                c.close()
                # and from now on a SIGHUP reloads, as it always did
                server.proc.send_signal(signal.SIGHUP)
                assert wait_for(lambda s=server: any(
                    e.get("event") == "SIGHUP: reloading the configuration" for e in s.log_events()), 20), server.log()
                assert server.proc.poll() is None
        finally:
            server.stop(signal.SIGKILL)
    assert outcomes == dict.fromkeys(DELAYS), f"exit codes by delay (-1 is SIGHUP): {outcomes}"
