"""What ZooKeeper and a cluster do when things break (issue 23): a SIGKILLed server's members
vanish after its session timeout while a following client's puts move to the others with no
acknowledged item lost; ZooKeeper stopped and restarted under load never stops the servers
serving and they join again; digest credentials with a creator-only ACL."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from kestrel_actors.client import Client, KestrelError

from ..helpers import ZooKeeperProcess, free_port, stats_of, wait_for
from ..helpers import server_set_ports as ports


class Producer(threading.Thread):
    """Puts numbered items through ``client`` until stopped; remembers what was acknowledged."""

    def __init__(self, client: Client, queue: str) -> None:
        super().__init__(daemon=True)
        self.client, self.queue = client, queue
        self.acknowledged: list[bytes] = []
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            item = b"item-%d" % n
            n += 1
            try:
                if self.client.put(self.queue, item):
                    self.acknowledged.append(item)
            except KestrelError:
                self.failures += 1
                time.sleep(0.05)
            time.sleep(0.002)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def drain(client: Client, queue: str) -> list[bytes]:
    got = []
    while (item := client.get(queue, timeout=1.0)) is not None:
        got.append(item)
    return got


def test_sigkilled_server_leaves_after_its_session_timeout_and_no_put_is_lost(
        start_cluster, zookeeper, zk_client, prefix, qname):
    session = 3.0
    servers = start_cluster(3, session_timeout=session)
    victim = servers[0]
    client = Client.from_server_set(zookeeper.hosts, f"{prefix}/write", read_path=f"{prefix}/read",
                                    retry_after=0.5)
    with client:
        producer = Producer(client, qname)
        producer.start()
        assert wait_for(lambda: len(producer.acknowledged) > 100, timeout=20)
        victim.kill()
        killed = time.monotonic()
        assert wait_for(lambda: victim.port not in ports(zk_client, f"{prefix}/write"), timeout=session + 10)
        gone = time.monotonic() - killed
        assert victim.port not in ports(zk_client, f"{prefix}/read")
        assert gone >= session * 0.5, "ephemeral members go when ZooKeeper expires the session, not before"
        assert wait_for(lambda: f"127.0.0.1:{victim.port}" not in client.write_servers, timeout=5)
        count = len(producer.acknowledged)
        assert wait_for(lambda: len(producer.acknowledged) > count + 100, timeout=20)  # the others take them
        producer.stop()

        victim.start()  # same port and data directory: its journal still holds what it stored
        assert wait_for(lambda: victim.port in ports(zk_client, f"{prefix}/read"), timeout=15)
        assert wait_for(lambda: len(client.servers) == 3, timeout=5)
        got = drain(client, qname)
    missing = set(producer.acknowledged) - set(got)
    assert not missing, f"{len(missing)} acknowledged items lost of {len(producer.acknowledged)}"


def test_zookeeper_stopped_and_restarted_under_load(make_server, tmp_path, qname):
    zk = ZooKeeperProcess(tmp_path / "zk").start()
    prefix = "/kestrel/restart"
    try:
        args = ("--zookeeper", zk.hosts, "--zookeeper-path-prefix", prefix,
                "--zookeeper-session-timeout", "4")
        servers = [make_server(*args) for _ in range(3)]
        everyone = {s.port for s in servers}
        watcher = zk.kazoo()
        assert wait_for(lambda: ports(watcher, f"{prefix}/write") == everyone, timeout=15)
        watcher.stop()
        watcher.close()
        producer = Producer(Client([s.address for s in servers], retry_after=0.5), qname)
        producer.start()
        assert wait_for(lambda: len(producer.acknowledged) > 50, timeout=20)

        zk.stop(signal.SIGKILL)
        assert wait_for(lambda: all(stats_of(s)["zookeeper_connected"] == "0" for s in servers), timeout=15)
        count, failures = len(producer.acknowledged), producer.failures
        assert wait_for(lambda: len(producer.acknowledged) > count + 200, timeout=20)  # still serving
        assert producer.failures == failures
        time.sleep(5)  # longer than the session timeout: ZooKeeper expires the sessions when back

        zk.start()
        watcher = zk.kazoo()
        try:
            for set_name in ("read", "write"):
                path = f"{prefix}/{set_name}"
                assert wait_for(lambda path=path: ports(watcher, path) == everyone, timeout=30), \
                    [s.log()[-1500:] for s in servers]
            assert wait_for(lambda: all(stats_of(s)["zookeeper_connected"] == "1" for s in servers), timeout=10)
            for set_name in ("read", "write"):  # each joined once per set: no stale member left over
                # a session ZooKeeper expires only now (its client came back too late) takes its
                # node with it a moment after the set looked whole; its server then joins again
                path = f"{prefix}/{set_name}"
                assert wait_for(lambda path=path: len(watcher.get_children(path)) == 3
                                and ports(watcher, path) == everyone, timeout=15), watcher.get_children(path)
            for server in servers:  # the outage is logged once, however long the retries went on
                assert server.log().count("zookeeper connection lost") == 1, server.log()[-3000:]
        finally:
            watcher.stop()
            watcher.close()
        producer.stop()
        assert producer.failures == failures
        with Client([s.address for s in servers]) as reader:
            got = drain(reader, qname)
        assert set(producer.acknowledged) <= set(got)
    finally:
        zk.stop()


def test_zookeeper_down_at_start_up_is_joined_when_it_comes(make_server, tmp_path):
    zk = ZooKeeperProcess(tmp_path / "zk", port=free_port())
    prefix = "/kestrel/late"
    server = make_server("--zookeeper", zk.hosts, "--zookeeper-path-prefix", prefix)
    try:
        conn = server.client()
        assert conn.set("late", b"served") == b"STORED"  # serving without ZooKeeper
        conn.close()
        assert stats_of(server)["zookeeper_state"] == "CONNECTING"
        assert wait_for(lambda: "zookeeper unreachable" in server.log(), timeout=10)
        zk.start()
        watcher = zk.kazoo()
        try:
            assert wait_for(lambda: ports(watcher, f"{prefix}/write") == {server.port}, timeout=20)
        finally:
            watcher.stop()
            watcher.close()
        assert server.log().count("zookeeper unreachable") == 1  # logged once
    finally:
        zk.stop()


def test_digest_credentials_with_a_creator_only_acl(make_server, join_args, zookeeper, prefix, tmp_path):
    from kazoo.exceptions import NoAuthError
    from kazoo.security import Permissions

    # the server creates every missing node of its path with its ACL, as Kestrel's ensurePath
    # does: under a root of its own, so that a creator-only /kestrel does not lock the module's
    # other tests out (it did, whenever this test was the first to create /kestrel)
    prefix = f"/acl-only{prefix}"

    config = tmp_path / "kestrel.toml"
    config.write_text(
        f'[zookeeper]\nhost = "127.0.0.1"\nport = {zookeeper.port}\npath_prefix = "{prefix}"\n'
        'credentials = { user = "kestrel", password = "s3cret" }\nacl = "creator-all"\n')
    server = make_server("--config", str(config))
    anonymous = zookeeper.kazoo()
    try:
        assert wait_for(lambda: ports(anonymous, f"{prefix}/write") == {server.port}, timeout=15)
        for path in (f"{prefix}/write", f"{prefix}/write/{anonymous.get_children(f'{prefix}/write')[0]}"):
            acls, _ = anonymous.get_acls(path)
            by_scheme = {acl.id.scheme: acl.perms for acl in acls}
            assert by_scheme["world"] == Permissions.READ
            assert by_scheme["digest"] == Permissions.ALL
            assert next(acl.id.id for acl in acls if acl.id.scheme == "digest").startswith("kestrel:")
        member = f"{prefix}/write/{anonymous.get_children(f'{prefix}/write')[0]}"
        with pytest.raises(NoAuthError):
            anonymous.delete(member)  # only the creator's credentials change the set
        with pytest.raises(NoAuthError):
            anonymous.set(member, b"{}")
        # anyone follows it: a client without credentials
        with Client.from_server_set(zookeeper.hosts, f"{prefix}/write") as client:
            assert client.servers and str(client.servers[0]) == server.address
            assert client.put("acl", b"x")
        server.stop()  # the creator leaves: its credentials may delete its own member
        assert wait_for(lambda: not ports(anonymous, f"{prefix}/write"), timeout=3)
    finally:
        anonymous.stop()
        anonymous.close()


class Consumer(threading.Thread):
    """Takes items through ``client`` with reliable reads (confirmed once recorded) until stopped."""

    def __init__(self, client: Client, queue: str) -> None:
        super().__init__(daemon=True)
        self.client, self.queue = client, queue
        self.consumed: list[bytes] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                with self.client.reliable(self.queue, timeout=0.2) as item:
                    if item is not None:
                        self.consumed.append(item)
            except KestrelError:
                time.sleep(0.05)  # that server went away: its open item goes back to its queue

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def test_a_cluster_driven_from_outside_through_kills_restarts_and_read_only(
        start_cluster, zookeeper, zk_client, prefix, qname):
    """Issue 23's 'done when': three servers and one ZooKeeper; a producer and a consumer that
    follow the sets while one server is set ReadOnly, another is SIGKILLed and restarted, and the
    first is set Up again. Every acknowledged item is consumed."""
    readonly, victim, steady = start_cluster(3, session_timeout=3.0, grace=1.0)
    producer_client = Client.from_server_set(zookeeper.hosts, f"{prefix}/write", retry_after=0.5)
    consumer_client = Client.from_server_set(zookeeper.hosts, f"{prefix}/read", retry_after=0.5)
    producer, consumer = Producer(producer_client, qname), Consumer(consumer_client, qname)
    with producer_client, consumer_client:
        producer.start()
        consumer.start()
        assert wait_for(lambda: len(producer.acknowledged) > 100, timeout=20)

        conn = readonly.client()
        assert conn.call(b"status readonly") == b"END"
        conn.close()
        assert wait_for(lambda: readonly.port not in ports(zk_client, f"{prefix}/write"), timeout=5)
        victim.kill()
        assert wait_for(lambda: victim.port not in ports(zk_client, f"{prefix}/read"), timeout=15)
        count = len(producer.acknowledged)
        assert wait_for(lambda: len(producer.acknowledged) > count + 100, timeout=20)
        victim.start()
        assert wait_for(lambda: victim.port in ports(zk_client, f"{prefix}/write"), timeout=15)
        conn = readonly.client()
        assert conn.call(b"status up") == b"END"
        conn.close()
        assert wait_for(lambda: readonly.port in ports(zk_client, f"{prefix}/write"), timeout=10)
        count = len(producer.acknowledged)
        assert wait_for(lambda: len(producer.acknowledged) > count + 100, timeout=20)
        producer.stop()
        acknowledged = set(producer.acknowledged)
        assert wait_for(lambda: acknowledged <= set(consumer.consumed), timeout=60), \
            f"{len(acknowledged - set(consumer.consumed))} acknowledged items not consumed"
        consumer.stop()
    for server in (readonly, victim, steady):
        assert stats_of(server)[f"queue_{qname}_items"] == "0"
