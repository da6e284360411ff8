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
the server's dependencies) instead of this one: two interpreters, one source (ADR 0017).
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

from .bench import cpu_seconds, free_port

__all__ = ["main"]

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds ``kestrel_actors``: the load itself runs from there, with this code."""


def run_once(tree: str, scenario: list[str], serve_args: list[str]) -> tuple[float, float, float]:
    """One load-test run against a fresh server from ``tree``: (rate, server µs per request,
    of which system µs)."""
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="ab-bench-")
    tree, _, python = tree.partition("@")
    env = dict(os.environ, PYTHONPATH=tree)
    server = subprocess.Popen(
        [python or sys.executable, "-m", "kestrel_actors.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", data_dir, *serve_args],
        env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        before, system_before = cpu_seconds(server.pid)
        command = [sys.executable, "-m", "kestrel_actors.loadtests", *scenario, "-p", str(port), "--no-progress"]
        out = subprocess.run(command, cwd=PACKAGE_ROOT, capture_output=True, text=True, check=False).stdout
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
    return record["rate"], spent / handled * 1e6, system / handled * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("scenario", help='The load test and its options, e.g. "flood -n 50000".')
    parser.add_argument("trees", nargs=2, help="Two source trees (directories holding kestrel_actors/), "
                        "each optionally DIR@PYTHON: its server on that interpreter.")
    parser.add_argument("serve_args", nargs="*", help="Extra ``serve`` options (after --).")
    args = parser.parse_args(argv)
    results: dict[str, list[tuple[float, float, float]]] = {tree: [] for tree in args.trees}
    for round_number in range(args.rounds):
        order = args.trees if round_number % 2 == 0 else args.trees[::-1]
        for tree in order:
            rate, cpu, system = run_once(tree, shlex.split(args.scenario), args.serve_args)
            results[tree].append((rate, cpu, system))
            print(f"{tree}: {rate:,.0f}/s, server {cpu:.1f} µs per request ({system:.1f} system)",
                  flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    for tree, runs in results.items():
        rates, cpus, systems = [r for r, _, _ in runs], [c for _, c, _ in runs], [s for _, _, s in runs]
        print(f"{tree}: median {statistics.median(rates):,.0f}/s (best {max(rates):,.0f}); server "
              f"median {statistics.median(cpus):.1f} µs per request (least {min(cpus):.1f}), system "
              f"median {statistics.median(systems):.1f} (least {min(systems):.1f})")


if __name__ == "__main__":
    main()
