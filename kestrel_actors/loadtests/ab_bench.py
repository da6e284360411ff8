"""Interleaved A/B of two source trees of the server under one load-test command.

    python -m kestrel_actors.loadtests.ab_bench --rounds 6 "get-many -c 100 -n 100000" TREE_A TREE_B [-- serve args]

On a noisy shared machine two runs minutes apart differ more than most changes do, so the
two servers take turns (A B, B A, A B, …), each a fresh ``serve`` on a free loopback port
with an empty data directory, started with ``PYTHONPATH`` set to its tree (a checkout or a
``git worktree`` of the commit to compare). The client is always this tree's
``python -m kestrel_actors.loadtests``. Reported per tree: the median and best rate, and the server's CPU
time (from ``/proc``) per request handled, fill included, and the system part of it (a
one-client figure moves with the VM's wake-up cost: issue 24's "two regimes").

A tree given as ``DIR@PYTHON`` runs its server on that interpreter (a venv's ``bin/python`` with
the server's dependencies) instead of this one: two interpreters, one source (ADR 0017). A tree
given as ``peer:BINARY`` runs that binary with darner's command line (``-p PORT -d DIR``), so a
change can be measured against the peer in the same alternation.

Each run also says how often the server and the load generator sat on one vCPU ("same vCPU":
the share of samples, every 10 ms, in which ``/proc`` shows both last ran on the same one). On
this 2-vCPU VM a closed-loop row runs in one of two modes by where the scheduler puts the pair,
and a run's rate and CPU per request are only comparable with runs of the same mode (ADR 0024).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from .bench import Placement, cpu_seconds, free_port

__all__ = ["main"]

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds ``kestrel_actors``: the load itself runs from there, with this code."""


class RunFigures(NamedTuple):
    rate: float
    cpu: float
    """Server CPU µs per request."""
    system: float
    """Of which system."""
    same_cpu: float | None
    """The share of samples in which server and load generator last ran on one vCPU (None: no sample)."""


def server_command(tree: str, port: int, data_dir: str) -> tuple[list[str], dict[str, str], str]:
    """How ``tree`` is started (see the module's doc): the command, its environment, its directory."""
    if tree.startswith("peer:"):
        return [tree[len("peer:"):], "-p", str(port), "-d", data_dir], dict(os.environ), data_dir
    tree, _, python = tree.partition("@")
    # the other listeners on ports of the kernel's choosing: their defaults may be another's
    command = [python or sys.executable, "-m", "kestrel_actors.cli", "serve", "--host", "127.0.0.1",
               "--port", str(port), "--text-port", "0", "--thrift-port", "0", "--admin-port", "0",
               "--data-dir", data_dir]
    return command, dict(os.environ, PYTHONPATH=tree), tree


def run_once(tree: str, scenario: list[str], serve_args: list[str]) -> RunFigures:
    """One load-test run against a fresh server from ``tree``."""
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="ab-bench-")
    command, env, cwd = server_command(tree, port, data_dir)
    if not tree.startswith("peer:"):
        command += serve_args
    server = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        before, system_before = cpu_seconds(server.pid)
        command = [sys.executable, "-m", "kestrel_actors.loadtests", *scenario, "-p", str(port), "--no-progress"]
        load = subprocess.Popen(command, cwd=PACKAGE_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        placement = Placement(server.pid, load.pid)
        out, _ = load.communicate()
        same_cpu = placement.stop()
        after, system_after = cpu_seconds(server.pid)
        spent, system = after - before, system_after - system_before
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
    record = json.loads(out.strip().splitlines()[-1])
    if not record["ok"]:
        raise SystemExit(f"{tree}: the run failed its checks: {record}")
    handled = record["items"] + record.get("fill", {}).get("items", 0)
    return RunFigures(record["rate"], spent / handled * 1e6, system / handled * 1e6, same_cpu)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("scenario", help='The load test and its options, e.g. "flood -n 50000".')
    parser.add_argument("trees", nargs=2, help="Two source trees (directories holding kestrel_actors/), "
                        "each optionally DIR@PYTHON: its server on that interpreter; or peer:BINARY: "
                        "that binary with darner's command line.")
    parser.add_argument("serve_args", nargs="*", help="Extra ``serve`` options (after --).")
    args = parser.parse_args(argv)
    results: dict[str, list[RunFigures]] = {tree: [] for tree in args.trees}
    for round_number in range(args.rounds):
        order = args.trees if round_number % 2 == 0 else args.trees[::-1]
        for tree in order:
            run = run_once(tree, shlex.split(args.scenario), args.serve_args)
            results[tree].append(run)
            print(f"{tree}: {run.rate:,.0f}/s, server {run.cpu:.1f} µs per request ({run.system:.1f} system), "
                  f"same vCPU {_share(run.same_cpu)}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    for tree, runs in results.items():
        rates, cpus, systems = [r.rate for r in runs], [r.cpu for r in runs], [r.system for r in runs]
        shares = [r.same_cpu for r in runs if r.same_cpu is not None]
        print(f"{tree}: median {statistics.median(rates):,.0f}/s (best {max(rates):,.0f}); server "
              f"median {statistics.median(cpus):.1f} µs per request (least {min(cpus):.1f}), system "
              f"median {statistics.median(systems):.1f} (least {min(systems):.1f}), same vCPU median "
              f"{_share(statistics.median(shares) if shares else None)}")


if __name__ == "__main__":
    main()
