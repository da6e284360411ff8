"""Following one server set from a client: its ALIVE members, kept current by watches.

A :class:`ServerSetFollower` lists ``<path>``'s ``member_`` children and reads each one's
``ServiceInstance``, leaving a watch on the list and on every member; any change (a member
joined, left, or changed its data) and every new session lists them again. Each listing is
handed to ``on_change`` (only ALIVE members, in member order). A member whose data cannot
be read as a ``ServiceInstance`` (whatever its bytes: not JSON, nested 100,000 deep, ...) is
skipped with one warning. While ZooKeeper cannot be reached the last listing stands: the
client keeps using the servers it knew.

On threads by default; with gevent in charge (:func:`kestrel_actors.client.cooperative`) it
runs on kazoo's gevent handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from ._kazoo import make_client
from ._serverset import ALIVE, MEMBER_PREFIX, ServerSetAddress, ServiceInstance, decode_member

__all__ = ["ServerSetFollower"]

log = structlog.get_logger("kestrel_actors.cluster")


class ServerSetFollower:
    """Calls ``on_change(members)`` with the set's ALIVE members now and after every change.

    :meth:`start` waits up to ``timeout`` seconds for ZooKeeper and the first listing
    (``TimeoutError`` if it cannot be had); after that, ZooKeeper's outages only delay updates.
    """

    def __init__(self, address: ServerSetAddress, on_change: Callable[[list[ServiceInstance]], None],
                 *, use_gevent: bool = False, session_timeout: float = 10.0,
                 credentials: tuple[str, str] | None = None) -> None:
        self.address = address
        self.on_change = on_change
        self.members: list[ServiceInstance] = []
        self._zk = make_client(address.hosts, session_timeout, use_gevent=use_gevent,
                               credentials=credentials)
        self._lock = self._zk.handler.lock_object()
        self._listed = self._zk.handler.event_object()
        self._stopped = False
        self._ignored: set[tuple[str, int]] = set()
        """``(member path, data version's zxid)`` of each unreadable member already warned of:
        a set is listed again at every change, and one bad member is one warning."""
        self._zk.add_listener(self._on_state)

    def start(self, timeout: float = 10.0) -> ServerSetFollower:
        try:
            self._zk.start(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - kazoo's handlers raise their own timeout types
            self._zk.close()
            raise TimeoutError(f"cannot reach ZooKeeper at {self.address.hosts}: {exc}") from None
        self._refresh()
        if not self._listed.wait(timeout):
            self.stop()
            raise TimeoutError(f"cannot list the server set {self.address}")
        return self

    def stop(self) -> None:
        self._stopped = True
        try:
            self._zk.stop()
        finally:
            self._zk.close()

    # -- listing ----------------------------------------------------------------------------

    def _changed(self, _event: Any = None) -> None:
        """A watch fired: list again off the watch's own callback."""
        if not self._stopped:
            self._zk.handler.spawn(self._refresh)

    def _on_state(self, state: str) -> None:
        if state == "CONNECTED" and not self._stopped:
            self._changed()  # a new session has none of the old watches

    def _refresh(self) -> None:
        from kazoo.exceptions import KazooException, NoNodeError, ZookeeperError

        with self._lock:
            if self._stopped:
                return
            path = self.address.path
            try:
                try:
                    children = self._zk.get_children(path, watch=self._changed)
                except NoNodeError:
                    if self._zk.exists(path, watch=self._changed) is not None:
                        return self._changed()  # created meanwhile
                    children = []
                members = []
                for child in sorted(children):
                    if not child.startswith(MEMBER_PREFIX):
                        continue
                    member = f"{path}/{child}"
                    try:
                        data, stat = self._zk.get(member, watch=self._changed)
                    except NoNodeError:
                        continue
                    try:
                        instance = decode_member(data)
                    except ValueError as exc:
                        if (member, stat.mzxid) not in self._ignored:
                            self._ignored.add((member, stat.mzxid))
                            log.warning("server-set member ignored", member=member, error=str(exc)[:300])
                        continue
                    if instance.status == ALIVE:
                        members.append(instance)
            except (KazooException, ZookeeperError) as exc:
                # the connection went: the state listener lists again when it is back
                log.debug("server-set listing failed", server_set=str(self.address), error=repr(exc))
                return None
            self.members = members
            self.on_change(members)
            self._listed.set()
        return None
