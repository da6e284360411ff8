"""Connection churn: the server's CPU time per connect, one blocking open read, and hang-up.

    python -m kestrel_actors.loadtests.churn_bench --port 22133 --pid <server pid> [-n 10000] [-c 20]

Each of ``-c`` greenlets connects, sends ``get churn/t=1000/close/open`` and hangs up at once,
``-n`` times in all; the server's CPU time (``/proc/<pid>/stat``) over the run, divided by
``n``, is what one such connection cost it. many-clients' kills are this, once per ten items.
"""

from __future__ import annotations

import argparse
import os
import time

import gevent

from kestrel_actors.client import Connection, get_request


def server_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=22133)
    parser.add_argument("--pid", type=int, required=True, help="The server's process id.")
    parser.add_argument("-n", type=int, default=10_000, help="Connections in all.")
    parser.add_argument("-c", type=int, default=20, help="Concurrent connecting greenlets.")
    args = parser.parse_args()
    done = [0]

    def churn() -> None:
        while done[0] < args.n:
            done[0] += 1
            connection = Connection(args.host, args.port).connect()
            connection.send(get_request("churn", "/t=1000/close/open"))
            connection.close()

    cpu_before, started = server_cpu_seconds(args.pid), time.monotonic()
    gevent.joinall([gevent.spawn(churn) for _ in range(args.c)])
    elapsed, cpu = time.monotonic() - started, server_cpu_seconds(args.pid) - cpu_before
    print(f"{args.n / elapsed:,.0f} connections/s; server CPU {1e6 * cpu / args.n:,.0f} µs per "
          f"connection ({100 * cpu / elapsed:.0f}% of a core)")


if __name__ == "__main__":
    main()
