"""Kestrel's journal metrics over HTTP, against a real server after known traffic: the fsync
figures (``PeriodicSyncStorage``), rotation, rewrite and read-behind times (``PersistentQueue``),
and ``finished_but_add`` (``KestrelHandler``)."""

from __future__ import annotations

import socket
import struct
import time

from prometheus_client.parser import text_string_to_metric_families

from kestrel_actors.stats import QUEUE_METRICS, SERVER_METRICS

from ..helpers import get_json, request
from .test_endpoints import DISTRIBUTION_KEYS, wait_for


def stats_of(server) -> dict:
    return get_json(server.admin_url + "/stats.json")


def start_with(make_admin_server, tmp_path, toml: str):
    config = tmp_path / "kestrel.toml"
    config.write_text(toml)
    return make_admin_server("--config", str(config))


def test_every_new_name_is_listed_with_ostrichs_shape(admin_server):
    client = admin_server.client()
    assert client.set("shape", b"x") == b"STORED"
    metrics = stats_of(admin_server)["metrics"]
    for name in SERVER_METRICS:
        assert set(metrics[name]) == DISTRIBUTION_KEYS, name
    for name in QUEUE_METRICS:
        assert set(metrics[f"q/shape/{name}"]) == DISTRIBUTION_KEYS, name
    assert stats_of(admin_server)["counters"]["finished_but_add"] == 0


def test_sync_always_and_periodic_time_their_fsyncs_and_never_adds_none(make_admin_server, tmp_path):
    server = start_with(make_admin_server, tmp_path, """
        [queues.synced]
        sync_journal = 0
        [queues.periodic]
        sync_journal = "50ms"
    """)
    client = server.client()
    before = stats_of(server)["metrics"]
    for data in (b"one", b"two", b"three"):
        assert client.set("unsynced", data) == b"STORED"  # the default: never fsync
    after_never = stats_of(server)["metrics"]
    assert after_never["fsync_delay_usec"]["count"] == before["fsync_delay_usec"]["count"]
    assert after_never["item_fsync_delay_usec"]["count"] == before["item_fsync_delay_usec"]["count"]

    for data in (b"one", b"two", b"three"):
        assert client.set("synced", data) == b"STORED"  # one at a time: an fdatasync each
    metrics = stats_of(server)["metrics"]
    fsyncs = metrics["fsync_delay_usec"]
    assert fsyncs["count"] - after_never["fsync_delay_usec"]["count"] >= 3
    assert fsyncs["maximum"] > 0 and fsyncs["sum"] > 0
    # each SET's record waited for its fdatasync (period 0: the whole wait is "behind")
    assert metrics["item_fsync_delay_usec"]["count"] - after_never["item_fsync_delay_usec"]["count"] >= 3

    synced_fsyncs = metrics["fsync_delay_usec"]["count"]
    waited = metrics["item_fsync_delay_usec"]["count"]
    for data in (b"a", b"b", b"c", b"d"):
        assert client.set("periodic", data) == b"STORED"  # answered before the fdatasync
    later = wait_for(lambda: (m := stats_of(server)["metrics"])["fsync_delay_usec"]["count"] > synced_fsyncs and m,
                     what="the periodic fdatasync")
    # the four records were covered by the timer's fdatasync(s): each counted once, its wait
    # beyond the 50 ms period small
    later = wait_for(lambda: (m := stats_of(server)["metrics"])["item_fsync_delay_usec"]["count"] >= waited + 4
                     and m, what="the periodic writes' delays")
    assert later["item_fsync_delay_usec"]["count"] == waited + 4

    families = {f.name: f for f in text_string_to_metric_families(request(server.admin_url + "/metrics").body.decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert families["kestrel_fsync_delay_seconds"].type == "histogram"
    assert samples[("kestrel_fsync_delay_seconds_count", ())] >= synced_fsyncs
    assert samples[("kestrel_item_fsync_delay_seconds_count", ())] >= waited + 4
    assert families["kestrel_fsync_error"].type == "counter"  # no failure: an empty family


def test_rotation_and_read_behind_are_timed(make_admin_server, tmp_path):
    """A 1 KiB ``max_memory_size``: the journal rotates past 1 KiB, the queue drops to
    read-behind, and each GET refills memory from the files."""
    server = start_with(make_admin_server, tmp_path, """
        [queues.small]
        max_memory_size = "1KiB"
    """)
    client = server.client()
    items = [b"%03d" % n + b"x" * 300 for n in range(12)]
    for data in items:
        assert client.set("small", data) == b"STORED"
    stats = stats_of(server)
    rotations = stats["counters"]["q/small/journal_rotations"]
    assert rotations > 0
    assert stats["metrics"]["q/small/journal_rotation_usec"]["count"] == rotations
    assert stats["metrics"]["q/small/journal_rotation_usec"]["sum"] > 0
    assert stats["gauges"]["q/small/mem_items"] < len(items)  # some only on disk
    assert stats["metrics"]["q/small/fill_readbehind_usec"]["count"] == 0
    assert [client.get("small") for _ in items] == items
    fills = stats_of(server)["metrics"]["q/small/fill_readbehind_usec"]
    assert fills["count"] > 0 and fills["sum"] > 0
    # a queue that never went to read-behind records no fill
    assert client.set("roomy", b"x") == b"STORED" and client.get("roomy") == b"x"
    assert stats_of(server)["metrics"]["q/roomy/fill_readbehind_usec"]["count"] == 0


def test_rewrite_is_timed(make_admin_server, tmp_path):
    """A 1 KiB ``default_journal_size``: once the queue is empty and its journal past that,
    Kestrel rewrites it."""
    server = start_with(make_admin_server, tmp_path, """
        [queues.compact]
        default_journal_size = "1KiB"
    """)
    client = server.client()
    for _ in range(6):
        assert client.set("compact", b"y" * 300) == b"STORED"
        assert client.get("compact") == b"y" * 300
    stats = wait_for(lambda: (s := stats_of(server))["counters"]["q/compact/journal_rewrites"] > 0 and s,
                     what="a rewrite")
    rewrites = stats["counters"]["q/compact/journal_rewrites"]
    assert stats["metrics"]["q/compact/journal_rewrite_usec"]["count"] == rewrites
    assert stats["metrics"]["q/compact/journal_rewrite_usec"]["sum"] > 0


def test_open_reads_that_reach_a_client_gone_count_finished_but_add(make_admin_server, tmp_path):
    """A client sends an opening GET and resets the connection. With ``sync_journal = 0`` the
    queue's answer waits for the fdatasync of the open read's record, and a reset that comes
    meanwhile tells the server that the client has gone: the item opened for it is given back as
    soon as the answer arrives. Kestrel counted these as ``finished_but_add`` and aborted them.
    (A half-close is not a hang-up: what was read before it is answered.) The reset must land
    inside the fdatasync, so the clients try with a few delays until one has."""
    server = start_with(make_admin_server, tmp_path, """
        [queues.gone]
        sync_journal = 0
    """)
    client = server.client()
    tries = 200
    for n in range(tries):
        assert client.set("gone", b"%d" % n) == b"STORED"
    url = server.admin_url + "/stats.json"
    for n in range(tries):
        with socket.create_connection((server.host, server.port)) as sock:
            sock.sendall(b"get gone/open\r\n")
            time.sleep((0.0, 0.0005, 0.001, 0.002)[n % 4])
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
        if n % 4 == 3 and get_json(url)["counters"].get("finished_but_add", 0) > 0:
            break
    stats = wait_for(lambda: (s := get_json(url))["gauges"]["connections"] == 1
                     and s["gauges"]["q/gone/open_transactions"] == 0 and s, what="the hang-ups")
    counters = stats["counters"]
    assert stats["gauges"]["q/gone/items"] == tries  # every item came back: none was lost
    assert counters["finished_but_add"] > 0
    # each open read was given back on arrival (finished_but_add) or at the hang-up
    assert counters["finished_but_add"] + counters["cmd_get_open_dropped"] == counters["q/gone/transactions"]
