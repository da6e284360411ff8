"""The server's two memberships: Kestrel's ``ZooKeeperServerStatus``, on kazoo and gevent.

The server joins ``<path_prefix>/read`` and ``<path_prefix>/write`` as a Twitter server-set
member (an ephemeral sequential ``member_`` node holding its ``ServiceInstance``) and keeps
each membership in step with its status:

======================  ===========  ============
status                  read set     write set
======================  ===========  ============
Up                      ALIVE        ALIVE
WriteAvoid, ReadOnly    ALIVE        DEAD
Quiescent, Down         DEAD         DEAD
======================  ===========  ============

A DEAD member leaves its set: its node is marked ``DEAD`` and deleted (commons'
``EndpointStatus.update(DEAD)`` leaves the group; so a return to ALIVE joins again, as
Kestrel re-joins). A stricter status sends ZooKeeper its requests before the status changes
(the grace period then gives clients time to see the member leave before writes are
refused); a looser one changes the status at once and ZooKeeper follows after
``status_change_grace_period`` (the issue's rule; a flapping server is not re-advertised at
once). A status change never waits for ZooKeeper: it runs in a session's handler.

ZooKeeper never stops the server from serving. One greenlet owns the memberships: it
(re)joins whenever the session is connected and a membership is missing, so a ZooKeeper down
at start-up, a connection lost for a while, or a session expired (its ephemeral nodes gone)
all end with the server joining again. Each change of connection state is logged once.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.event
import structlog

from ..config import ZooKeeperConfig
from ..status import ServerStatus, Status
from ._kazoo import acl, make_client
from ._serverset import ALIVE, DEAD, MEMBER_PREFIX, Endpoint, ServiceInstance, encode_member

__all__ = ["READ", "WRITE", "MembershipFigures", "ZooKeeperMembership", "alive_in", "published_host"]

log = structlog.get_logger("kestrel_actors.cluster")

READ = "read"
WRITE = "write"
RETRY_PAUSE = 1.0
"""Seconds before a failed ZooKeeper operation is tried again (the connection is up)."""
CLOSE_TIMEOUT = 3.0
"""Seconds shutdown gives ZooKeeper, all told, to take both memberships away and close the
session (it comes out of the server's drain bound, ``server.DRAIN_SECONDS``)."""

_READABLE = (Status.UP, Status.WRITE_AVOID, Status.READ_ONLY)


def alive_in(set_name: str, status: Status) -> bool:
    """Kestrel's ``statusToReadStatus``/``statusToWriteStatus``: ALIVE in the read set for
    Up, WriteAvoid and ReadOnly; in the write set for Up only."""
    return status is Status.UP if set_name == WRITE else status in _READABLE


def published_host(host: str) -> str:
    """The address to publish for a listener bound to ``host``: itself, unless it is the
    wildcard (``0.0.0.0``, ``::``, empty), which becomes this machine's external address (the
    one its default route leaves from; else its host name's)."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            address = probe.getsockname()[0]
        if address and not address.startswith("127.") and address != "0.0.0.0":
            return address
    except OSError:
        pass
    name = socket.gethostname()
    try:
        for info in socket.getaddrinfo(name, None, socket.AF_INET):
            candidate = info[4][0]  # an AF_INET address is (host, port)
            if isinstance(candidate, str) and not candidate.startswith("127."):
                return candidate
    except OSError:
        pass
    return name


@dataclass(frozen=True)
class MembershipFigures:
    """What ``stats``, ``/stats.json`` and ``/metrics`` show of ZooKeeper."""

    state: str
    """``CONNECTED``, ``SUSPENDED`` (connection lost, session maybe alive), ``LOST`` (session
    expired), ``CONNECTING`` (never connected yet) or ``CLOSED``."""
    read_member: bool
    write_member: bool
    joins: int
    """Nodes created in either set since start-up (each re-join counts)."""
    sessions_expired: int

    @property
    def connected(self) -> bool:
        return self.state == "CONNECTED"


@dataclass
class _Member:
    """Our node in one set, while we hold one, and the session that owns it."""

    set_name: str
    path: str | None = None
    session: int | None = None


class ZooKeeperMembership:
    """The server's memberships; the status tells it of every change (:class:`StatusListener`)."""

    def __init__(self, config: ZooKeeperConfig, status: ServerStatus, grace_period: float) -> None:
        self.config = config
        self.grace_period = grace_period
        self._status = status
        self._target = status.status
        self._members = {READ: _Member(READ), WRITE: _Member(WRITE)}
        self._leaving: list[str] = []
        self._instance: ServiceInstance | None = None
        self._acl = acl(config.acl)
        self._wake = gevent.event.Event()
        self._later: Any = None
        self._keeper: Any = None
        self._state = "CONNECTING"
        self._joins = 0
        self._expired = 0
        credentials = config.credentials
        self._zk = make_client(config.hosts, config.session_timeout, use_gevent=True,
                               credentials=(credentials.user, credentials.password) if credentials else None)
        self._zk.add_listener(self._on_state)
        status.listener = self

    # -- life cycle -------------------------------------------------------------------------

    def start(self, endpoints: Mapping[str, tuple[str, int]]) -> None:
        """Join with these listeners (``name → (bound host, port)``; the first is the main
        endpoint), as soon as ZooKeeper can be reached: this never waits for it."""
        published = {name: Endpoint(published_host(host), port) for name, (host, port) in endpoints.items()}
        self._instance = ServiceInstance(next(iter(published.values())), published, ALIVE)
        self._target = self._status.status
        self._zk.start_async()
        self._keeper = gevent.spawn(self._keep)
        gevent.spawn_later(min(self.config.session_timeout, 5.0), self._warn_if_unreachable)
        log.info("joining zookeeper server sets", zookeeper=self.config.hosts,
                 path_prefix=self.config.path_prefix, status=self._target.value,
                 endpoint=f"{self._instance.service_endpoint.host}:{self._instance.service_endpoint.port}")

    def _warn_if_unreachable(self) -> None:
        if self._state == "CONNECTING":
            log.warning("zookeeper unreachable; serving without server-set membership, joining "
                        "when it is reachable", zookeeper=self.config.hosts)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Shutdown: leave both sets (marked DEAD, deleted) and end the session, in at most
        ``timeout`` seconds whatever ZooKeeper does.

        A ZooKeeper that stops or stalls meanwhile fails or never answers the requests; that
        is logged once and shutdown goes on (the nodes are ephemeral: they go with the
        session, at the latest when it times out)."""
        if self._later is not None:
            self._later.kill(block=False)
        self._target = Status.DOWN
        for member in self._members.values():
            self._leave(member)
        if self._keeper is not None:
            self._keeper.kill()
        self._state = "CLOSED"
        # False: expire silently (gevent's documented value; its stub allows only exceptions)
        with gevent.Timeout(timeout, False):  # type: ignore[arg-type]
            try:
                if self._zk.connected:
                    self._drop_leaving()
                self._zk.stop()
            except Exception as exc:  # noqa: BLE001 - ZooKeeper's trouble never stops a shutdown
                log.warning("zookeeper did not take the server out of its sets; its nodes go "
                            "with its session", error=repr(exc)[:300])
        try:
            self._zk.close()
        except Exception as exc:  # noqa: BLE001 - as above
            log.debug("zookeeper client close failed", error=repr(exc)[:300])

    def figures(self) -> MembershipFigures:
        return MembershipFigures(
            state=self._state,
            read_member=self._members[READ].path is not None,
            write_member=self._members[WRITE].path is not None,
            joins=self._joins,
            sessions_expired=self._expired,
        )

    # -- the status's changes (StatusListener) -----------------------------------------------

    def status_changing(self, old: Status, new: Status, immediate: bool) -> None:
        if new is old:
            return  # the same status again: a pending re-join keeps its grace period
        if self._later is not None:
            self._later.kill(block=False)
            self._later = None
        if old.stricter_than(new) and not immediate and self.grace_period > 0:
            self._later = gevent.spawn_later(self.grace_period, self._publish, new)
        else:
            self._publish(new)

    def _publish(self, status: Status) -> None:
        """Make ``status`` the one ZooKeeper shows: a set the server leaves is left now (its
        requests are sent before this returns); a set it joins is joined by the keeper."""
        self._later = None
        self._target = status
        for set_name in (WRITE, READ):  # out of the write path first
            member = self._members[set_name]
            if member.path is not None and not alive_in(set_name, status):
                self._leave(member)
                if self._zk.connected:
                    path = self._leaving[-1]
                    self._zk.set_async(path, self._data(DEAD))
                    self._zk.delete_async(path)
        self._wake.set()

    # -- the keeper -----------------------------------------------------------------------------

    def _keep(self) -> None:
        failing = False
        while True:
            self._wake.wait()
            self._wake.clear()
            if not self._zk.connected:
                continue  # the state listener wakes us when the session is back
            try:
                self._reconcile()
            except Exception as exc:  # noqa: BLE001 - ZooKeeper's trouble never stops serving
                if not failing:
                    log.warning("zookeeper membership update failed; retrying", error=repr(exc)[:300])
                failing = True
                gevent.sleep(RETRY_PAUSE)
                self._wake.set()
            else:
                if failing:
                    log.info("zookeeper membership updated again")
                failing = False

    def _reconcile(self) -> None:
        self._drop_leaving()
        for set_name in (READ, WRITE):  # into the read path first
            member = self._members[set_name]
            wanted = alive_in(set_name, self._target)
            if wanted and not self._holds(member):
                self._join(member)
            elif not wanted and member.path is not None:
                self._leave(member)
                self._drop_leaving()

    def _holds(self, member: _Member) -> bool:
        if member.path is None:
            return False
        if member.session == self._session() and self._zk.exists(member.path) is not None:
            return True
        member.path = None
        return False

    def _join(self, member: _Member) -> None:
        """Create our node in the set, or adopt the one this session already has there (a
        create whose answer was lost with the connection)."""
        from kazoo.exceptions import NoNodeError

        session = self._session()
        set_path = f"{self.config.path_prefix}/{member.set_name}"
        self._zk.ensure_path(set_path, acl=self._acl)
        ours = []
        for child in sorted(self._zk.get_children(set_path)):
            if child.startswith(MEMBER_PREFIX):
                try:
                    stat = self._zk.exists(f"{set_path}/{child}")
                except NoNodeError:
                    continue
                if stat is not None and stat.ephemeralOwner == session:
                    ours.append(f"{set_path}/{child}")
        if ours:
            path = ours[0]
            self._zk.set(path, self._data(ALIVE))
            self._leaving.extend(ours[1:])
        else:
            path = self._zk.create(f"{set_path}/{MEMBER_PREFIX}", self._data(ALIVE), acl=self._acl,
                                   ephemeral=True, sequence=True)
        member.path, member.session = path, session
        self._joins += 1
        log.info("joined zookeeper server set", server_set=set_path, member=path,
                 status=self._target.value)

    def _leave(self, member: _Member) -> None:
        if member.path is not None:
            self._leaving.append(member.path)
            log.info("leaving zookeeper server set", member=member.path, status=self._target.value)
        member.path = None

    def _drop_leaving(self) -> None:
        """Mark each node we left DEAD, then delete it (gone already is fine)."""
        from kazoo.exceptions import NoNodeError

        while self._leaving:
            path = self._leaving[0]
            try:
                self._zk.set(path, self._data(DEAD))
                self._zk.delete(path)
            except NoNodeError:
                pass
            self._leaving.pop(0)

    def _data(self, status: str) -> bytes:
        assert self._instance is not None
        return encode_member(self._instance.with_status(status))

    def _session(self) -> int | None:
        client_id = self._zk.client_id
        return client_id[0] if client_id else None

    # -- connection state (kazoo calls this on its connection greenlet: never block) -----------

    def _on_state(self, state: str) -> None:
        if state == "LOST":
            if self._state != "CLOSED":
                self._expired += 1
            for member in self._members.values():
                member.path = None  # ephemeral nodes go with their session
            self._leaving.clear()
        if state != self._state and self._state != "CLOSED":
            if state == "CONNECTED":
                log.info("zookeeper connected", zookeeper=self.config.hosts)
            elif state == "SUSPENDED":
                log.warning("zookeeper connection lost; still serving, joining again when it is back",
                            zookeeper=self.config.hosts)
            else:
                log.warning("zookeeper session expired; joining again with a new session",
                            zookeeper=self.config.hosts)
            self._state = state
        self._wake.set()
