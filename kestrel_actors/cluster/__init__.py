"""A cluster of independent servers found through ZooKeeper server sets (Kestrel 2.x's).

The server side (:class:`ZooKeeperMembership`) joins ``<prefix>/read`` and ``<prefix>/write``
and follows the server's status; the client side (:class:`ServerSetFollower`) follows one
set's members. The member format (:mod:`._serverset`) is Twitter's ``ServiceInstance`` JSON.
kazoo is imported only by what talks to ZooKeeper, when it is used.
"""

from ._serverset import (
    ALIVE,
    DEAD,
    MEMBER_PREFIX,
    Endpoint,
    ServerSetAddress,
    ServiceInstance,
    decode_member,
    encode_member,
)

__all__ = [
    "ALIVE",
    "DEAD",
    "MEMBER_PREFIX",
    "Endpoint",
    "MembershipFigures",
    "ServerSetAddress",
    "ServerSetFollower",
    "ServiceInstance",
    "ZooKeeperMembership",
    "decode_member",
    "encode_member",
]


def __getattr__(name: str):  # the server side needs gevent; the client side may not
    if name in ("ZooKeeperMembership", "MembershipFigures"):
        from . import _membership

        return getattr(_membership, name)
    if name == "ServerSetFollower":
        from ._follower import ServerSetFollower

        return ServerSetFollower
    raise AttributeError(name)
