"""Twitter's server sets, as data: a member's ``ServiceInstance`` JSON and ``zk://`` addresses.

A server set is a ZooKeeper node whose children ``member_NNNNNNNNNN`` (ephemeral, sequential:
twitter commons' ``Group``) each hold one server's ``ServiceInstance`` in the JSON of commons'
``JsonCodec``::

    {"serviceEndpoint": {"host": "10.0.0.1", "port": 22133},
     "additionalEndpoints": {"memcache": {"host": "10.0.0.1", "port": 22133}, ...},
     "status": "ALIVE"}

``shard`` is written only when set. Pure functions; no ZooKeeper client here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ALIVE",
    "DEAD",
    "MEMBER_PREFIX",
    "STATUSES",
    "Endpoint",
    "ServerSetAddress",
    "ServiceInstance",
    "decode_member",
    "encode_member",
]

MEMBER_PREFIX = "member_"
"""What commons' ``Group`` names its members, followed by ZooKeeper's 10-digit sequence."""

ALIVE = "ALIVE"
DEAD = "DEAD"
STATUSES = ("DEAD", "STARTING", "ALIVE", "STOPPING", "STOPPED", "WARNING")
"""``com.twitter.thrift.Status``'s names (endpoint.thrift), in its order."""

ZK_SCHEME = "zk://"


@dataclass(frozen=True, order=True)
class Endpoint:
    """``com.twitter.thrift.Endpoint``: a host and a port."""

    host: str
    port: int

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port}

    @classmethod
    def from_json(cls, value: Any) -> Endpoint:
        if not isinstance(value, dict):
            raise ValueError(f"an endpoint is an object with host and port; got {value!r}")
        host, port = value.get("host"), value.get("port")
        if not isinstance(host, str) or not host:
            raise ValueError(f"an endpoint's host must be a non-empty string; got {host!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"an endpoint's port must be an integer 0-65535; got {port!r}")
        return cls(host, port)


@dataclass(frozen=True)
class ServiceInstance:
    """``com.twitter.thrift.ServiceInstance``: one member of a server set."""

    service_endpoint: Endpoint
    additional_endpoints: dict[str, Endpoint] = field(default_factory=dict)
    status: str = ALIVE
    shard: int | None = None

    def endpoint(self, name: str) -> Endpoint:
        """The endpoint named ``name`` (``memcache``, ``text``, ``thrift``), else the main one."""
        return self.additional_endpoints.get(name, self.service_endpoint)

    def with_status(self, status: str) -> ServiceInstance:
        return ServiceInstance(self.service_endpoint, self.additional_endpoints, status, self.shard)


def encode_member(instance: ServiceInstance) -> bytes:
    """The member's data, as commons' ``JsonCodec`` writes it (UTF-8 JSON)."""
    document: dict[str, Any] = {
        "serviceEndpoint": instance.service_endpoint.to_json(),
        "additionalEndpoints": {name: endpoint.to_json()
                                for name, endpoint in instance.additional_endpoints.items()},
        "status": instance.status,
    }
    if instance.shard is not None:
        document["shard"] = instance.shard
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


def decode_member(data: bytes) -> ServiceInstance:
    """Read a member's data as ``JsonCodec.deserialize`` does: ``serviceEndpoint`` and
    ``status`` required, ``additionalEndpoints`` and ``shard`` optional. ValueError if not
    (whatever the bytes: the data is written by anyone the set's ACL lets write)."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"a server-set member's data is not JSON: {exc}") from None
    except RecursionError:  # anyone who may write a member can nest arrays 100,000 deep
        raise ValueError("a server-set member's data is nested too deeply to be a ServiceInstance") from None
    if not isinstance(document, dict):
        raise ValueError("a server-set member's data is not a JSON object")
    if "serviceEndpoint" not in document:
        raise ValueError("Field serviceEndpoint is required")
    status = document.get("status")
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {status!r}")
    extra = document.get("additionalEndpoints") or {}
    if not isinstance(extra, dict):
        raise ValueError("additionalEndpoints must be an object of endpoints")
    shard = document.get("shard")
    if shard is not None and (not isinstance(shard, int) or isinstance(shard, bool)):
        raise ValueError(f"shard must be an integer; got {shard!r}")
    return ServiceInstance(
        Endpoint.from_json(document["serviceEndpoint"]),
        {str(name): Endpoint.from_json(value) for name, value in extra.items()},
        status,
        shard,
    )


@dataclass(frozen=True)
class ServerSetAddress:
    """Where a server set lives: ZooKeeper's ``hosts`` (``h1:2181,h2:2181``) and the set's path.

    Written ``zk://h1:2181,h2:2181/kestrel/write`` (the port defaults to 2181)."""

    hosts: str
    path: str

    @staticmethod
    def is_address(text: object) -> bool:
        return isinstance(text, str) and text.strip().lower().startswith(ZK_SCHEME)

    @classmethod
    def parse(cls, text: str) -> ServerSetAddress:
        text = text.strip()
        if not cls.is_address(text):
            raise ValueError(f"a server set is written zk://host:port/path; got {text!r}")
        rest = text[len(ZK_SCHEME):]
        hosts, slash, path = rest.partition("/")
        if not hosts or not slash or not path or path.endswith("/"):
            raise ValueError(f"a server set is written zk://host:port/path; got {text!r}")
        named = []
        for host in hosts.split(","):
            host = host.strip()
            if not host:
                raise ValueError(f"empty ZooKeeper host in {text!r}")
            has_port = ":" in host and host.rpartition(":")[2].isdigit()
            named.append(host if has_port else f"{host}:2181")
        return cls(",".join(named), "/" + path)

    def __str__(self) -> str:
        return f"{ZK_SCHEME}{self.hosts}{self.path}"
