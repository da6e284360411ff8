"""The ``serverSet`` option: a ZooKeeper server set's members are the source's and sink's
servers (``zk://zk1:2181/kestrel/read``), looked up again at each micro-batch plan (source)
and each write task (sink), so a query follows the cluster. On threads: kazoo's threading
handler, never gevent."""

from __future__ import annotations

from collections.abc import Callable

from ..client import ServerAddress
from ..cluster import ServerSetAddress
from ._kestrel import Connection, KeepAlive
from ._log import lazy_logger

__all__ = ["follow_members", "server_set_members"]

log = lazy_logger("kestrel_actors.spark_bridge.serverset")


def server_set_members(server_set: str, timeout: float) -> tuple[ServerAddress, ...]:
    """The memcache addresses of the set's ALIVE members now (one listing)."""
    from ..cluster import ServerSetFollower

    follower = ServerSetFollower(ServerSetAddress.parse(server_set), lambda members: None)
    try:
        follower.start(timeout)
    except TimeoutError as exc:
        raise ConnectionError(str(exc)) from None
    try:
        endpoints = [member.endpoint("memcache") for member in follower.members]
    finally:
        follower.stop()
    return tuple(dict.fromkeys(ServerAddress(e.host, e.port) for e in endpoints))


def follow_members(sets: tuple[dict[str, list[Connection]], ...], server_set: str, timeout: float,
                   connections: Callable[[ServerAddress], list[Connection]], keep_alive: KeepAlive) -> None:
    """Make every connection set hold the set's members now: connections for a member that
    joined; a member that left is dropped (its connections closed, except those still holding
    open items: those are confirmed where they were opened). If ZooKeeper cannot be reached
    the servers stay as they were."""
    try:
        members = {str(address): address for address in server_set_members(server_set, timeout)}
    except (ConnectionError, ValueError) as exc:
        log.warning("server_set_unavailable", server_set=server_set, error=str(exc)[:300])
        return
    for one in sets:
        for name in [name for name in one if name not in members]:
            for connection in one.pop(name):
                if not connection.holding:
                    connection.close()
            log.info("server_left", server_set=server_set, server=name)
        for name, address in members.items():
            if name not in one:
                one[name] = connections(address)
                for connection in one[name]:
                    keep_alive.add(connection)
                log.info("server_joined", server_set=server_set, server=name)
