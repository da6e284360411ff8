"""Per-queue and server-wide settings, with Kestrel's defaults and snake_case names.

Durations are floats in seconds (``None`` where Kestrel's default is ``None``); sizes are bytes.
``sync_journal`` follows Kestrel's ``syncJournal``: ``None`` never fsyncs (Duration.Top),
``0.0`` fsyncs before every reply, and a positive period fsyncs on a timer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..queue_name import fanout_master
from ._values import INT_MAX, LONG_MAX

__all__ = ["INT_MAX", "LONG_MAX", "QueueConfig", "ServerConfig", "ZooKeeperConfig", "ZooKeeperCredentials"]

MIB = 1024 * 1024


@dataclass(frozen=True)
class QueueConfig:
    """Everything Kestrel's ``QueueBuilder`` configures for one queue (behaviour §5.13)."""

    max_items: int = INT_MAX
    max_size: int = LONG_MAX
    max_item_size: int = LONG_MAX
    max_age: float | None = None
    default_journal_size: int = 16 * MIB
    max_memory_size: int = 128 * MIB
    max_journal_size: int = 1024 * MIB
    min_journal_compact_delay: float | None = 60.0
    discard_old_when_full: bool = False
    keep_journal: bool = True
    sync_journal: float | None = None
    expire_to_queue: str | None = None
    max_expire_sweep: int = INT_MAX
    fanout_only: bool = False
    max_queue_age: float | None = None
    enable_trace: bool = False
    disable_aggressive_rewrites: bool = False
    open_transaction_timeout: float | None = None

    # ``Any``: the fields changed are chosen at run time (a config file's keys, the flags given), so
    # each value is checked where it is parsed (``_file``, cli), not here.
    def replace(self, **changes: Any) -> QueueConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ZooKeeperCredentials:
    """A ZooKeeper digest identity (Kestrel's ``credentials = Some((user, password))``)."""

    user: str
    password: str

    def __repr__(self) -> str:  # the password stays out of logs and tracebacks
        return f"ZooKeeperCredentials(user={self.user!r}, password=<set>)"


@dataclass(frozen=True)
class ZooKeeperConfig:
    """Kestrel's ``zookeeper`` block: the ZooKeeper the server joins its two server sets in,
    ``<path_prefix>/read`` and ``<path_prefix>/write`` (docs/cluster.md)."""

    host: str
    path_prefix: str
    port: int = 2181
    session_timeout: float = 10.0
    credentials: ZooKeeperCredentials | None = None
    acl: str = "open"
    """``open`` (Kestrel's ``OpenUnsafeACL``) or ``creator-all`` (``EveryoneReadCreatorAllACL``:
    anyone reads, only the credentials' owner changes; needs ``credentials``)."""

    @property
    def hosts(self) -> str:
        """``host:port``, as a ZooKeeper client takes it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def replace(self, **changes: Any) -> ZooKeeperConfig:
        return dataclasses.replace(self, **changes)


ZOOKEEPER_ACLS = ("open", "creator-all")


@dataclass(frozen=True)
class ServerConfig:
    """Server-wide settings. Defaults are Kestrel's, except where a server needs a limit."""

    host: str = "127.0.0.1"
    port: int = 22133
    text_port: int = 2222
    """Kestrel's text protocol port; 0 disables the listener."""
    thrift_port: int = 2229
    """Kestrel's thrift protocol port (framed, binary); 0 disables the listener."""
    admin_port: int = 2223
    """The admin HTTP service (ostrich's endpoints, ``/metrics``, the live page); 0 disables it."""
    admin_host: str = "127.0.0.1"
    """The address the admin port binds to: its own, not ``host`` (exposing the memcache port
    must not expose ``/shutdown``)."""
    admin_token: str | None = field(default=None, repr=False)
    """When set, ``/shutdown``, ``/quiesce`` and ``/reload`` require it as ``Authorization: Bearer``
    (kept out of ``repr`` and out of every error message)."""
    data_dir: str = "./data"
    max_open_transactions: int = 1
    max_item_bytes: int = 64 * MIB
    max_line_bytes: int = 64 * 1024
    monitor_max_items: int = 10_000
    expiration_timer_frequency: float | None = 1.0
    client_timeout: float | None = None
    busy_poll: float = 0.0002
    """After reading a request, the hub polls its sockets without sleeping for up to this many
    seconds (yielding the CPU each turn) before it sleeps: waking a sleeping thread, and on a VM
    a halted vCPU, costs a one-client request more than the request itself (ADR 0025). 0: sleep
    at once."""
    max_connections: int = 20_000
    max_buffered_bytes: int = 1024 * MIB
    """Bound on what all connections buffer together (unfinished requests, unread replies);
    past it the connections holding the most are closed (ADR 0011)."""
    connection_limit_refuse_writes: int | None = None
    connection_limit_refuse_reads: int | None = None
    status_file: str | None = None
    """``None``: ``<data_dir>/.kestrel/status`` (Kestrel's shared ``/tmp`` file would let two
    servers on one machine read each other's status)."""
    default_status: str = "Up"
    status_change_grace_period: float = 0.0
    zookeeper: ZooKeeperConfig | None = None
    """Join ZooKeeper server sets (Kestrel's ``zookeeper``); ``None``: no ZooKeeper."""
    config_file: str | None = None
    """The TOML file this config came from, re-read by ``reload``."""
    queue_defaults: QueueConfig = field(default_factory=QueueConfig)
    queues: dict[str, QueueConfig] = field(default_factory=dict)
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def replace(self, **changes: Any) -> ServerConfig:
        return dataclasses.replace(self, **changes)

    def queue_config(self, name: str) -> QueueConfig:
        """The effective config of queue ``name``: its own table, else its fanout master's."""
        if name in self.queues:
            return self.queues[name]
        master = fanout_master(name)
        if master is not None and master in self.queues:
            return self.queues[master]
        return self.queue_defaults
