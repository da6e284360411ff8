"""A thousand clients that send requests and never read: how long a fresh client waits meanwhile.

    python -m kestrel_actors.loadtests.non_readers_bench --port 22133 [--clients 1000] [--probes 40]

Start the server with a buffer bound (``serve --max-buffered-bytes 128M``, as the test in
``tests/session/test_memory.py`` does). Each of ``--clients`` non-readers connects with a 4 KiB
receive window, asks for ``--peeks`` peeks of a 64 KiB item (12.5 MiB of replies by default)
and never reads. Meanwhile a probe connects afresh every ``--gap`` seconds and sends a SET and a
GET; the time from its connect to the whole answer is one round trip. A probe not answered
within ``--timeout`` seconds counts as unanswered. Prints the round trips' p50, p99 and max
(issue 53 point 4 wants p99 under 250 ms, every probe answered).
"""

from __future__ import annotations

import argparse
import resource
import socket
import threading
import time

PROBE_REQUEST = b"set probe 0 0 1\r\nx\r\nget probe\r\n"
PROBE_REPLY = b"STORED\r\nVALUE probe 0 1\r\nx\r\nEND\r\n"


def probe_once(host: str, port: int, timeout: float) -> float | None:
    """Seconds from connect to the whole answer of a fresh client's SET and GET; ``None``
    if it was not answered within ``timeout`` (or the connection failed)."""
    started = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(PROBE_REQUEST)
            reply = b""
            while len(reply) < len(PROBE_REPLY):
                sock.settimeout(max(0.001, timeout - (time.perf_counter() - started)))
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                reply += chunk
    except OSError:
        return None
    return time.perf_counter() - started if reply == PROBE_REPLY else None


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=22133)
    parser.add_argument("--clients", type=int, default=1000, help="Non-readers.")
    parser.add_argument("--peeks", type=int, default=200, help="Peeks each non-reader asks for.")
    parser.add_argument("--probes", type=int, default=40, help="Fresh-client probes in all.")
    parser.add_argument("--gap", type=float, default=0.25, help="Seconds between probes.")
    parser.add_argument("--timeout", type=float, default=5.0, help="Seconds a probe may wait.")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.clients + 256)), hard))

    with socket.create_connection((args.host, args.port), timeout=10) as setup:
        setup.sendall(b"set big 0 0 65536\r\n" + bytes(65536) + b"\r\n")
        assert setup.recv(100) == b"STORED\r\n"

    round_trips: list[float] = []
    unanswered = [0]

    def probe() -> None:
        for _ in range(args.probes):
            took = probe_once(args.host, args.port, args.timeout)
            if took is None:
                unanswered[0] += 1
            else:
                round_trips.append(took)
            time.sleep(args.gap)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    request = b"get big/peek\r\n" * args.peeks
    non_readers = []
    for _ in range(args.clients):
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a window that fills at once
        client.connect((args.host, args.port))
        client.sendall(request)
        non_readers.append(client)
    prober.join()
    for client in non_readers:
        client.close()

    ordered = sorted(round_trips)
    if ordered:
        print(f"{len(ordered)} of {args.probes} probes answered ({unanswered[0]} not within "
              f"{args.timeout:g} s); round trip p50 {1e3 * percentile(ordered, 0.5):.1f} ms, "
              f"p99 {1e3 * percentile(ordered, 0.99):.1f} ms, max {1e3 * ordered[-1]:.1f} ms")
    else:
        print(f"none of {args.probes} probes answered within {args.timeout:g} s")


if __name__ == "__main__":
    main()
