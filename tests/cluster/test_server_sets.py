"""Servers joining ZooKeeper server sets (issue 23), against a real ZooKeeper: three servers
join both sets as Twitter server-set members; a ReadOnly server leaves the write set before
its writes are refused and rejoins after ``status up`` and the grace period; membership and
the connection state are in ``stats``, ``/stats.json`` and ``/metrics``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

from kestrel_actors.client import Client

from ..helpers import free_port, stats_of, wait_for
from ..helpers import server_set_ports as ports

MEMBER = re.compile(r"member_\d{10}\Z")
THRIFT_STATUSES = {"DEAD", "STARTING", "ALIVE", "STOPPING", "STOPPED", "WARNING"}


def service_instance(data: bytes) -> dict:
    """Read a member as twitter commons' JsonCodec (Gson) does, strictly: only its fields,
    ``serviceEndpoint`` and ``status`` required, endpoints exactly ``{host, port}``."""
    document = json.loads(data.decode("utf-8"))
    assert set(document) <= {"serviceEndpoint", "additionalEndpoints", "status", "shard"}, document
    assert document["status"] in THRIFT_STATUSES

    def endpoint(value: dict) -> tuple[str, int]:
        assert set(value) == {"host", "port"}, value
        assert isinstance(value["host"], str) and value["host"]
        assert isinstance(value["port"], int) and 0 < value["port"] < 65536
        return value["host"], value["port"]

    endpoint(document["serviceEndpoint"])
    for name, value in document.get("additionalEndpoints", {}).items():
        assert isinstance(name, str)
        endpoint(value)
    assert "shard" not in document or isinstance(document["shard"], int)
    return document


def members(zk, path: str) -> dict[str, dict]:
    """The set's members by node name (none if the set does not exist yet)."""
    if zk.exists(path) is None:
        return {}
    found = {}
    for child in zk.get_children(path):
        try:
            data, _ = zk.get(f"{path}/{child}")
        except Exception:  # noqa: BLE001 - it left meanwhile
            continue
        found[child] = service_instance(data)
    return found


def status(server, name: str) -> None:
    conn = server.client()
    try:
        assert conn.call(b"status " + name.encode()) == b"END"
    finally:
        conn.close()


def test_three_servers_join_both_sets_as_twitter_members(make_server, join_args, zk_client, prefix):
    servers = [make_server(*join_args(), admin_port=True, thrift_port=True)
               for _ in range(3)]
    expected = {s.port for s in servers}
    for set_name in ("read", "write"):
        assert wait_for(lambda set_name=set_name: ports(zk_client, f"{prefix}/{set_name}") == expected, timeout=15), \
            (set_name, members(zk_client, f"{prefix}/{set_name}"))
        found = members(zk_client, f"{prefix}/{set_name}")
        assert all(MEMBER.match(name) for name in found), found
        for node, member in found.items():
            stat = zk_client.exists(f"{prefix}/{set_name}/{node}")
            assert stat.ephemeralOwner != 0  # ephemeral: it goes with the server's session
            memcache = member["additionalEndpoints"]["memcache"]
            assert member["serviceEndpoint"] == memcache  # memcache is the main endpoint
            server = next(s for s in servers if s.port == memcache["port"])
            assert memcache["host"] == "127.0.0.1"
            assert member["additionalEndpoints"]["thrift"] == {"host": "127.0.0.1", "port": server.thrift_port}
            assert "text" not in member["additionalEndpoints"]  # the tests' servers have none
    stats = stats_of(servers[0])
    assert (stats["zookeeper_state"], stats["zookeeper_connected"]) == ("CONNECTED", "1")
    assert (stats["zookeeper_read_member"], stats["zookeeper_write_member"]) == ("1", "1")
    with urllib.request.urlopen(servers[0].admin_url + "/stats.json") as reply:
        ostrich = json.load(reply)
    assert ostrich["gauges"]["zookeeper/connected"] == 1.0
    assert ostrich["gauges"]["zookeeper/write_member"] == 1.0
    assert ostrich["labels"]["zookeeper_state"] == "CONNECTED"
    with urllib.request.urlopen(servers[0].admin_url + "/metrics") as reply:
        metrics = reply.read().decode()
    assert "kestrel_zookeeper_connected 1.0" in metrics
    assert "kestrel_zookeeper_read_member 1.0" in metrics

    servers[2].stop()  # SIGTERM: both memberships marked DEAD and left at once
    assert wait_for(lambda: ports(zk_client, f"{prefix}/read") == expected - {servers[2].port}, timeout=3)
    assert ports(zk_client, f"{prefix}/write") == expected - {servers[2].port}


def test_read_only_leaves_the_write_set_first_and_rejoins_after_the_grace_period(
        start_cluster, zookeeper, zk_client, prefix, qname):
    grace = 4.0
    servers = start_cluster(3, grace=grace)
    leaving = servers[1]
    client = Client.from_server_set(zookeeper.hosts, f"{prefix}/write", read_path=f"{prefix}/read")
    with client:
        for i in range(30):
            assert client.put(qname, b"before-%d" % i)
        stored_before = int(stats_of(leaving)[f"queue_{qname}_total_items"])
        assert stored_before > 0  # round-robin reached it

        changed = time.monotonic()
        status(leaving, "readonly")
        assert wait_for(lambda: leaving.port not in ports(zk_client, f"{prefix}/write"))
        left = time.monotonic()
        assert leaving.port in ports(zk_client, f"{prefix}/read")  # still drained
        if left - changed < grace - 0.5:  # ZooKeeper first: it still takes writes in the grace period
            conn = leaving.client()
            assert conn.set(qname + "_probe", b"x") == b"STORED"
            conn.close()
        assert wait_for(lambda: f"127.0.0.1:{leaving.port}" not in client.write_servers, timeout=20)
        for i in range(30):
            assert client.put(qname, b"after-%d" % i)
        assert int(stats_of(leaving)[f"queue_{qname}_total_items"]) == stored_before

        got = []
        while (item := client.get(qname, timeout=0.5)) is not None:
            got.append(item)
        assert sorted(got) == sorted([b"before-%d" % i for i in range(30)] + [b"after-%d" % i for i in range(30)])

        asked = time.monotonic()  # the server's grace period starts after this
        status(leaving, "up")
        still_out = leaving.port not in ports(zk_client, f"{prefix}/write")
        if time.monotonic() - asked < grace - 1.0:
            assert still_out, "a looser status reaches ZooKeeper only after the grace period"
        assert wait_for(lambda: leaving.port in ports(zk_client, f"{prefix}/write"), timeout=grace + 10)
        assert time.monotonic() - asked >= grace - 0.5
        assert wait_for(lambda: f"127.0.0.1:{leaving.port}" in client.write_servers, timeout=5)


def test_quiescent_leaves_both_sets(make_server, join_args, zk_client, prefix):
    server = make_server(*join_args())
    assert wait_for(lambda: ports(zk_client, f"{prefix}/read") == {server.port}, timeout=15)
    status(server, "quiescent")
    assert wait_for(lambda: not ports(zk_client, f"{prefix}/read") and not ports(zk_client, f"{prefix}/write"),
                    timeout=5)
    assert stats_of(server)["zookeeper_read_member"] == "0"


def test_the_cli_takes_a_server_set(make_server, join_args, zookeeper, zk_client, prefix, qname):
    servers = [make_server(*join_args()) for _ in range(2)]
    assert wait_for(lambda: ports(zk_client, f"{prefix}/write") == {s.port for s in servers}, timeout=15)
    # a member that is not JSON: the client ignores it with a warning, which must go to stderr,
    # not into the items on stdout (nor into stats' table)
    zk_client.create(f"{prefix}/read/member_9999999999", b"not json")
    cli = [sys.executable, "-m", "kestrel_actors.cli"]
    lines = b"".join(b"line-%d\n" % i for i in range(20))
    put = subprocess.run([*cli, "put", qname, "-s", f"zk://{zookeeper.hosts}{prefix}/write"],
                         input=lines, capture_output=True, timeout=60)
    assert put.returncode == 0, put.stderr
    stats = subprocess.run([*cli, "stats", "-s", f"zk://{zookeeper.hosts}{prefix}/read"],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert stats.returncode == 0, stats.stderr
    assert all(s.address in stats.stdout for s in servers)
    assert "CONNECTED" in stats.stdout
    assert "member ignored" not in stats.stdout and "member ignored" in stats.stderr
    get = subprocess.run([*cli, "get", qname, "-n", "20", "-s", f"zk://{zookeeper.hosts}{prefix}/read"],
                         capture_output=True, timeout=60)
    assert get.returncode == 0, get.stderr
    assert sorted(get.stdout.splitlines()) == sorted(lines.splitlines())
    assert b"member ignored" in get.stderr


def test_the_spark_source_plans_with_the_members_of_the_moment(make_server, join_args, zookeeper, zk_client,
                                                               prefix):
    """What the ``serverSet`` option does at each micro-batch plan, without a JVM: the
    connection sets follow the members (tests/bridge/test_server_set_option.py runs it in Spark)."""
    from kestrel_actors.spark_bridge import Connection, KeepAlive
    from kestrel_actors.spark_bridge._serverset import follow_members, server_set_members

    first, second = make_server(*join_args()), make_server(*join_args())
    assert wait_for(lambda: ports(zk_client, f"{prefix}/read") == {first.port, second.port}, timeout=15)
    server_set = f"zk://{zookeeper.hosts}{prefix}/read"
    assert sorted(map(str, server_set_members(server_set, 10))) == sorted([first.address, second.address])
    sets: tuple[dict, dict] = ({}, {})
    keep_alive = KeepAlive(0)

    def connections(address):
        return [Connection(address), Connection(address)]

    follow_members(sets, server_set, 10, connections, keep_alive)
    assert all(sorted(one) == sorted([first.address, second.address]) for one in sets)
    kept = sets[0][first.address]
    second.stop()
    assert wait_for(lambda: ports(zk_client, f"{prefix}/read") == {first.port}, timeout=5)
    follow_members(sets, server_set, 10, connections, keep_alive)
    assert all(list(one) == [first.address] for one in sets)
    assert sets[0][first.address] is kept  # a member that stays keeps its connections
    follow_members(sets, f"zk://127.0.0.1:{free_port()}/nowhere", 1, connections, keep_alive)
    assert all(list(one) == [first.address] for one in sets)  # ZooKeeper away: servers unchanged


def test_the_status_file_read_at_start_up_decides_the_first_memberships(make_server, join_args, zk_client,
                                                                        prefix, tmp_path):
    data_dir = tmp_path / "readonly-data"
    (data_dir / ".kestrel").mkdir(parents=True)
    (data_dir / ".kestrel" / "status").write_text("ReadOnly\n")
    server = make_server(*join_args(), data_dir=data_dir)
    assert wait_for(lambda: ports(zk_client, f"{prefix}/read") == {server.port}, timeout=15)
    time.sleep(0.5)
    assert ports(zk_client, f"{prefix}/write") == set()
    assert stats_of(server)["zookeeper_write_member"] == "0"


def test_a_wildcard_bind_publishes_the_machines_address(make_server, join_args, zk_client, prefix):
    from kestrel_actors.cluster._membership import published_host

    server = make_server(*join_args(), "--host", "0.0.0.0")  # the last --host wins
    assert wait_for(lambda: ports(zk_client, f"{prefix}/read") == {server.port}, timeout=15)
    (member,) = members(zk_client, f"{prefix}/read").values()
    host = member["serviceEndpoint"]["host"]
    assert host not in ("0.0.0.0", "::", "")
    assert host == published_host("0.0.0.0")


def test_a_client_follows_its_set_while_a_gevent_hub_sits_idle_in_its_thread(
        make_server, join_args, zookeeper, zk_client, prefix):
    """A threaded program that once used gevent keeps a hub in its main thread that never runs
    again (this test process has one after its in-process tests). The client's watches must not
    wait for that hub: they did, and in a full test run the client kept a gone member for good."""
    import gevent

    gevent.get_hub()
    servers = [make_server(*join_args()) for _ in range(2)]
    assert wait_for(lambda: ports(zk_client, f"{prefix}/write") == {s.port for s in servers}, timeout=15)
    with Client.from_server_set(zookeeper.hosts, f"{prefix}/write") as client:
        assert sorted(client.write_servers) == sorted(s.address for s in servers)
        servers[1].stop()  # leaves both sets at once
        assert wait_for(lambda: client.write_servers == [servers[0].address], timeout=10), client.write_servers
