"""The one place kazoo is imported: a ZooKeeper client that reconnects for ever, quietly.

Imported only when a server set is used, so a server without ZooKeeper (and a program that
never names a ``zk://`` address) does not load kazoo. kazoo logs every failed reconnection;
its logger here keeps only errors, and the callers log a change of connection state once.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["acl", "make_client"]

_QUIET = logging.getLogger("kestrel_actors.cluster.kazoo")
_QUIET.setLevel(logging.ERROR)

RECONNECT_MAX_DELAY = 2.0
"""Seconds between two attempts to reach ZooKeeper, at most (kazoo backs off up to this)."""


def make_client(hosts: str, session_timeout: float, *, use_gevent: bool,
                credentials: tuple[str, str] | None = None) -> Any:
    """A ``KazooClient`` (not started) that retries its connection for ever: a ZooKeeper down
    at start-up or lost later only delays the session. With ``use_gevent`` it cooperates with
    the gevent hub (kazoo's ``SequentialGeventHandler``), else it runs on threads."""
    from kazoo.client import KazooClient

    if use_gevent:
        from kazoo.handlers.gevent import SequentialGeventHandler as Handler
    else:
        from kazoo.handlers.threading import SequentialThreadingHandler as Handler
    handler = Handler()
    auth = [("digest", f"{credentials[0]}:{credentials[1]}")] if credentials else None
    return KazooClient(
        hosts=hosts,
        timeout=session_timeout,
        handler=handler,
        auth_data=auth,
        connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": RECONNECT_MAX_DELAY,
                          "sleep_func": handler.sleep_func},
        logger=_QUIET,
    )


def acl(name: str) -> list[Any]:
    """Kestrel's ACLs by our names: ``open`` (``OpenUnsafeACL``) and ``creator-all``
    (``EveryoneReadCreatorAllACL``: anyone reads, the creator's credentials do everything)."""
    from kazoo.security import CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE

    if name == "creator-all":
        return list(READ_ACL_UNSAFE) + list(CREATOR_ALL_ACL)
    return list(OPEN_ACL_UNSAFE)

