"""``make bench``: start a server, run the standard load tests, write docs/benchmarks.md.

    python -m loadtests.bench [--write docs/benchmarks.md] [--runs 5] [--quick] [--only NAME]

Each benchmark gets a fresh ``python -m kestrel_actors.cli serve`` on a free loopback port
with a temporary data directory, runs its scenario ``--runs`` times as a subprocess
(``python -m loadtests ... --no-progress``, so each run is exactly the command shown in the
table), and reports the median of each figure. Client and server share the machine, so the
figures are for the pair, not for the server alone.

With ``--write FILE`` the table replaces whatever is between ``<!-- bench:start -->`` and
``<!-- bench:end -->`` in FILE (the markers are appended if missing; other text is kept).
Exit code 1 if any run failed a correctness check (and, with ``--strict``, if a target was
missed); 3 if a server could not be started.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BENCHMARKS", "Benchmark", "main", "render", "splice"]

START, END = "<!-- bench:start -->", "<!-- bench:end -->"


@dataclass(frozen=True)
class Benchmark:
    """One row of the table: a scenario command line, the server flags and the target."""

    name: str
    args: tuple[str, ...]
    target: float | None          # minimum median rate (items/s), None = report only
    unit: str
    serve_args: tuple[str, ...] = ()
    requires: str | None = None   # a ``serve`` option the server must offer, else skipped
    quick_args: tuple[str, ...] = ()  # replaces -n for --quick


BENCHMARKS = (
    Benchmark("put-many, 100 clients, 1 in flight", ("put-many", "-c", "100", "-n", "100000"),
              30_000, "SET/s", quick_args=("-n", "10000")),
    Benchmark("put-many, 10 clients, rollup 32", ("put-many", "-c", "10", "-r", "32", "-n", "320000"),
              100_000, "SET/s", quick_args=("-n", "32000")),
    Benchmark("get-many, 100 clients, 1 in flight", ("get-many", "-c", "100", "-n", "100000"),
              50_000, "GET/s", quick_args=("-n", "10000")),
    Benchmark("many-clients, 500 transactional consumers, 10% kills",
              ("many-clients", "-c", "500", "-n", "50000", "-s", "0", "-k", "10", "-x", "-r", "16"),
              15_000, "items/s", quick_args=("-n", "5000")),
    Benchmark("flood, 1 producer / 1 consumer", ("flood", "-n", "50000"), 12_000, "items/s",
              quick_args=("-n", "5000")),
    Benchmark("durable put-many (fsync every write), 100 clients",
              ("put-many", "-c", "100", "-n", "20000"), 20_000, "SET/s",
              serve_args=("--sync-journal", "always"), requires="--sync-journal",
              quick_args=("-n", "2000")),
)


@dataclass
class Row:
    bench: Benchmark
    command: str
    records: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: str | None = None

    def median(self, key: str, sub: str | None = None) -> float:
        values = [(r[key][sub] if sub else r[key]) for r in self.records]
        return statistics.median(values) if values else 0.0

    def client_busy(self) -> float:
        """Median client CPU time over the headline run, in % of one core."""
        values = [100.0 * r.get("client_cpu_seconds", 0.0) / r["wall_seconds"]
                  for r in self.records if r.get("wall_seconds")]
        return statistics.median(values) if values else 0.0

    @property
    def met(self) -> bool | None:
        if self.bench.target is None or not self.records:
            return None
        return self.median("rate") >= self.bench.target and not self.failures


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_help() -> str:
    return subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "serve", "--help"],
                          capture_output=True, text=True, timeout=60).stdout


class Server:
    """A ``kestrel-actors serve`` subprocess on a free port with a temporary data directory."""

    def __init__(self, extra: tuple[str, ...]) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="kestrel-bench-")
        self.port = free_port()
        self.log = Path(self.tmp.name) / "server.log"
        command = [sys.executable, "-m", "kestrel_actors.cli", "serve", "--text-port", "0", "--admin-port", "0",
                   "--host", "127.0.0.1",
                   "--port", str(self.port), "--data-dir", str(Path(self.tmp.name) / "data"),
                   "--log-level", "warning", *extra]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server did not listen within 30 s: {self.tail()}")

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def delete(self, queue: str) -> None:
        """Drop a queue (and its journal) between runs, so runs start alike."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            sock.sendall(b"delete %s\r\n" % queue.encode())
            sock.recv(64)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.tmp.cleanup()


def run_bench(bench: Benchmark, runs: int, quick: bool, procs: int, help_text: str) -> Row:
    args = list(bench.args)
    if quick and bench.quick_args:
        i = args.index(bench.quick_args[0])
        args[i + 1] = bench.quick_args[1]
    if procs > 1:
        args += ["--procs", str(procs)]
    row = Row(bench, "python -m loadtests " + " ".join(args))
    if bench.requires and bench.requires not in help_text:
        row.skipped = f"server has no {bench.requires} option"
        return row
    try:
        server = Server(bench.serve_args)
    except RuntimeError as exc:
        row.skipped = f"server did not start with {' '.join(bench.serve_args)}: {exc}"[:300]
        return row
    try:
        for number in range(runs):
            command = [sys.executable, "-m", "loadtests", *args, "-p", str(server.port),
                       "--no-progress", "--timeout", "900"]
            proc = subprocess.run(command, capture_output=True, text=True, timeout=1000)
            lines = proc.stdout.strip().splitlines()
            try:
                record = json.loads(lines[-1])
            except (IndexError, ValueError):
                record = None
            if proc.returncode != 0 or record is None:
                row.failures.append(f"run {number + 1}: exit {proc.returncode}: "
                                    f"{(proc.stderr or proc.stdout)[-500:]}")
            if record is not None and proc.returncode == 0:
                row.records.append(record)
            print(f"  run {number + 1}: exit {proc.returncode}, "
                  f"{record['rate'] if record else '?'} {bench.unit}", flush=True)
            server.delete("spam")
    finally:
        server.stop()
    return row


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def render(rows: list[Row], runs: int, load: float | None = None) -> str:
    """The markdown that goes between the markers (``load``: 1-min load average at start)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    busy = f" Load average before the runs: {load:.2f} (other work on the machine skews figures)." \
        if load is not None else ""
    out = [
        f"Measured {now} on {machine()}; commit {git_commit()}.{busy}",
        f"Client and server share the machine. Median of {runs} runs each; all items 1 KiB "
        "(many-clients: 751 bytes, Kestrel's lyric size). Latencies in microseconds, per request "
        "(per burst for rollups). Produced by `make bench` (`python -m loadtests.bench`).",
        "",
        "\"Client CPU\" is the load generator's CPU time over the timed run, in % of one core: "
        "near 100% × processes would mean the client, not the server, set the pace.",
        "",
        "| Benchmark | Median rate | Runs (min–max) | Target | Met | p50 | p99 | Lost / dup | Client CPU | Command |",
        "|---|---:|---:|---:|:---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        bench = row.bench
        target = f"≥ {bench.target:,.0f}" if bench.target else "—"
        if row.skipped:
            out.append(f"| {bench.name} | skipped | | {target} | — | | | | | {row.skipped} |")
            continue
        if not row.records:
            out.append(f"| {bench.name} | failed | | {target} | no | | | | | `{row.command}` |")
            continue
        met = {True: "yes", False: "no", None: "—"}[row.met]
        lost = sum(r["lost"] for r in row.records)
        dup = sum(r["duplicated"] for r in row.records)
        rates = [r["rate"] for r in row.records]
        out.append(
            f"| {bench.name} | {row.median('rate'):,.0f} {bench.unit} | {min(rates):,.0f}–{max(rates):,.0f} "
            f"| {target} | {met} "
            f"| {row.median('latency_usec', 'p50'):,.0f} | {row.median('latency_usec', 'p99'):,.0f} "
            f"| {lost} / {dup} | {row.client_busy():.0f}% | `{row.command}` |")
    failures = [f"* {row.bench.name}: {f}" for row in rows for f in row.failures]
    if failures:
        out += ["", "Failed runs:", "", *failures]
    return "\n".join(out)


_HEADER = """# Benchmarks

Throughput of kestrel-actors under the load tests in `loadtests/` (Kestrel's
`src/scripts/load` tools, re-done in Python with gevent, plus `get-many`).

* `make bench` (or `.venv/bin/python -m loadtests.bench --write docs/benchmarks.md`) starts
  a fresh server per benchmark on a free loopback port, runs each scenario five times and
  rewrites the table below. `--quick` runs 10x fewer items; `--only WORD` picks benchmarks.
* One scenario by hand, against a running server:
  `.venv/bin/python -m loadtests put-many -c 100 -n 100000 -p 22133` (or
  `kestrel-actors load put-many ...`); `--help` on each scenario lists Kestrel's option
  letters. Every scenario prints Kestrel's report lines and then one JSON line of figures,
  and exits 1 on a correctness failure (lost, duplicated, reordered or corrupted items, an
  unexpected reply).
"""


def splice(text: str, table: str) -> str:
    """Put ``table`` between the markers of ``text`` (appending the markers if missing)."""
    block = f"{START}\n{table}\n{END}"
    if START in text and END in text and text.index(START) < text.index(END):
        head, rest = text.split(START, 1)
        return head + block + rest.split(END, 1)[1]
    if not text.strip():
        text = _HEADER
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--write", metavar="FILE", help="update the table in this markdown file")
    parser.add_argument("--runs", type=int, default=5, help="runs per benchmark (default 5)")
    parser.add_argument("--quick", action="store_true", help="10x fewer items, for a smoke test")
    parser.add_argument("--procs", type=int, default=1, help="client processes per run")
    parser.add_argument("--only", action="append", default=[],
                        help="run only benchmarks whose name contains this (repeatable)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target is missed")
    opts = parser.parse_args(argv)
    help_text = serve_help()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    rows = []
    for bench in BENCHMARKS:
        if opts.only and not any(word in bench.name for word in opts.only):
            continue
        print(f"{bench.name}:", flush=True)
        row = run_bench(bench, max(1, opts.runs), opts.quick, opts.procs, help_text)
        if row.skipped:
            print(f"  skipped: {row.skipped}", flush=True)
        rows.append(row)
    table = render(rows, max(1, opts.runs), load)
    print()
    print(table)
    if opts.write:
        path = Path(opts.write)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(splice(path.read_text() if path.exists() else "", table))
        print(f"\nwrote {path}")
    if any(row.failures for row in rows):
        return 1
    if opts.strict and any(row.met is False for row in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
