"""The `kestrel` source's planner work per item, without Spark or a server (ADR 0022).

What the planner does with a micro-batch once the server has answered: each connection's
``monitor`` reply (stamped ``VALUE`` blocks) received by the client's own code
(``Connection.read_packed_values``, from a socket stand-in whose ``recv`` returns the reply's
next piece, as the kernel's copy would) and scanned (:class:`~kestrel_actors.client.ValueScan`),
the batch's write-ahead file staged
(written, checksummed by slices, ``fsync``) and published, its buffers back in the pool once
its file is written (as the source's planner gives them back, ADR 0022), and the batch before
removed at its commit (its file kept as a spare to write a later batch over).
Prints CPU µs and minor page faults per item over the batches after the first two, and which
``kestrel_actors`` ran (so that runs of two checkouts can be alternated with ``PYTHONPATH``)::

    python -m kestrel_actors.loadtests.planner_bench --batches 8
"""

from __future__ import annotations

import resource
import tempfile
import time

import click

import kestrel_actors
from kestrel_actors.client import PackedValues
from kestrel_actors.client._connection import Connection
from kestrel_actors.client._scan import COMPILED
from kestrel_actors.spark_bridge._wal import BatchPart, WriteAheadLog

try:
    from kestrel_actors.spark_bridge._buffers import BufferPool
except ImportError:  # a checkout before the pool: every batch gets fresh buffers
    BufferPool = None  # type: ignore[assignment,misc]

_WARM_BATCHES = 2


def monitor_reply(queue: str, count: int, item_bytes: int, first_stamp: int,
                  per_millisecond: int) -> bytes:
    """A whole stamped ``monitor`` reply of ``count`` items, ``per_millisecond`` enqueued in
    each millisecond (a bulk put shares its stamps)."""
    value = b"x" * item_bytes
    blocks = [b"VALUE %s 0 %d %d\r\n%s\r\nEND\r\n" % (queue.encode(), item_bytes,
                                                     first_stamp + i // per_millisecond, value)
              for i in range(count)]
    return b"".join(blocks) + b"END\r\n"


class _Replay:
    """A connected socket's stand-in: ``recv`` returns the reply's next piece."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.at = 0

    def recv(self, size: int) -> bytes:
        piece = self.reply[self.at:self.at + size]
        self.at += len(piece)
        return piece


def receive(reply: bytes, queue: str, limit: int, into: bytearray | None) -> PackedValues:
    """``reply`` received and scanned by the client's code (client/_connection.py)."""
    wire = Connection("127.0.0.1", 0)
    wire.sock = _Replay(reply)
    values = wire.read_packed_values(queue.encode(), limit, stamped=True, into=into)
    assert wire.sock.at == len(reply) and not wire.buf
    return values


@click.command()
@click.option("--batches", default=8, show_default=True, type=click.IntRange(_WARM_BATCHES + 1))
@click.option("--items", default=50_000, show_default=True, help="items per batch")
@click.option("--item-bytes", default=1024, show_default=True)
@click.option("--items-per-connection", default=10_000, show_default=True)
@click.option("--items-per-partition", default=12_500, show_default=True)
@click.option("--per-millisecond", default=10, show_default=True,
              help="items sharing an enqueue millisecond")
@click.option("--pool/--no-pool", default=True, show_default=True,
              help="reuse committed batches' buffers (where the checkout has the pool)")
def main(batches: int, items: int, item_bytes: int, items_per_connection: int,
         items_per_partition: int, per_millisecond: int, pool: bool) -> None:
    connections = -(-items // items_per_connection)
    replies = [monitor_reply("bench", min(items_per_connection, items - n * items_per_connection),
                             item_bytes, 1_790_000_000_000 + n * 1000, per_millisecond)
               for n in range(connections)]
    buffers = BufferPool(connections) if pool and BufferPool is not None else None
    with tempfile.TemporaryDirectory(prefix="planner-bench-") as directory:
        wal = WriteAheadLog(directory)
        cpu = faults = 0.0
        measured = 0
        for seq in range(1, batches + 1):
            cpu_before = time.process_time()
            faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            parts, held = [], []
            for n, reply in enumerate(replies):
                into = buffers.take() if buffers is not None else None
                values = receive(reply, "bench", items_per_connection, into)
                parts.append(BatchPart(f"127.0.0.1:{22133 + n}", time.time(),
                                       values.stamps_or(0), "bench"))
                if into is not None:
                    held.append(into)
            wal.publish(wal.prepare(seq, parts, items_per_partition))
            del parts, values
            if buffers is not None:  # the batch is in its file: its buffers take the next's
                buffers.give_back(held)
            if seq > 1:  # the batch before it is committed while this one runs
                wal.remove(seq - 1)
            if seq > _WARM_BATCHES:
                cpu += time.process_time() - cpu_before
                faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
                measured += items
    pooled = "pool" if buffers is not None else "fresh buffers"
    click.echo(f"{kestrel_actors.__file__} compiled_scan={COMPILED} {pooled}: "
               f"{cpu / measured * 1e6:.2f} µs CPU and {faults / measured:.3f} minor faults per "
               f"item ({measured} items of {item_bytes} B, {connections} connections a batch)")


if __name__ == "__main__":
    main()
