"""The backlog's age (issue 26, point 5): how long each queue's head item has waited, in memcache
``stats``, ``/stats.json`` and ``/metrics``. Kestrel's ``age`` dates the last item *read*, so a
backlog nobody reads shows 0 there; ``oldest_item_age`` is the figure to alert on."""

from __future__ import annotations

import re
import time

from ..helpers import get_json, request

WAITED = 0.8


def test_a_backlog_nobody_reads_shows_its_oldest_item_age_everywhere(admin_server):
    client = admin_server.client()
    for _ in range(3):
        assert client.set("backlog", b"old") == b"STORED"
    time.sleep(WAITED)
    started = time.monotonic()  # "new" is added after this: its age is at most the time since
    assert client.set("backlog", b"new") == b"STORED"

    stats = client.stats()
    # Kestrel's figure dates the last item read: none yet, so it is "since 1970", not the backlog
    assert int(stats["queue_backlog_age"]) > 10**12
    oldest = int(stats["queue_backlog_oldest_item_age"])
    assert WAITED * 1000 <= oldest < 30_000
    keys = [key for key in stats if key.startswith("queue_backlog_")]
    assert keys[-3:] == ["queue_backlog_journal_rotations", "queue_backlog_oldest_item_age",
                         "queue_backlog_journal_failing"]

    gauges = get_json(admin_server.admin_url + "/stats.json")["gauges"]
    assert oldest <= gauges["q/backlog/oldest_item_age_msec"] < 30_000

    metrics = request(admin_server.admin_url + "/metrics").body.decode()
    found = re.search(r'^kestrel_queue_oldest_item_age_seconds\{queue="backlog"\} (\S+)$', metrics, re.M)
    assert found, metrics[:2000]
    assert WAITED <= float(found.group(1)) < 30
    assert "# TYPE kestrel_queue_oldest_item_age_seconds gauge" in metrics

    for _ in range(3):  # the old items go: the head is now the one added after the wait
        assert client.get("backlog") == b"old"
    head_age = int(client.stats()["queue_backlog_oldest_item_age"])
    assert head_age <= (time.monotonic() - started) * 1000 + 5  # an old one would be WAITED older

    assert client.get("backlog") == b"new"
    assert client.stats()["queue_backlog_oldest_item_age"] == "0"  # empty
    assert get_json(admin_server.admin_url + "/stats.json")["gauges"]["q/backlog/oldest_item_age_msec"] == 0
