"""Instructions per durable SET under callgrind: ADR 0018's recipe (not a test; needs valgrind).

The server (``serve --sync-journal always``, the package this interpreter imports: build it
compiled first) runs under ``valgrind --tool=callgrind``; ``put-many -c 100`` warms it up, then
callgrind's counters are zeroed and dumped around a short and a long run. The difference of the
two dumps per SET is what one more durable SET costs: the connections' setup is in both runs and
cancels out. The measured runs do not flush the queue first (``-F``): a flush in them removed the
run before's items, 3,000 in the short one and 1,000 in the long one, and so took 0.4 of a
REMOVE off each SET's figure. Deterministic to about 0.5%, so two builds compare in one run each
where timed rounds swing more than the change. ``--redis BINARY`` runs the same recipe against
Redis with ``appendfsync always`` (the bench's durable row's peer), through ``--resp``.

    python -m kestrel_actors.loadtests.durable_callgrind [--warm-up 3000] [--small 1000] \
        [--big 6000] [--clients 100] [--top 30] [--keep DIR] [--redis /usr/bin/redis-server]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .bench import REDIS_DURABLE

_NAMED = re.compile(r"\((\d+)\)(?: (.*))?")


@dataclass(frozen=True)
class Dump:
    """One callgrind dump: its total instructions and each function's own ("self") count."""

    total: int
    own: dict[tuple[str, str], int]  # (object file's name, function) -> instructions


@dataclass(frozen=True)
class Result:
    """What one more durable SET costs: instructions, and by function (per SET)."""

    per_set: float
    by_function: list[tuple[float, str, str]]  # (instructions, object file's name, function)
    by_object: list[tuple[float, str]]


def read_dump(path: Path) -> Dump:
    """Parse callgrind's format (name compression: ``fn=(7) name`` once, then ``fn=(7)``).

    Cost lines after ``fn=`` are that function's own; the one after ``calls=`` is a call's
    inclusive cost, not the caller's own, so it is skipped."""
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    own: collections.Counter[tuple[str, str]] = collections.Counter()
    total = 0
    obj = fn = ""
    after_call = False
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if after_call:
                after_call = False
                continue
            head = line[:1]
            if head.isdigit() or head in "+-*":
                parts = line.split()
                if len(parts) >= 2:
                    own[obj, fn] += int(parts[1])
            elif line.startswith(("ob=", "fn=", "cob=", "cfn=")):
                key, _, rest = line.rstrip("\n").partition("=")
                kind = key[-2:]
                match = _NAMED.match(rest)
                if match:
                    if match.group(2) is not None:
                        names[kind][match.group(1)] = match.group(2)
                    name = names[kind].get(match.group(1), rest)
                else:
                    name = rest
                if key == "ob":
                    obj = name
                elif key == "fn":
                    fn = name
            elif line.startswith("calls="):
                after_call = True
            elif line.startswith(("summary:", "totals:")) and not total:
                total = int(line.split()[1])
    return Dump(total, dict(own))


def difference(small: Dump, big: Dump, sets: int) -> Result:
    keys = set(small.own) | set(big.own)
    per = {key: (big.own.get(key, 0) - small.own.get(key, 0)) / sets for key in keys}
    by_object: dict[str, float] = collections.defaultdict(float)
    for (obj, _), cost in per.items():
        by_object[os.path.basename(obj)] += cost
    ranked = sorted(((cost, os.path.basename(obj), fn) for (obj, fn), cost in per.items()), reverse=True)
    return Result((big.total - small.total) / sets, ranked,
                  sorted(((cost, obj) for obj, cost in by_object.items()), reverse=True))


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _put_many(port: int, sets: int, clients: int, options: tuple[str, ...]) -> None:
    subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests", "put-many", "-c", str(clients),
                    "-n", str(sets), "-p", str(port), "--no-progress", *options],
                   check=True, stdout=subprocess.DEVNULL, timeout=900)


def _server_command(out: Path, port: int, redis: str | None) -> list[str]:
    if redis is not None:
        return [redis, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(out / "data"),
                *REDIS_DURABLE]
    return [sys.executable, "-m", "kestrel_actors.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--text-port", "0", "--admin-port", "0", "--thrift-port", "0", "--data-dir", str(out / "data"),
            "--log-level", "warning", "--sync-journal", "always"]


def _callgrind_control(*args: str) -> None:
    done = subprocess.run(["callgrind_control", *args], capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"callgrind_control {' '.join(args)} failed: {done.stdout}{done.stderr}")


def measure(out: Path, warm_up: int, small: int, big: int, clients: int, redis: str | None = None) -> Result:
    """Run the recipe with its files in ``out`` (emptied first); against ``redis`` if given."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (Debian's valgrind package; make test installs it)")
    shutil.rmtree(out, ignore_errors=True)
    (out / "data").mkdir(parents=True)
    port = _free_port()
    root = Path(__file__).resolve().parents[2]
    with open(out / "server.log", "wb") as log:
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.out.%p", "--dump-instr=no",
             *_server_command(out, port, redis)],
            cwd=root, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not _accepts(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server under valgrind did not listen; see {out}/server.log")
            time.sleep(0.5)
        pid = str(server.pid)  # valgrind runs the server in its own process: the same pid
        protocol = ("--resp",) if redis is not None else ()
        _put_many(port, warm_up, clients, protocol)
        dumps: list[Dump] = []
        for name, sets in (("small", small), ("big", big)):
            _callgrind_control("-z", pid)
            _put_many(port, sets, clients, ("-F", *protocol))
            _callgrind_control("-d", name, pid)
            dumps.append(read_dump(next(out.glob(f"callgrind.out.{pid}.{len(dumps) + 1}*"))))
    finally:
        server.terminate()
        server.wait(120)
    return difference(dumps[0], dumps[1], big - small)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-up", type=int, default=3000, help="SETs before the measured runs")
    parser.add_argument("--small", type=int, default=1000, help="SETs of the short run")
    parser.add_argument("--big", type=int, default=6000, help="SETs of the long run")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--top", type=int, default=30, help="functions listed")
    parser.add_argument("--keep", type=Path, default=None,
                        help="directory for the dumps and the server's data (kept; default: a temporary one)")
    parser.add_argument("--redis", default=None, metavar="BINARY",
                        help="measure this redis-server (appendfsync always) instead of ours")
    args = parser.parse_args(argv)
    if args.big <= args.small:
        parser.error("--big must exceed --small")
    out = args.keep or Path(tempfile.mkdtemp(prefix="durable-callgrind-"))
    try:
        result = measure(out.resolve(), args.warm_up, args.small, args.big, args.clients, args.redis)
    finally:
        if args.keep is None:
            shutil.rmtree(out, ignore_errors=True)
    print(f"instructions per durable SET: {result.per_set:,.0f}")
    print("by object file:")
    for cost, obj in result.by_object[:8]:
        print(f"  {cost:8.1f}  {obj}")
    print("by function (own instructions per SET):")
    for cost, obj, fn in result.by_function[:args.top]:
        print(f"  {cost:8.1f}  {fn[:110]}  [{obj}]")


if __name__ == "__main__":
    main()
