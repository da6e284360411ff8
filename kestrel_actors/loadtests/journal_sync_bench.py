"""Durable appends per second through FileJournal with many concurrent writers (not a test).

Each writer greenlet loops: append one ADDX record, wait for :meth:`after_durable`, repeat —
what a client doing SETs one at a time sees with ``sync_journal``. With ``always`` every
reply waits for an fdatasync, so throughput comes from group commit.

    .venv/bin/python -m kestrel_actors.loadtests.journal_sync_bench \
        [--writers 100] [--seconds 5] [--size 64] [--dir DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import gevent
import gevent.event
import structlog

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import FileJournal, Item


def bench(data_dir: str, sync: float | None, writers: int, seconds: float, size: int) -> dict:
    name = f"bench{sync}".replace(".", "_")
    journal = FileJournal(data_dir, name, QueueConfig(sync_journal=sync))
    payload = b"x" * size
    done = 0
    latencies: list[float] = []
    stop_at = time.monotonic() + seconds

    def writer() -> None:
        nonlocal done
        event = gevent.event.Event()
        while time.monotonic() < stop_at:
            event.clear()
            started = time.perf_counter()
            journal.add(Item(payload, 0))
            journal.after_durable(event.set)
            event.wait()
            latencies.append(time.perf_counter() - started)
            done += 1

    started = time.monotonic()
    gevent.joinall([gevent.spawn(writer) for _ in range(writers)])
    elapsed = time.monotonic() - started
    stats = {"sync": sync, "appends": done, "per_second": round(done / elapsed),
             "fsyncs": journal.writer.fsyncs, "writes": journal.writer.writes}
    latencies.sort()
    if latencies:
        stats["p50_ms"] = round(latencies[len(latencies) // 2] * 1000, 2)
        stats["p99_ms"] = round(latencies[int(len(latencies) * 0.99)] * 1000, 2)
    journal.erase()
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=64, help="item bytes")
    parser.add_argument("--dir", default=None,
                        help="data directory on the disk to measure (default: a new temp dir; check it is not tmpfs)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    data_dir = args.dir or tempfile.mkdtemp(prefix="journal-bench-")
    probe = os.path.join(data_dir, "probe")
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT)
    t = time.perf_counter()
    for _ in range(50):
        os.write(fd, b"x" * 32)
        os.fdatasync(fd)
    single = (time.perf_counter() - t) / 50
    os.close(fd)
    os.unlink(probe)
    print(f"one fdatasync on {data_dir}: {single * 1e3:.2f} ms (≈{1 / single:.0f} serial durable appends/s)")
    for sync in (0.0, 0.1, None):
        print(bench(data_dir, sync, args.writers, args.seconds, args.size))
    if args.dir is None:
        os.rmdir(data_dir)


if __name__ == "__main__":
    main()
