"""Read-behind with a real server process (behaviour §5.8, §6.6, §6.4).

A queue whose bytes reach ``max_memory_size`` keeps only about that much in memory; the rest
is read back from its journal as the head is consumed. These tests push far more than
``max_memory_size`` through one queue with one deeply pipelined producer (so the order is
known exactly), read everything back, and restart the server in the middle of the drain.

The 1 GiB test is marked ``slow``: it also samples the server's resident memory
(``/proc/<pid>/status`` VmRSS) every 0.5 s for the whole run.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from ..helpers import (
    Client,
    Pipeline,
    ServerProcess,
    assert_numbered,
    drain_pipelined,
    number_of,
    numbered,
    queue_files,
    read_rss_kib,
    stat,
    write_config,
)

KIB = 1024
MIB = 1024 * KIB
SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGKILL, id="SIGKILL")]


def check_memory(client: Client, queue: str, limit: int, item_size: int, unremoved: int = 0) -> dict[str, int]:
    """The queue's in-memory part is at most ``limit`` plus one item (behaviour §5.8), plus the
    ``unremoved`` items put back at the head since (they always go back into memory)."""
    stats = {k.removeprefix(f"queue_{queue}_"): int(v) for k, v in client.stats().items()
             if k.startswith(f"queue_{queue}_") and v.lstrip("-").isdigit()}
    assert stats["mem_bytes"] <= limit + (1 + unremoved) * item_size, stats
    assert stats["mem_items"] <= limit // item_size + 1 + unremoved, stats
    return stats


# -- a restart in the middle of a drain --------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("journal", ["1GiB", "4MiB"], ids=["no-packing", "packing"])
def test_restart_while_draining_a_read_behind_queue(make_server, tmp_path, sig, journal):
    """20 MiB of 1 KiB items through a 1 MiB queue, with two restarts during the drain.

    Every item comes back exactly once and in order, including two that were open at the
    first restart (back at the head, ascending xid order) and items added after it.
    With ``max_journal_size`` 4 MiB the rotations ask for checkpoints, so the files behind
    the reader are packed while it reads.
    """
    config = write_config(
        tmp_path, f'[queues.rb]\nmax_memory_size = "1MiB"\nmax_journal_size = "{journal}"\n')
    server = make_server("--config", config, "--max-open-transactions", "10")
    count = 20 * 1024
    pipe = Pipeline(server.host, server.port)
    pipe.set_all("rb", [numbered(i) for i in range(count)])
    client = server.client()
    stats = check_memory(client, "rb", MIB, KIB)
    assert stats["items"] == count
    assert stats["bytes"] == count * KIB
    assert stats["journal_rotations"] >= 15  # the current file rotates past 1 MiB (behaviour §6.6 c)

    assert_numbered(pipe.get_all("rb", 7000), range(7000), size=KIB)
    check_memory(client, "rb", MIB, KIB)
    reader = server.client()
    assert [number_of(reader.get("rb/open")) for _ in range(2)] == [7000, 7001]
    client.close()
    pipe.close()

    server.restart(sig)
    client = server.client()
    stats = check_memory(client, "rb", MIB, KIB, unremoved=2)  # replay keeps memory bounded too
    assert stats["items"] == count - 7000
    assert stats["bytes"] == (count - 7000) * KIB
    assert stats["open_transactions"] == 0
    pipe = Pipeline(server.host, server.port)
    pipe.set_all("rb", [numbered(i) for i in range(count, count + 1000)])
    assert_numbered(pipe.get_all("rb", 6000), range(7000, 13000), size=KIB)
    check_memory(client, "rb", MIB, KIB)  # the two back at the head are long gone
    client.close()
    pipe.close()

    server.restart(sig)
    assert_numbered(drain_pipelined(server, "rb"), range(13000, count + 1000), size=KIB)
    client = server.client()
    check_memory(client, "rb", MIB, KIB)
    assert stat(client, "rb", "bytes") == 0


def test_read_behind_items_come_back_after_a_crash_during_the_fill(make_server, tmp_path):
    """SIGKILL right after the SETs, while almost everything is only on disk: the replay
    reads it all back, and the queue leaves read-behind once drained."""
    config = write_config(tmp_path, '[queues.rb]\nmax_memory_size = "256KiB"\n')
    server = make_server("--config", config)
    pipe = Pipeline(server.host, server.port)
    pipe.set_all("rb", [numbered(i, 512) for i in range(8000)])
    pipe.close()
    server.kill()
    server.start()
    client = server.client()
    stats = check_memory(client, "rb", 256 * KIB, 512)
    assert stats["items"] == 8000
    assert_numbered(drain_pipelined(server, "rb"), range(8000), size=512)
    client.set("rb", b"after")  # out of read-behind: the new item is in memory
    stats = check_memory(client, "rb", 256 * KIB, 512)
    assert (stats["mem_items"], stats["items"]) == (1, 1)
    assert client.get("rb") == b"after"


def test_read_behind_refills_a_run_of_items_once_memory_is_an_eighth_below_the_limit(make_server, tmp_path):
    """Memory is refilled from the journal once it is 256 KiB (at most an eighth of
    ``max_memory_size``) below the limit, not after every removal (behaviour §5.8, Differs): a
    64 KiB queue of 1 KiB items stays at 63..56 items through eight GETs, and the ninth reads
    a run back up to 64. The items still come in order, and all of them."""
    config = write_config(tmp_path, '[queues.rb]\nmax_memory_size = "64KiB"\n')
    server = make_server("--config", config)
    pipe = Pipeline(server.host, server.port)
    pipe.set_all("rb", [numbered(i) for i in range(200)])
    client = server.client()
    assert stat(client, "rb", "mem_items") == 64
    got = []
    seen = []
    for _ in range(9):
        got.append(client.get("rb"))
        seen.append(stat(client, "rb", "mem_items"))
    assert seen == [63, 62, 61, 60, 59, 58, 57, 56, 64]
    got += drain_pipelined(server, "rb")
    assert_numbered(got, range(200))


# -- 1 GiB through a 16 MiB queue -------------------------------------------------------------


class Sampler:
    """Samples the server's VmRSS every ``period`` s and the queue's stats on the side."""

    def __init__(self, server: ServerProcess, queue: str, period: float = 0.5) -> None:
        assert server.proc is not None
        self.pid = server.proc.pid
        self.server = server
        self.queue = queue
        self.period = period
        self.rss_kib: list[tuple[float, int]] = []
        self.stats: list[tuple[float, int, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._rss, daemon=True),
                         threading.Thread(target=self._stats, daemon=True)]
        self._start = time.monotonic()
        for thread in self._threads:
            thread.start()

    def _rss(self) -> None:
        while not self._stop.is_set():
            try:
                self.rss_kib.append((time.monotonic() - self._start, read_rss_kib(self.pid)))
            except (OSError, RuntimeError) as exc:
                self.errors.append(f"rss: {exc!r}")
            self._stop.wait(self.period)

    def _stats(self) -> None:
        try:
            client = self.server.client(timeout=60)
            while not self._stop.is_set():
                stats = client.stats()
                mem = int(stats.get(f"queue_{self.queue}_mem_bytes", 0))
                total = int(stats.get(f"queue_{self.queue}_bytes", 0))
                self.stats.append((time.monotonic() - self._start, mem, total))
                self._stop.wait(self.period)
            client.close()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(f"stats: {exc!r}")

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(70)


@pytest.mark.slow
def test_one_gib_through_a_16_mib_queue_keeps_rss_bounded(make_server, tmp_path):
    """behaviour §5.8: 1 GiB of 1 KiB items through a queue with max_memory_size 16 MiB.

    The server's RSS must stay below 16 MiB + 100 MiB at every sample (set, get and all in
    between), ``mem_bytes`` at most 16 MiB plus one item while ``bytes`` reaches 1 GiB, and
    every item comes back once, in order.
    """
    config = write_config(tmp_path, '[queues.big]\nmax_memory_size = "16MiB"\n')
    server = make_server("--config", config)
    count = 1 << 20
    limit = 16 * MIB
    sampler = Sampler(server, "big")
    started = time.monotonic()
    try:
        pipe = Pipeline(server.host, server.port, timeout=120)
        pipe.stream_sets("big", (numbered(i) for i in range(count)), batch=512)
        pipe.expect_stored(count)
        pipe.wait_sent()
        set_seconds = time.monotonic() - started

        client = server.client(timeout=60)
        stats = check_memory(client, "big", limit, KIB)
        assert stats["items"] == count
        assert stats["bytes"] == count * KIB
        client.close()

        pipe.stream_gets("big", count + 1, batch=512)
        for i in range(count):
            data = pipe.read_value()
            if data != numbered(i):
                got = None if data is None else data[:20]
                raise AssertionError(f"GET {i}: expected item {i}, got {got!r}")
        assert pipe.read_value() is None
        pipe.wait_sent()
        pipe.close()
        get_seconds = time.monotonic() - started - set_seconds
        time.sleep(1.0)  # a last few samples with the queue empty
    finally:
        sampler.stop()
    print(f"\n1 GiB read-behind: sets {set_seconds:.1f} s, gets {get_seconds:.1f} s; "
          f"max RSS {max(r for _, r in sampler.rss_kib) / 1024:.1f} MiB over {len(sampler.rss_kib)} samples; "
          f"max mem_bytes {max(m for _, m, _ in sampler.stats) / MIB:.2f} MiB; "
          f"files now {queue_files(server.data_dir, 'big')}")

    assert not sampler.errors, sampler.errors
    assert len(sampler.rss_kib) >= (set_seconds + get_seconds) / sampler.period / 2
    over = [(round(t, 1), kib // 1024) for t, kib in sampler.rss_kib if kib * 1024 >= limit + 100 * MIB]
    assert not over, f"RSS (s, MiB) at or above 116 MiB: {over[:10]}"
    assert len(sampler.stats) >= 10
    assert max(total for _, _, total in sampler.stats) >= 3 * count * KIB // 4  # sampled near 1 GiB
    too_much = [(round(t, 1), mem) for t, mem, _ in sampler.stats if mem > limit + KIB]
    assert not too_much, f"mem_bytes above 16 MiB + 1 item: {too_much[:10]}"
    client = server.client()
    assert stat(client, "big", "items") == 0
