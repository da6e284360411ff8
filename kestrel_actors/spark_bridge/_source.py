"""``kestrel``: a PySpark Python Data Source — a Structured Streaming source and a sink.

Register it, then read and write queues like any other format::

    from kestrel_actors.spark_bridge import KestrelDataSource
    spark.dataSource.register(KestrelDataSource)
    events = (spark.readStream.format("kestrel").option("servers", "h1:22133,h2:22133")
              .option("queue", "events").load())               # data binary, queue, server
    df.write.format("kestrel").option("queue", "out").mode("append").save()

How the source delivers (the reasoning is in docs/adr/0003-spark-data-source.md):

* Spark keeps the stream reader in one long-lived Python process beside the driver JVM and
  calls ``latestOffset``, ``partitions`` and ``commit`` there, one at a time. That process
  holds the connections; memcache reliable reads are tied to a connection, and a server holds
  at most ``--monitor-max-items`` open items per connection, so a batch of
  ``maxItemsPerBatch`` items per server uses ``ceil(maxItemsPerBatch / itemsPerConnection)``
  connections per server.
* ``latestOffset(start)`` first confirms every batch up to ``start`` — Spark asks for the
  next offset only after it has written the previous batch to its commit log — then opens
  what is waiting on each server (at most ``maxItemsPerBatch`` per server) and keeps those
  items in memory under a new sequence number. With ``readAhead`` the next batch has already
  been opened on a second set of connections while Spark ran this one (:class:`_Prefetch`). The offset is ``{"seq": n, "items": {server:
  count}}`` in Spark's checkpoint. ``commit(end)`` confirms too (it comes later, only once a
  further batch is planned, so it cannot be the only place: a drained queue would keep its
  last batch open for good).
* ``partitions(start, end)`` hands the opened items themselves to the executors inside the
  pickled partitions, so ``read`` is a pure function of its partition: an executor retry
  reads the same rows and never touches a server.
* A driver that dies drops its connections; each server puts the unconfirmed items back at
  the head of its queue. A restarted query (same checkpoint) replays an uncommitted batch as
  empty — its items are not held by the new process, and they come again in the next batch.
  Duplicates are therefore bounded by one micro-batch; nothing is lost.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

from ..client import KestrelError, ServerAddress
from ._config import parse_duration, parse_servers
from ..cluster import ServerSetAddress
from ._kestrel import Connection, KeepAlive
from ._serverset import follow_members, server_set_members

__all__ = ["KestrelDataSource", "KestrelPartition", "SourceOptions"]

log = structlog.get_logger("kestrel_actors.spark_bridge.source")

SCHEMA = "data binary, queue string, server string"
_RECONNECT_AFTER = 1.0  # seconds before a server that failed is tried again
_IDLE_RECHECK = 0.05  # an empty look at the servers is not repeated sooner than this


@dataclass(frozen=True)
class SourceOptions:
    """The data source's options, parsed once (names are case-insensitive, as Spark's are)."""

    servers: tuple[ServerAddress, ...]
    queue: str
    max_items_per_batch: int = 50_000
    items_per_partition: int = 12_500
    items_per_connection: int = 10_000
    read_ahead: bool = True
    keep_alive: float = 1.0
    column: str = "data"
    connect_timeout: float = 5.0
    io_timeout: float = 30.0
    server_set: str | None = None
    """``serverSet``: a ZooKeeper server set (``zk://host:port/path``) whose members are the
    servers, looked up at each micro-batch plan; ``servers`` is then ignored."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        lower = {str(k).lower(): str(v) for k, v in options.items()}
        queue = lower.get("queue", "")
        if not queue or any(ch in queue for ch in " /\r\n\t"):
            raise ValueError(f"kestrel: option queue is required and must be a queue name, "
                             f"got {queue!r}")
        server_set = lower.get("serverset") or None
        if server_set is not None:
            ServerSetAddress.parse(server_set)  # a bad address fails the query at once
        parsed = cls(
            server_set=server_set,
            servers=() if server_set else parse_servers(lower.get("servers", "127.0.0.1:22133")),
            queue=queue,
            max_items_per_batch=int(lower.get("maxitemsperbatch", cls.max_items_per_batch)),
            items_per_partition=int(lower.get("itemsperpartition", cls.items_per_partition)),
            items_per_connection=int(lower.get("itemsperconnection",
                                               cls.items_per_connection)),
            read_ahead=_parse_bool(lower.get("readahead", "true")),
            keep_alive=parse_duration(lower.get("keepaliveinterval", "1s")),
            column=lower.get("column", "data"),
            connect_timeout=parse_duration(lower.get("connecttimeout", "5s")),
            io_timeout=parse_duration(lower.get("iotimeout", "30s")),
        )
        if min(parsed.max_items_per_batch, parsed.items_per_partition,
               parsed.items_per_connection) < 1:
            raise ValueError("kestrel: maxItemsPerBatch, itemsPerPartition and "
                             "itemsPerConnection must be >= 1")
        return parsed

    @property
    def connections_per_server(self) -> int:
        """A server holds at most ``--monitor-max-items`` open items per connection, so a
        micro-batch of ``maxItemsPerBatch`` items per server needs this many connections."""
        return math.ceil(self.max_items_per_batch / self.items_per_connection)


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"kestrel: expected true or false, got {text!r}")
    return value == "true"


class KestrelDataSource(DataSource):
    """``format("kestrel")``: stream source (``readStream``), batch and stream sink."""

    @classmethod
    def name(cls) -> str:
        return "kestrel"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema) -> DataSourceStreamReader:
        return KestrelStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema, overwrite: bool) -> KestrelWriter:
        if overwrite:
            raise ValueError("kestrel: a queue can only be appended to; use mode('append')")
        options = SourceOptions.parse(self.options)
        return KestrelWriter(options, _column_index(schema, options.column))

    def streamWriter(self, schema, overwrite: bool) -> KestrelStreamWriter:
        # ``overwrite`` is set for the complete output mode: every micro-batch then sends the
        # whole result table again, which for a queue is simply more items.
        options = SourceOptions.parse(self.options)
        return KestrelStreamWriter(options, _column_index(schema, options.column))


# -- the stream source -----------------------------------------------------------------------


class KestrelPartition(InputPartition):
    """One task's share of a micro-batch: the opened items themselves (so ``read`` is pure)."""

    def __init__(self, server: str, queue: str, items: list[bytes]) -> None:
        super().__init__(None)
        self.server = server
        self.queue = queue
        self.items = items

    def __repr__(self) -> str:
        return f"KestrelPartition({self.server}, {self.queue}, {len(self.items)} items)"


# server -> its ``connections_per_server`` connections
_ConnectionSet = dict[str, list[Connection]]


@dataclass
class _ReaderState:
    """What the planner process holds between Spark's calls: connections, opened batches.

    Two sets of connections take turns: the batch Spark is running holds its items on one,
    while the next batch is opened ahead on the other (:class:`_Prefetch`).
    """

    sets: tuple[_ConnectionSet, _ConnectionSet]
    keep_alive: KeepAlive
    open: dict[int, _OpenBatch] = field(default_factory=dict)
    prefetch: _Prefetch | None = None
    retry_at: dict[str, float] = field(default_factory=dict)
    idle_until: float = 0.0

    @classmethod
    def start(cls, options: SourceOptions) -> _ReaderState:
        def one_set() -> _ConnectionSet:
            return {str(a): [Connection(a, options.connect_timeout, options.io_timeout)
                             for _ in range(options.connections_per_server)]
                    for a in options.servers}

        sets = (one_set(), one_set())
        keep_alive = KeepAlive(options.keep_alive)
        for connection in _all_connections(sets):
            keep_alive.add(connection)
        return cls(sets, keep_alive)


def _all_connections(sets: tuple[_ConnectionSet, ...]) -> Iterator[Connection]:
    return (c for one in sets for per_server in one.values() for c in per_server)


@dataclass(frozen=True)
class _Held:
    """Items of a batch opened on one connection, confirmed there after Spark's commit."""

    server: str
    connection: Connection
    items: list[bytes]


@dataclass
class _Opened:
    """Items opened on one connection set, as opened on each connection."""

    on: int  # index of the connection set in ``_ReaderState.sets``
    held: list[_Held] = field(default_factory=list)

    @property
    def items(self) -> dict[str, list[bytes]]:
        """Per server, in the order opened."""
        per_server: dict[str, list[bytes]] = {}
        for part in self.held:
            per_server.setdefault(part.server, []).extend(part.items)
        return per_server

    def still_held(self, queue: str) -> _Opened:
        """Only the parts whose connection is still up (one ``version`` round trip each):
        a server that restarted, or timed a connection out, has put those items back."""
        kept = _Opened(self.on)
        for part in self.held:
            try:
                part.connection.check()
            except KestrelError as exc:
                part.connection.close()
                log.warning("read_ahead_lost", queue=queue, server=part.server,
                            items=len(part.items), error=str(exc)[:300])
                continue
            kept.held.append(part)
        return kept


@dataclass
class _OpenBatch:
    """Items opened for one offset sequence number, waiting for Spark's commit."""

    seq: int
    opened: _Opened
    items: dict[str, list[bytes]] = field(init=False)

    def __post_init__(self) -> None:
        self.items = self.opened.items


class _Prefetch:
    """Opens the next batch on a thread while Spark runs the current one.

    The planner process is idle while the executors work, and opening a micro-batch's 50,000
    items costs the server and this process ~0.5–1 s; doing it then takes it off the
    micro-batch's critical path. Only Spark's calls publish what was opened: the items stay open on their
    connections, unseen by Spark, until the next ``latestOffset`` makes them a batch (or
    ``stop`` drops the connections and the servers take them back).
    """

    def __init__(self, run) -> None:
        self._run = run
        self._result: _Opened | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._body, name="kestrel-prefetch", daemon=True)
        self._thread.start()

    def _body(self) -> None:
        try:
            self._result = self._run()
        except BaseException as exc:  # noqa: BLE001 - handed to the planner thread in join()
            self._error = exc

    def wait(self) -> None:
        self._thread.join()

    def join(self) -> _Opened:
        """The opened items; raises what opening raised."""
        self._thread.join()
        if self._error is not None or self._result is None:
            raise self._error or RuntimeError("read-ahead ended without a result")
        return self._result


class KestrelStreamReader(DataSourceStreamReader):
    """Runs in Spark's Python planner process on the driver; see the module docstring."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._live: _ReaderState | None = None

    def __getstate__(self) -> dict:
        # Spark also builds a reader in a short-lived planner process and pickles it to ship
        # ``read`` to the executors: only the options travel, connections are made on use.
        return {"options": self.options, "_live": None}

    @property
    def live(self) -> _ReaderState:
        if self._live is None:
            self._live = _ReaderState.start(self.options)
        return self._live

    # Spark's API ------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        return {"seq": 0, "items": {}}

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        """Confirm what Spark has committed, then open the next batch (or return ``start``)."""
        live = self.live
        done = int(start.get("seq", 0))
        self._confirm_through(done)
        if live.open:  # asked again before that batch ran: the same answer
            return _offset(live.open[max(live.open)])
        budget = getattr(limit, "max_rows", None)
        opened = self._take_prefetch()
        if self.options.server_set:  # no read-ahead is running now: the sets may change
            follow_members(live.sets, self.options.server_set, self.options.connect_timeout,
                           self._connections, live.keep_alive)
        if opened is None or not opened.held:
            now = time.monotonic()
            if now < live.idle_until:
                return start
            opened = self._open_all(0, budget)
            if not opened.held:
                live.idle_until = time.monotonic() + _IDLE_RECHECK
                return start
        batch = _OpenBatch(done + 1, opened)
        live.open[batch.seq] = batch
        if budget is None and self.options.read_ahead:
            # A read limit can change between calls; only an unlimited query reads ahead.
            ahead = 1 - opened.on
            live.prefetch = _Prefetch(lambda: self._open_all(ahead, None))
        return _offset(batch)

    def partitions(self, start: dict, end: dict) -> list[KestrelPartition]:
        seq = int(end.get("seq", 0))
        if seq == int(start.get("seq", 0)):
            return []
        batch = self.live.open.get(seq)
        if batch is None:
            # A restarted query replays its last uncommitted batch. This process never opened
            # those items: the old driver's connections dropped and the servers put them back,
            # so they come again in the next batch. Replaying nothing loses nothing.
            log.warning("replayed_batch_not_held", queue=self.options.queue, seq=seq,
                        items=end.get("items"))
            return []
        step = self.options.items_per_partition
        return [KestrelPartition(server, self.options.queue, items[i:i + step])
                for server, items in batch.items.items()
                for i in range(0, len(items), step)]

    def read(self, partition: KestrelPartition) -> Iterator[Any]:
        import pyarrow as pa

        n = len(partition.items)
        if not n:
            return
        yield pa.RecordBatch.from_arrays(
            [pa.array(partition.items, pa.binary()),
             pa.array([partition.queue] * n, pa.string()),
             pa.array([partition.server] * n, pa.string())],
            names=["data", "queue", "server"])

    def commit(self, end: dict) -> None:
        self._confirm_through(int(end.get("seq", 0)))

    def stop(self) -> None:
        """The query ended: unconfirmed items go back to their servers with the connections."""
        live, self._live = self._live, None
        if live is None:
            return
        if live.prefetch is not None:
            live.prefetch.wait()  # its items go back with the connections below
        live.keep_alive.stop()
        for connection in _all_connections(live.sets):
            connection.close()

    # helpers -------------------------------------------------------------------------------

    def _connections(self, address: ServerAddress) -> list[Connection]:
        options = self.options
        return [Connection(address, options.connect_timeout, options.io_timeout)
                for _ in range(options.connections_per_server)]

    def _take_prefetch(self) -> _Opened | None:
        live = self.live
        prefetch, live.prefetch = live.prefetch, None
        if prefetch is None:
            return None
        try:
            return prefetch.join().still_held(self.options.queue)
        except Exception as exc:  # noqa: BLE001 - its items go back with its connections
            for connection in _all_connections(live.sets):
                connection.close()  # no batch is open here: nothing else is held
            log.warning("prefetch_failed", queue=self.options.queue, error=repr(exc)[:300])
            return None

    def _open_all(self, on: int, budget: int | None) -> _Opened:
        """Open the next batch on connection set ``on``: up to ``maxItemsPerBatch`` per server
        (and ``budget`` in all, if Spark gives a read limit)."""
        opened = _Opened(on)
        now = time.monotonic()
        for name, connections in self.live.sets[on].items():
            cap = self.options.max_items_per_batch
            if budget is not None:
                cap = min(cap, budget - sum(len(p.items) for p in opened.held))
                if cap <= 0:
                    break
            self._open(name, connections, cap, now, opened.held)
        return opened

    def _open(self, name: str, connections: list[Connection], cap: int, now: float,
              held: list[_Held]) -> None:
        """Open up to ``cap`` of what one server has waiting, ``itemsPerConnection`` on each
        of its connections in turn (one ``stats``, then one ``monitor`` per connection)."""
        if now < self.live.retry_at.get(name, 0.0):
            return
        queue = self.options.queue
        connection = connections[0]
        try:
            left = min(cap, connection.depth(queue))
            for connection in connections:
                if left <= 0:
                    break
                got = connection.open_waiting(queue, min(self.options.items_per_connection, left))
                if not got:
                    break  # another reader took them first
                held.append(_Held(name, connection, got))
                left -= len(got)
        except KestrelError as exc:
            # What the other connections opened stays in this batch; this one's is back on
            # the server with the closed connection.
            connection.close()
            self.live.retry_at[name] = now + _RECONNECT_AFTER
            log.warning("server_unavailable", queue=queue, server=name, error=str(exc)[:300])

    def _confirm_through(self, seq: int) -> None:
        live = self.live
        for number in sorted(n for n in live.open if n <= seq):
            batch = live.open.pop(number)
            for part in batch.opened.held:
                try:
                    part.connection.confirm(self.options.queue, len(part.items))
                except KestrelError as exc:
                    # The server already took them back (restart, idle timeout): they will be
                    # read again — at-least-once, the duplicates are this one batch.
                    part.connection.close()
                    log.warning("confirm_failed", queue=self.options.queue, server=part.server,
                                seq=number, items=len(part.items), error=str(exc)[:300])


def _offset(batch: _OpenBatch) -> dict:
    return {"seq": batch.seq, "items": {name: len(v) for name, v in batch.items.items()}}


# -- the sink --------------------------------------------------------------------------------


@dataclass
class KestrelCommit(WriterCommitMessage):
    server: str
    items: int


def _column_index(schema, column: str) -> int:
    from pyspark.sql.types import BinaryType, StringType

    names = [f.name for f in schema.fields]
    if column not in names:
        raise ValueError(f"kestrel sink: no column {column!r} in {names} (each row's "
                         f"{column!r} becomes one item; choose another with option('column'))")
    field = schema.fields[names.index(column)]
    if not isinstance(field.dataType, BinaryType | StringType):
        raise ValueError(f"kestrel sink: column {column!r} must be binary or string, "
                         f"not {field.dataType.simpleString()}")
    return names.index(column)


def _write_items(options: SourceOptions, column: int, batches: Iterator[Any]) -> KestrelCommit:
    """One task: every row's column value becomes one item, pipelined SETs on one server
    (tasks spread over the servers by partition id)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    index = context.partitionId() if context is not None else 0
    servers = server_set_members(options.server_set, options.connect_timeout) if options.server_set \
        else options.servers
    if not servers:
        raise ConnectionError(f"kestrel sink: the server set {options.server_set} has no ALIVE member")
    address = servers[index % len(servers)]
    connection = Connection(address, options.connect_timeout, options.io_timeout)
    stored = 0
    try:
        for batch in batches:
            values = batch.column(column).to_pylist()
            if any(v is None for v in values):
                raise ValueError(f"kestrel sink: a null in column {options.column!r} "
                                 "cannot become an item")
            stored += connection.put_many(
                options.queue, (v.encode("utf-8") if isinstance(v, str) else v for v in values))
    finally:
        connection.close()
    return KestrelCommit(str(address), stored)


class KestrelWriter(DataSourceArrowWriter):
    """``df.write.format("kestrel")``: at least once — a retried task stores its rows again."""

    def __init__(self, options: SourceOptions, column: int) -> None:
        self.options = options
        self.column = column

    def write(self, iterator):
        return _write_items(self.options, self.column, iterator)

    def commit(self, messages) -> None:
        _log_commit(self.options, messages, None)

    def abort(self, messages) -> None:
        _log_abort(self.options, messages, None)


class KestrelStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("kestrel")``: items are stored as each task writes them; a failed
    or replayed micro-batch may store some twice (at least once)."""

    def __init__(self, options: SourceOptions, column: int) -> None:
        self.options = options
        self.column = column

    def write(self, iterator):
        return _write_items(self.options, self.column, iterator)

    def commit(self, messages, batchId: int) -> None:
        _log_commit(self.options, messages, batchId)

    def abort(self, messages, batchId: int) -> None:
        _log_abort(self.options, messages, batchId)


def _log_commit(options: SourceOptions, messages, batch_id: int | None) -> None:
    """Nothing to do: every item was stored when its task wrote it."""


def _log_abort(options: SourceOptions, messages, batch_id: int | None) -> None:
    # SETs cannot be taken back: what the successful tasks stored stays (at least once).
    log.warning("sink_aborted", queue=options.queue, batch_id=batch_id,
                stored=sum(m.items for m in messages if m is not None))
