"""Spark bridge throughput: items/s from a full queue through a trivial job (``jobs:count``).

``python -m kestrel_actors.loadtests.spark_bridge_bench [--items 100000] [--item-bytes 1024] [--master local[2]]``

The queue is filled first (pipelined SETs), Spark is started and warmed up on a separate queue
(the first job of a session pays for starting the Python workers), then one bridge drains the
queue with ``--batch-size`` batches and no output destination. The figure is items divided by
the time the bridge spent in batches (fetch + job + confirm, summed); the wall time also
counts the final empty ``--batch-wait`` that ends the run. Prints report lines, then one JSON
line with the figures, like the other load tests.

By default a server is started on a free loopback port with a temporary data directory;
``--server host:port`` uses a running one instead (its queue ``bench_bridge`` is flushed).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

QUEUE = "bench_bridge"
WARM_QUEUE = "bench_bridge_warm"


@contextmanager
def _server(address: str | None, serve_args: tuple[str, ...] = ()):
    """Yield ``host:port`` of a server: the given one, or a fresh subprocess (``serve_args``
    appended to its ``serve`` command line)."""
    if address:
        yield address
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bridge-bench-") as tmp:
        log = open(Path(tmp) / "server.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "kestrel_actors.cli", "serve", "--text-port", "0", "--admin-port", "0",
             "--thrift-port", "0", "--host", "127.0.0.1",
             "--port", str(port), "--data-dir", str(Path(tmp) / "data"), "--log-level", "warning",
             *serve_args],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise click.ClickException("the server did not start") from None
                    time.sleep(0.05)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(15)
            log.close()


def _fill(client, queue: str, count: int, size: int) -> float:
    body = os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")
    started = time.perf_counter()
    sent = 0
    while sent < count:
        chunk = min(10_000, count - sent)
        client.put_many(queue, [b"%08d" % (sent + i) + body[8:] for i in range(chunk)])
        sent += chunk
    return time.perf_counter() - started


def fill_queues(client, queue: str, warm_queue: str, items: int, warm_items: int, size: int) -> float:
    """Empty ``queue`` and ``warm_queue`` (creating them), fill them, and say so; returns the
    seconds ``queue``'s fill took."""
    for name in (queue, warm_queue):
        client.get(name)  # create it
        client.flush(name)
    seconds = _fill(client, queue, items, size)
    _fill(client, warm_queue, warm_items, size)
    click.echo(f"filled {items:,} items of {size} B in {seconds:.2f}s ({items / seconds:,.0f} sets/s)")
    return seconds


@click.command(context_settings={"max_content_width": 100})
@click.option("--items", default=100_000, show_default=True, type=click.IntRange(min=1))
@click.option("--item-bytes", default=1024, show_default=True, type=click.IntRange(min=8))
@click.option("--batch-size", default=10_000, show_default=True, type=click.IntRange(min=1))
@click.option("--partitions", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--master", default="local[2]", show_default=True)
@click.option("--server", "address", default=None, help="host:port of a running server.")
@click.option("--target", default=20_000, show_default=True, type=int,
              help="items/s the run must reach for exit code 0.")
def main(items, item_bytes, batch_size, partitions, master, address, target) -> None:
    """Measure the Spark bridge's items/s on a trivial job."""
    import logging

    from kestrel_actors.client import Client, ServerAddress
    from kestrel_actors.logs import configure_logging
    from kestrel_actors.spark_bridge import BridgeConfig, create_spark_session, run_bridge

    configure_logging("console", "warning")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with _server(address) as where, tempfile.TemporaryDirectory(prefix="bridge-state-") as state:
        server = ServerAddress.parse(where)
        with Client(server) as client:
            fill_queues(client, QUEUE, WARM_QUEUE, items, min(batch_size, items), item_bytes)

        started = time.perf_counter()
        spark = create_spark_session(master, {}, "kestrel-bridge-bench", partitions)
        click.echo(f"spark {master} started in {time.perf_counter() - started:.1f}s")
        try:
            common: dict[str, Any] = {
                "job": "kestrel_actors.spark_bridge.jobs:count", "servers": (server,), "batch_size": batch_size,
                "batch_wait": 1.0, "partitions": partitions, "state_dir": state, "until_empty": True, "max_failures": 3}
            run_bridge(BridgeConfig(queue=WARM_QUEUE, **common), spark=spark)
            wall_started = time.perf_counter()
            report = run_bridge(BridgeConfig(queue=QUEUE, **common), spark=spark)
            wall = time.perf_counter() - wall_started
        finally:
            spark.stop()

    busy = sum(r.total_seconds for r in report.results)
    figures = {
        "scenario": "spark_bridge",
        "master": master,
        "items": report.items,
        "item_bytes": item_bytes,
        "batch_size": batch_size,
        "partitions": partitions,
        "batches": report.batches,
        "failures": report.failures,
        "busy_seconds": round(busy, 3),
        "wall_seconds": round(wall, 3),
        "items_per_second": round(report.items / busy) if busy else 0,
        "fetch_seconds": round(sum(r.fetch_seconds for r in report.results), 3),
        "job_seconds": round(sum(r.job_seconds for r in report.results), 3),
        "commit_seconds": round(sum(r.commit_seconds for r in report.results), 3),
        "confirm_seconds": round(sum(r.confirm_seconds for r in report.results), 3),
    }
    click.echo(f"bridge: {report.items:,} items in {report.batches} batches, "
               f"{busy:.2f}s busy ({figures['items_per_second']:,} items/s), "
               f"{wall:.2f}s wall including the final empty wait")
    click.echo(json.dumps(figures))
    if report.items != items or not report.ok:
        sys.exit(1)
    sys.exit(0 if figures["items_per_second"] >= target else 2)


if __name__ == "__main__":
    main()
