"""The admin port's read endpoints over HTTP, against a real server after known traffic."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..helpers import act_json, get_json, request, stats_of, write_config

DISTRIBUTION_KEYS = {"count", "sum", "average", "minimum", "maximum", "p50", "p90", "p95", "p99", "p999", "p9999"}


def wait_for(predicate, timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def known_traffic(server):
    """3 SETs to jobs, a hit, an open read left open, a peek, a miss on empty, a blocking GET
    parked on idle (its client stays), a monitor; returns the clients to keep them open."""
    client = server.client()
    for data in (b"alpha", b"bravo", b"charl"):
        assert client.set("jobs", data) == b"STORED"
    assert client.get("jobs") == b"alpha"
    assert client.get("jobs/open") == b"bravo"
    assert client.get("jobs/peek") == b"charl"
    assert client.get("empty") is None
    waiter = server.client()
    waiter.send(b"get idle/t=10000\r\n")
    monitor = server.client()
    monitor.send(b"monitor jobs 1 1\r\n")
    assert monitor.read_value() == b"charl"
    return client, waiter, monitor


def test_ping(admin_server):
    assert get_json(admin_server.admin_url + "/ping") == {"response": "pong"}
    assert get_json(admin_server.admin_url + "/ping.json") == {"response": "pong"}
    reply = request(admin_server.admin_url + "/ping.txt")
    assert (reply.status, reply.body) == (200, b"response: pong\n")


def test_stats_json_has_kestrels_names_after_known_traffic(admin_server):
    clients = known_traffic(admin_server)
    url = admin_server.admin_url + "/stats.json"
    stats = wait_for(lambda: (s := get_json(url))["gauges"].get("q/idle/waiters") == 1 and s, what="a waiter")
    assert set(stats) == {"counters", "gauges", "labels", "metrics"}
    counters, gauges, metrics = stats["counters"], stats["gauges"], stats["metrics"]
    assert counters["cmd_set"] == 3
    assert counters["total_items"] == 3
    assert counters["cmd_peek"] == 1
    assert counters["cmd_get"] == 4  # the hit, the open read, the miss, the waiting GET
    assert counters["get_hits"] == 4  # with the peek and the monitor's item
    assert counters["get_misses"] == 1
    assert counters["cmd_monitor"] == 1
    assert counters["cmd_monitor_get"] >= 1
    assert counters["q/jobs/total_items"] == counters["q/jobs/put_items"] == 3
    assert counters["q/jobs/put_bytes"] == 15
    assert counters["q/jobs/get_items_hit"] == 4
    assert counters["q/empty/get_items_miss"] == 1
    assert counters["q/jobs/transactions"] == 2  # the open read and the monitor's
    assert gauges["q/jobs/items"] == 0
    assert gauges["q/jobs/open_transactions"] == 2
    assert gauges["q/idle/waiters"] == 1
    assert gauges["q/jobs/journal_size"] > 0
    assert gauges["q/jobs/create_time"] == pytest.approx(time.time(), abs=60)
    assert gauges["q/jobs/max_items"] == 2**31 - 1
    assert gauges["connections"] == 3
    assert gauges["status/readable"] == gauges["status/writeable"] == 1
    assert "q/jobs/age_msec" in gauges and "q/jobs/mem_bytes" in gauges
    assert stats["labels"]["status"] == "Up"
    assert stats["labels"]["version"]
    for name in ("set_latency_usec", "get_hit_latency_usec", "get_miss_latency_usec", "delivery_latency_msec",
                 "q/jobs/set_latency_usec", "q/jobs/delivery_latency_msec", "q/empty/get_miss_latency_usec"):
        assert set(metrics[name]) == DISTRIBUTION_KEYS, name
    assert metrics["set_latency_usec"]["count"] == metrics["q/jobs/set_latency_usec"]["count"] == 3
    assert metrics["get_hit_latency_usec"]["count"] == 3  # GET, open, peek; the monitor's is not timed
    assert metrics["get_miss_latency_usec"]["count"] == 1
    assert metrics["delivery_latency_msec"]["count"] == 3  # a peek delivers nothing
    set_latency = metrics["set_latency_usec"]
    assert 0 < set_latency["minimum"] <= set_latency["p50"] <= set_latency["maximum"]
    for client in clients:
        client.close()


def test_hang_ups_count_aborted_waiters_and_dropped_open_reads(admin_server):
    client = admin_server.client()
    client.set("hang", b"x")
    assert client.get("hang/open") == b"x"
    waiter = admin_server.client()
    waiter.send(b"get idle/t=10000\r\n")
    url = admin_server.admin_url + "/stats.json"
    wait_for(lambda: get_json(url)["gauges"].get("q/idle/waiters") == 1, what="a waiter")
    client.close()
    waiter.close()
    counters = wait_for(lambda: (c := get_json(url)["counters"])["waiters_aborted"] == 1 and c, what="the hang-up")
    assert counters["cmd_get_timeout_dropped"] == 1
    wait_for(lambda: get_json(url)["counters"]["cmd_get_open_dropped"] == 1, what="the dropped open read")


def test_blocking_get_that_times_out_is_a_timeout_not_a_miss_latency(admin_server):
    client = admin_server.client()
    client.send(b"get slow/t=200\r\n")
    assert client.read_value() is None
    metrics = get_json(admin_server.admin_url + "/stats.json")["metrics"]
    assert metrics["q/slow/get_timeout_msec"]["count"] == 1
    assert metrics["q/slow/get_timeout_msec"]["maximum"] >= 150
    assert metrics["q/slow/get_miss_latency_usec"]["count"] == 0


def test_blocking_get_that_is_served_counts_a_delivery_not_a_hit_latency(admin_server):
    reader, writer = admin_server.client(), admin_server.client()
    reader.send(b"get late/t=5000\r\n")
    url = admin_server.admin_url + "/stats.json"
    wait_for(lambda: get_json(url)["gauges"].get("q/late/waiters") == 1, what="the waiting GET")
    writer.set("late", b"item")
    assert reader.read_value() == b"item"
    stats = get_json(url)
    assert stats["counters"]["q/late/get_items_hit"] == 1
    assert stats["metrics"]["q/late/delivery_latency_msec"]["count"] == 1
    assert stats["metrics"]["q/late/get_hit_latency_usec"]["count"] == 0  # as Kestrel: it waited
    assert stats["metrics"]["q/late/get_timeout_msec"]["count"] == 0


def test_stats_json_and_memcache_stats_read_the_same_numbers(admin_server):
    clients = known_traffic(admin_server)
    memcache = clients[0].stats()
    stats = get_json(admin_server.admin_url + "/stats.json")
    for name in ("cmd_get", "cmd_set", "cmd_peek", "get_hits", "get_misses", "total_items", "queue_creates"):
        assert stats["counters"][name] == int(memcache[name]), name
    assert stats["gauges"]["items"] == int(memcache["curr_items"])
    assert stats["gauges"]["q/jobs/open_transactions"] == int(memcache["queue_jobs_open_transactions"])
    assert stats["gauges"]["reserved_memory_ratio"] == float(memcache["reserved_memory_ratio"])


def test_deleted_queue_leaves_its_names_but_not_the_servers_figures(admin_server):
    client = admin_server.client()
    client.set("doomed", b"x")
    assert client.call(b"delete doomed") == b"DELETED"
    stats = get_json(admin_server.admin_url + "/stats.json")
    assert not [name for section in stats.values() for name in section if name.startswith("q/doomed/")]
    assert stats["metrics"]["set_latency_usec"]["count"] == 1


def test_an_alias_has_kestrels_alias_figures(tmp_path, make_admin_server):
    """AliasedQueue's ostrich names: the counters put_items and put_bytes, the gauge
    create_time; nothing of a queue's."""
    config = tmp_path / "kestrel.toml"
    config.write_text('[aliases]\neverywhere = ["left", "right"]\n')
    started = time.time()
    server = make_admin_server("--config", str(config))
    client = server.client()
    assert client.set("everywhere", b"four") == b"STORED"
    stats = get_json(server.admin_url + "/stats.json")
    assert stats["counters"]["q/everywhere/put_items"] == 1
    assert stats["counters"]["q/everywhere/put_bytes"] == 4
    assert started - 1 <= stats["gauges"]["q/everywhere/create_time"] <= time.time() + 1
    assert "q/everywhere/items" not in stats["gauges"]
    assert stats["gauges"]["q/left/items"] == stats["gauges"]["q/right/items"] == 1
    for query, with_create_time in (("", False), ("?queue_series=all", True)):
        body = request(server.admin_url + "/metrics" + query).body.decode()
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(body) for s in f.samples}
        assert samples[("kestrel_alias_put_items_total", (("alias", "everywhere"),))] == 1
        create_time = samples.get(("kestrel_alias_create_timestamp_seconds", (("alias", "everywhere"),)))
        assert create_time == (stats["gauges"]["q/everywhere/create_time"] if with_create_time else None)
        assert ("kestrel_queue_items", (("queue", "everywhere"),)) not in samples
    # a reload keeps an alias's create_time (Kestrel keeps the AliasedQueue) and adds new ones
    time.sleep(1.1)
    config.write_text('[aliases]\neverywhere = ["left"]\nlater = ["right"]\n')
    assert act_json(server.admin_url + "/reload") == {"response": "ok"}
    gauges = get_json(server.admin_url + "/stats.json")["gauges"]
    assert gauges["q/everywhere/create_time"] == stats["gauges"]["q/everywhere/create_time"]
    assert gauges["q/later/create_time"] >= stats["gauges"]["q/everywhere/create_time"] + 1


def test_stats_txt(admin_server):
    client = admin_server.client()
    client.set("jobs", b"one")
    reply = request(admin_server.admin_url + "/stats.txt")
    assert reply.status == 200 and reply.content_type.startswith("text/plain")
    text = reply.body.decode()
    for section in ("counters:", "gauges:", "labels:", "metrics:"):
        assert f"\n{section}\n" in "\n" + text
    assert "  q/jobs/items: 1\n" in text
    assert "  cmd_set: 1\n" in text
    assert "  status: Up\n" in text
    assert "  set_latency_usec: (average=" in text


def test_server_info(admin_server):
    info = get_json(admin_server.admin_url + "/server_info")
    assert info["name"] == "kestrel-actors"
    assert info["version"]
    assert info["status"] == "Up"
    assert 0 <= info["uptime"] < 600_000
    assert info["start_time"].endswith("Z")


def test_period_counts_what_the_period_added(admin_server):
    client = admin_server.client()
    client.set("periodic", b"before")
    url = admin_server.admin_url + "/stats.json"
    first = get_json(url + "?period=60")  # starts the 60 s period: nothing added yet
    assert first["counters"]["cmd_set"] == 0
    client.set("periodic", b"during")
    client.set("periodic", b"during")
    stats = get_json(url + "?period=60")
    assert stats["counters"]["cmd_set"] == 2
    assert stats["counters"]["q/periodic/put_items"] == 2
    assert stats["metrics"]["set_latency_usec"]["count"] == 2
    assert stats["gauges"]["q/periodic/items"] == 3  # gauges are current, not deltas
    assert get_json(url)["counters"]["cmd_set"] == 3


def test_a_short_period_latches_a_whole_quiet_period(admin_server):
    client = admin_server.client()
    url = admin_server.admin_url + "/stats.json?period=1"
    get_json(url)
    client.set("latched", b"x")
    assert get_json(url)["counters"]["cmd_set"] == 1  # the first period is not over yet
    # after a period with no SET in it, the latched view shows none, and stays so
    wait_for(lambda: get_json(url)["counters"]["cmd_set"] == 0, timeout=10, what="a quiet period")


def test_metrics_in_prometheus_format(admin_server):
    clients = known_traffic(admin_server)
    reply = request(admin_server.admin_url + "/metrics")
    assert reply.status == 200
    assert reply.content_type.startswith("text/plain; version=0.0.4")
    families = {family.name: family for family in text_string_to_metric_families(reply.body.decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert families["kestrel_cmd_set"].type == "counter"
    assert samples[("kestrel_cmd_set_total", ())] == 3
    assert samples[("kestrel_queue_put_items_total", (("queue", "jobs"),))] == 3
    assert samples[("kestrel_queue_open_transactions", (("queue", "jobs"),))] == 2
    assert families["kestrel_queue_items"].type == "gauge"
    assert samples[("kestrel_queue_items", (("queue", "jobs"),))] == 0
    assert samples[("kestrel_connections", ())] == 3
    # latencies are server-wide; a queue's histograms only with ?queue_series=all
    assert families["kestrel_set_latency_seconds"].type == "histogram"
    assert samples[("kestrel_set_latency_seconds_count", ())] == 3
    assert samples[("kestrel_delivery_latency_seconds_count", ())] == 3
    assert "kestrel_queue_set_latency_seconds" not in families
    every = request(admin_server.admin_url + "/metrics?queue_series=all").body.decode()
    families = {family.name: family for family in text_string_to_metric_families(every)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert families["kestrel_queue_set_latency_seconds"].type == "histogram"
    assert samples[("kestrel_queue_set_latency_seconds_count", (("queue", "jobs"),))] == 3
    assert samples[("kestrel_queue_set_latency_seconds_bucket", (("le", "+Inf"), ("queue", "jobs")))] == 3
    assert samples[("kestrel_queue_delivery_latency_seconds_count", (("queue", "jobs"),))] == 3
    assert ("kestrel_queue_max_items", (("queue", "jobs"),)) not in samples  # unlimited: no 2**31 - 1
    info = families["kestrel_info"]  # an info metric: in the 0.0.4 text format, a gauge of 1
    assert info.samples[0].labels["status"] == "Up" and info.samples[0].value == 1
    assert "process_cpu_seconds" in families and "process_resident_memory_bytes" in families
    assert "python_info" in families
    # the same numbers as /stats.json: one source of truth
    stats = get_json(admin_server.admin_url + "/stats.json")
    assert samples[("kestrel_get_hits_total", ())] == stats["counters"]["get_hits"]
    for client in clients:
        client.close()


def test_ostrichs_other_stats_parameters(admin_server):
    """ostrich also took ``filtered=1`` (no filters here: the same names) and the older
    ``namespace=NAME``: what was added since that name's last read."""
    client = admin_server.client()
    client.set("named", b"one")
    url = admin_server.admin_url + "/stats.json"
    assert get_json(url + "?filtered=1")["counters"]["cmd_set"] == 1
    assert get_json(url + "?period=60&filtered=1")["counters"]["cmd_set"] == 0  # a new period
    assert get_json(url + "?namespace=ganglia")["counters"]["cmd_set"] == 0  # the first read
    client.set("named", b"two")
    client.set("named", b"three")
    stats = get_json(url + "?namespace=ganglia")
    assert stats["counters"]["cmd_set"] == 2
    assert stats["counters"]["q/named/put_items"] == 2
    assert stats["metrics"]["q/named/set_latency_usec"]["count"] == 2
    assert stats["gauges"]["q/named/items"] == 3
    assert get_json(url + "?namespace=ganglia")["counters"]["cmd_set"] == 0  # nothing since
    assert get_json(url + "?namespace=other")["counters"]["cmd_set"] == 0  # each name its own
    text = request(admin_server.admin_url + "/stats.txt?namespace=ganglia&filtered=0")
    assert text.status == 200 and "  cmd_set: 0\n" in text.body.decode()


@pytest.mark.parametrize("path", ["/nope", "/stats.jsonx", "/q/jobs", "/metrics/x", "//stats.json", "/index.html"])
def test_unknown_paths_are_404(admin_server, path):
    reply = request(admin_server.admin_url + path)
    assert reply.status == 404
    assert "error" in reply.json()


@pytest.mark.parametrize("query", [
    "period=abc", "period=0", "period=-1", "period=1.5", "period=86401", "period=", "period",
    "period=1&period=2", "foo=1", "%zz", "period=%ff", "period=1;x",
    "filtered=2", "filtered=", "namespace=", "namespace=a/b", "namespace=" + "n" * 65, "namespace=%ff",
])
def test_bad_query_strings_are_400(admin_server, query):
    reply = request(admin_server.admin_url + "/stats.json?" + query)
    assert reply.status == 400, (query, reply)
    assert "error" in reply.json()
    assert get_json(admin_server.admin_url + "/ping") == {"response": "pong"}  # still serving


def test_parameters_only_where_documented(admin_server):
    assert request(admin_server.admin_url + "/ping?period=1").status == 400
    assert request(admin_server.admin_url + "/metrics?x=1").status == 400


@pytest.mark.parametrize("method,path", [("POST", "/stats.json"), ("DELETE", "/ping"), ("PUT", "/"),
                                         ("DELETE", "/shutdown")])
def test_other_methods_are_405(admin_server, method, path):
    assert request(admin_server.admin_url + path, method=method).status == 405
    assert admin_server.proc.poll() is None


def test_reading_every_endpoint_changes_nothing(admin_server):
    client = admin_server.client()
    client.set("kept", b"one")
    client.set("kept", b"two")
    before = client.stats()
    for path in ("/", "/ping", "/stats.json", "/stats.txt", "/stats.json?period=5", "/server_info", "/metrics",
                 "/nope", "/stats.json?period=x"):
        request(admin_server.admin_url + path)
    after = client.stats()
    for name in ("curr_items", "total_items", "cmd_get", "cmd_set", "queue_creates", "queue_deletes",
                 "queue_kept_items", "queue_kept_logsize"):
        assert after[name] == before[name], name
    assert client.get("kept") == b"one"


def test_page_is_self_contained(admin_server):
    reply = request(admin_server.admin_url + "/")
    assert reply.status == 200 and reply.content_type.startswith("text/html")
    page = reply.body.decode()
    assert "/stats.json" in page
    assert "src=" not in page and "<link" not in page and "@import" not in page  # no external assets


def test_admin_port_defaults_to_2223_and_0_disables_it(tmp_path):
    help_text = subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "serve", "--help"],
                               capture_output=True, text=True, timeout=60).stdout
    assert "--admin-port" in help_text and "2223" in help_text
    from ..helpers import ServerProcess

    # the memcache listener's line is logged last, once every listener is up
    server = ServerProcess(tmp_path / "data").start()  # --admin-port 0
    try:
        wait_for(lambda: '"protocol": "memcache"' in server.log(), what="the listening lines")
        assert "admin http" not in server.log()
    finally:
        server.stop()
    server = ServerProcess(tmp_path / "data2", admin_port=True).start()
    try:
        wait_for(lambda: '"protocol": "memcache"' in server.log(), what="the listening lines")
        admin_line = next(line for line in server.log().splitlines() if '"protocol": "admin http"' in line)
        assert f'"port": {server.admin_port}' in admin_line and '"host": "127.0.0.1"' in admin_line
    finally:
        server.stop()


def test_admin_port_listens_on_admin_host_not_on_host(tmp_path):
    """Issue 21.4: the admin port no longer follows --host (exposing memcache exposed
    /shutdown); it listens on --admin-host, 127.0.0.1 by default."""
    from ..helpers import ServerProcess

    server = ServerProcess(tmp_path / "data", admin_port=True)
    server.host = "127.0.0.2"  # another loopback address for memcache
    server.start()
    try:
        assert server.client().set("moved", b"x") == b"STORED"
        assert get_json(server.admin_url + "/ping") == {"response": "pong"}  # on 127.0.0.1
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", server.admin_port), timeout=2).close()
    finally:
        server.stop()
    server = ServerProcess(tmp_path / "data", ("--admin-host", "127.0.0.2"), admin_port=True)
    server.admin_host = "127.0.0.2"
    server.start()
    try:
        assert get_json(f"http://127.0.0.2:{server.admin_port}/ping") == {"response": "pong"}
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.admin_port), timeout=2).close()
        assert server.client().set("stays", b"x") == b"STORED"  # memcache still on --host
        admin_line = next(line for line in server.log().splitlines() if '"protocol": "admin http"' in line)
        assert '"host": "127.0.0.2"' in admin_line
    finally:
        server.stop()


def test_names_outside_latin1_and_not_utf8_in_every_endpoint(make_server, tmp_path):
    """A queue whose name is not UTF-8 (a stray file in the data directory) or is outside
    Latin-1 (the config) is shown by every endpoint (issue 17 case 5; /metrics and
    /stats.txt answered 500): its UTF-8 as it is, other bytes as ``\\xNN``."""
    data = tmp_path / "names"
    data.mkdir()
    with open(os.path.join(os.fsencode(data), b"caf\xe9"), "wb"):
        pass
    config = tmp_path / "names.toml"
    config.write_text('[queues."jobs+\u6f22"]\n', encoding="utf-8")
    server = make_server("--config", str(config), data_dir=data, admin_port=True)
    client = server.client()
    client.send(b"set caf\xe9 0 0 1\r\nx\r\n")
    assert client.read_line() == b"STORED"
    metrics = request(server.admin_url + "/metrics")
    assert metrics.status == 200
    families = text_string_to_metric_families(metrics.body.decode("utf-8"))
    samples = {(s.name, tuple(s.labels.items())): s.value for f in families for s in f.samples}
    assert samples[("kestrel_queue_items", (("queue", "caf\\xe9"),))] == 1
    assert samples[("kestrel_queue_items", (("queue", "jobs+\u6f22"),))] == 0
    text = request(server.admin_url + "/stats.txt")
    assert text.status == 200
    assert "  q/caf\\xe9/items: 1\n" in text.body.decode("utf-8")
    assert "  q/jobs+\u6f22/items: 0\n" in text.body.decode("utf-8")
    stats = request(server.admin_url + "/stats.json")
    gauges = json.loads(stats.body.decode("utf-8"))["gauges"]  # strict UTF-8, no lone surrogate
    assert gauges["q/caf\\xe9/items"] == 1 and gauges["q/jobs+\u6f22/items"] == 0
    assert request(server.admin_url + "/").status == 200


def test_queue_json_gives_one_queues_configuration_as_dump_config(make_admin_server, tmp_path):
    config = write_config(tmp_path, '[queues."tight"]\nmax_items = 5\n')
    server = make_admin_server("--config", config)
    server.client().set("tight", b"x")
    answer = get_json(server.admin_url + "/queue.json?name=tight")
    assert answer["name"] == "tight"
    assert answer["config"]["max_items"] == "5"
    assert answer["config"]["max_age"] == "none"  # dump_config's words, exact for 2**63 - 1 too
    assert answer["config"]["max_size"] == str(2**63 - 1)
    assert request(server.admin_url + "/queue.json?name=nosuch").status == 404
    assert request(server.admin_url + "/queue.json").status == 400
    assert request(server.admin_url + "/queue.json?queue=tight").status == 400
    assert "queue_nosuch_items" not in stats_of(server)  # asking does not create it
