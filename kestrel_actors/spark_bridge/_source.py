"""``kestrel``: a PySpark Python Data Source — a Structured Streaming source and a sink.

Register it, then read and write queues like any other format::

    from kestrel_actors.spark_bridge import KestrelDataSource
    spark.dataSource.register(KestrelDataSource)
    events = (spark.readStream.format("kestrel").option("servers", "h1:22133,h2:22133")
              .option("queue", "events").option("walLocation", "/ckpt/events/kestrel-wal")
              .load())                               # value binary, queue, server, timestamp
    df.write.format("kestrel").option("queue", "out").mode("append").save()

How the source delivers (the reasoning is in docs/adr/0003-spark-data-source.md and
docs/adr/0013-spark-exactly-once.md):

* Spark keeps the stream reader in one long-lived Python process beside the driver JVM and
  calls ``latestOffset``, ``partitions`` and ``commit`` there, one at a time. That process
  holds the connections; memcache reliable reads are tied to a connection, and a server holds
  at most ``--monitor-max-items`` open items per connection, so a batch of
  ``maxItemsPerBatch`` items per server uses ``ceil(maxItemsPerBatch / itemsPerConnection)``
  connections per server.
* ``latestOffset(start)`` plans batch ``start.seq + 1``: it opens what is waiting on each
  server (with ``readAhead``, that was done on a second set of connections while Spark ran
  the previous batch: :class:`_Prefetch`), writes the batch to the write-ahead log
  (``walLocation``, :mod:`._wal`) durably, and only then confirms the items on the servers.
  The offset is ``{"seq": n, "items": {server: count}}`` (``{queue: {server: count}}`` when
  ``queue`` lists several queues, which share each batch).
* Once planned, a batch is replayed from its write-ahead file after any restart, never read
  again from the queue: ``latestOffset`` reuses a file numbered ``start.seq + 1`` it finds,
  and ``partitions`` of a batch this process did not plan reads the file. So a sink that is
  idempotent by batch id (the file sink, ``foreachBatch`` writing by batch id) gets each item
  exactly once. ``commit(end)`` (and the next ``latestOffset``) retire the files Spark has
  committed (a directory keeps two to write later batches over, :mod:`._walstore`).
* ``partitions(start, end)`` hands the executors slices of the batch's write-ahead file
  (where the items lie and their checksum), so ``read`` is a pure function of its partition:
  an executor retry reads the same rows and never touches a server.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import threading
import time
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

from ..client import KestrelError, ServerAddress
from ._buffers import BufferPool
from ._config import parse_duration, parse_servers
from ._log import lazy_logger
from ._walstore import S3_OPTIONS, WalLocation

# Spark starts two short-lived processes per query that only parse the options (``schema``,
# ``streamReader``), so what only the planner and the executors use — connections, the
# write-ahead log, the replay — is imported where it is used (ADR 0022).
if TYPE_CHECKING:
    from ..client import PackedValues
    from ..cluster import ServerSetAddress
    from ._kestrel import Connection, KeepAlive
    from ._wal import BatchPart, Prepared, SlicedItems, WalFile, WalSlice, WriteAheadLog

try:  # pyspark >= 4.2
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older pyspark: AvailableNow falls back to Spark's wrapper
    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

__all__ = ["KestrelDataSource", "KestrelPartition", "SourceOptions"]

log = lazy_logger("kestrel_actors.spark_bridge.source")

SCHEMA = "value binary, queue string, server string, timestamp timestamp"
_RECONNECT_AFTER = 1.0  # seconds before a server that failed is tried again
_IDLE_RECHECK = 0.05  # an empty look at the servers is not repeated sooner than this
_MAX_BINARY_COLUMN = 2**31 - 1  # an Arrow binary column's 32-bit offsets
# The first batch a planner process opens itself is at most this many items (all servers):
# its rows come after a short batch while the next, full one is read ahead.
FIRST_BATCH_ITEMS = 2_000

BATCH_READ_REFUSED = (
    "kestrel: a queue cannot be read as a batch (spark.read): reading takes items out of the "
    "queue, and Spark tells a batch reader nothing once the job's output is committed (a "
    "Python data source's batch reader has no commit), so the items could only be confirmed "
    "before the output is safe (lost if the job fails) or never (read again by every run). "
    "Use spark.readStream.format('kestrel') with option('walLocation', ...) and "
    ".trigger(availableNow=True): it drains what is waiting, replays a micro-batch that failed "
    "from its write-ahead log, and stops")
"""Why ``spark.read.format("kestrel")`` is refused, and what to use instead."""

# Option names as written in the docs (Spark hands them to us lower-cased or as typed).
_SOURCE_OPTIONS = ("servers", "serverSet", "queue", "walLocation", "maxItemsPerTrigger", "maxItemsPerBatch",
                   "minPartitions", "itemsPerPartition", "itemsPerConnection", "readAhead",
                   "keepAliveInterval", "connectTimeout", "ioTimeout", "serverRetryTimeout",
                   *S3_OPTIONS)
_SINK_OPTIONS = ("servers", "serverSet", "queue", "column", "connectTimeout", "ioTimeout")
# Spark's own options that reach a sink's options with the user's.
_SPARK_OPTIONS = ("path", "checkpointLocation")
# Kafka's options, with why a queue does not offer them.
_KAFKA_ONLY = {
    "startingoffsets": "a queue has no offsets to start from: reads are destructive, a reader "
                       "always gets what is waiting (the oldest first)",
    "endingoffsets": "a queue has no offsets to end at; use trigger(availableNow=True) to "
                     "drain what is waiting when the query starts and stop",
    "startingtimestamp": "a queue keeps no history to seek in",
    "failondataloss": "a queue never drops items by retention, so there is no data loss to "
                      "detect or ignore",
    "maxoffsetspertrigger": "a queue has no offsets; use maxItemsPerTrigger (items per "
                            "micro-batch across all servers)",
    "minoffsetspertrigger": "a queue has no offsets; maxItemsPerTrigger bounds a micro-batch",
    "subscribe": "name the queues with option('queue', 'q1,q2,...')",
    "subscribepattern": "name the queue with option('queue', ...)",
    "assign": "name the queue with option('queue', ...)",
    "kafka.bootstrap.servers": "name the servers with option('servers', 'host:port,...')",
}


@dataclass(frozen=True)
class SourceOptions:
    """The data source's options, parsed once (names are case-insensitive, as Spark's are)."""

    servers: tuple[ServerAddress, ...]
    queue: str
    wal_location: str | None = None
    wal: WalLocation | None = None
    """``walLocation`` parsed (its scheme checked) with the ``walS3*`` options."""
    max_items_per_trigger: int | None = None
    max_items_per_batch: int = 50_000
    min_partitions: int = 1
    items_per_partition: int = 12_500
    items_per_connection: int = 10_000
    read_ahead: bool = True
    keep_alive: float = 1.0
    column: str = "value"
    connect_timeout: float = 5.0
    io_timeout: float = 30.0
    server_retry_timeout: float = 30.0
    """``serverRetryTimeout``: how long the source goes on trying when no server can be
    reached (after the first failed attempt, which takes up to ``connectTimeout``) before it
    fails the query naming them; and how long ``availableNow`` waits for every server."""
    server_set: str | None = None
    """``serverSet``: a ZooKeeper server set (``zk://host:port/path``) whose members are the
    servers, looked up at each micro-batch plan; ``servers`` is then ignored."""

    @classmethod
    def parse(cls, options: Mapping[str, str], sink: bool = False) -> SourceOptions:
        """The options, or :class:`OptionError` whose message starts ``kestrel source: option
        X`` (or ``kestrel sink: ...``) and says what to write instead."""
        role = "sink" if sink else "source"
        lower = {str(k).lower(): str(v) for k, v in options.items()}
        _refuse_unknown([str(k) for k in options], _SINK_OPTIONS if sink else _SOURCE_OPTIONS,
                        role)
        queue = lower.get("queue", "")
        names = queue.split(",") if not sink else [queue]
        if not all(names) or any(ch in queue for ch in " /\r\n\t"):
            several = "" if sink else " (a source reads several: 'q1,q2')"
            raise OptionError(f"kestrel {role}: option queue is required and must be a queue "
                              f"name{several} (no spaces or '/'), got {queue!r}: add "
                              f"option('queue', '<name>')")
        if len(set(names)) != len(names):
            raise OptionError(f"kestrel {role}: option queue names a queue twice, got "
                              f"{queue!r}: list each queue once")

        def value(name: str, parse: Any, default: str) -> Any:
            text = lower.get(name.lower(), default)
            try:
                return parse(text)
            except ValueError as exc:
                raise OptionError(f"kestrel {role}: option {name} {exc}") from None

        server_set = lower.get("serverset") or None
        if server_set is not None:
            value("serverSet", _server_set, "")  # a bad address fails the query at once
        per_trigger = lower.get("maxitemspertrigger")
        parsed = cls(
            server_set=server_set,
            servers=() if server_set else value("servers", _servers, "127.0.0.1:22133"),
            queue=queue,
            wal_location=lower.get("wallocation") or None,
            wal=value("walLocation", lambda text: WalLocation.parse(text, lower), "")
            if lower.get("wallocation") else None,
            max_items_per_trigger=None if per_trigger is None else value(
                "maxItemsPerTrigger", _count, per_trigger),
            max_items_per_batch=value("maxItemsPerBatch", _count, str(cls.max_items_per_batch)),
            min_partitions=value("minPartitions", _count, str(cls.min_partitions)),
            items_per_partition=value("itemsPerPartition", _count, str(cls.items_per_partition)),
            items_per_connection=value("itemsPerConnection", _count,
                                       str(cls.items_per_connection)),
            read_ahead=value("readAhead", _parse_bool, "true"),
            keep_alive=value("keepAliveInterval", _duration, "1s"),
            column=lower.get("column", "value"),
            connect_timeout=value("connectTimeout", _duration, "5s"),
            io_timeout=value("ioTimeout", _duration, "30s"),
            server_retry_timeout=value("serverRetryTimeout", _duration, "30s"),
        )
        return parsed

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues a source reads: ``queue`` is a comma-separated list (Kafka's
        ``subscribe``); a sink writes to one."""
        return tuple(self.queue.split(","))

    @property
    def connections_per_server(self) -> int:
        """A server holds at most ``--monitor-max-items`` open items per connection, so a
        micro-batch of ``maxItemsPerBatch`` items per server needs this many connections."""
        return math.ceil(self.max_items_per_batch / self.items_per_connection)


class OptionError(ValueError):
    """A bad option of the source or sink: the message names it and says what to write."""


def _refuse_unknown(names: list[str], valid: tuple[str, ...], role: str) -> None:
    """Spark may hand the names lower-cased; an error quotes them as received."""
    known = {name.lower() for name in valid + _SPARK_OPTIONS}
    for name in sorted(names):
        if name.lower() in known:
            continue
        if name.lower() in _KAFKA_ONLY:
            raise OptionError(f"kestrel {role}: option {name!r} is Kafka's; "
                              f"{_KAFKA_ONLY[name.lower()]}")
        raise OptionError(f"kestrel {role}: unknown option {name!r}; the valid options are "
                          f"{', '.join(valid)}")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"must be a whole number >= 1, got {text!r}")
    return value


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"must be true or false, got {text!r}")
    return value == "true"


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError:
        raise ValueError(f"must be a duration such as 500ms, 5s or 2m, got {text!r}") from None


def _servers(text: str) -> tuple[ServerAddress, ...]:
    try:
        return parse_servers(text)
    except ValueError as exc:
        raise ValueError(f"must be host:port[,host:port...], got {text!r} ({exc})") from None


def _server_set(text: str) -> ServerSetAddress:
    from ..cluster import ServerSetAddress

    try:
        return ServerSetAddress.parse(text)
    except ValueError as exc:
        raise ValueError(f"must be zk://host:port/path, got {text!r} ({exc})") from None


class KestrelDataSource(DataSource):
    """``format("kestrel")``: stream source (``readStream``), batch and stream sink."""

    @classmethod
    def name(cls) -> str:
        return "kestrel"

    def schema(self) -> str:
        # Spark asks for the schema only to read (in ``load()``, unless the user gave one), so
        # a bad source option fails there, before ``start()``, on the line that called it.
        SourceOptions.parse(self.options)
        return SCHEMA

    def reader(self, schema) -> DataSourceReader:
        # A Python batch reader has ``partitions`` and ``read`` and nothing after them: no call
        # once the job's output is committed, none when it fails (docs/adr/0013).
        raise ValueError(BATCH_READ_REFUSED)

    def streamReader(self, schema) -> DataSourceStreamReader:
        # Never raise here: PySpark's planner then calls ``stop()`` on a reader it never got,
        # and the user reads an UnboundLocalError. A refused reader fails the query's first
        # call instead, with the option's message first.
        try:
            options = SourceOptions.parse(self.options)
        except OptionError as exc:
            return _RefusedReader(exc)
        if options.wal_location is None:
            return _RefusedReader(OptionError(
                "kestrel source: option walLocation is required for a streaming read: a "
                "directory or s3a:// prefix every restart of the query and every executor reaches, e.g. "
                "option('walLocation', '<checkpointLocation>/kestrel-wal'); each planned "
                "micro-batch is kept there so a restart replays it instead of reading the "
                "queue again (exactly once into idempotent sinks)"))
        return KestrelStreamReader(options)

    def writer(self, schema, overwrite: bool) -> KestrelWriter:
        if overwrite:
            raise ValueError("kestrel: a queue can only be appended to; use mode('append')")
        options = SourceOptions.parse(self.options, sink=True)
        return KestrelWriter(options, _column_index(schema, options.column))

    def streamWriter(self, schema, overwrite: bool) -> KestrelStreamWriter:
        # ``overwrite`` is set for the complete output mode: every micro-batch then sends the
        # whole result table again, which for a queue is simply more items.
        options = SourceOptions.parse(self.options, sink=True)
        return KestrelStreamWriter(options, _column_index(schema, options.column))


# -- the stream source -----------------------------------------------------------------------


class _RefusedReader(DataSourceStreamReader):
    """The reader of a query whose options are bad: Spark's first call fails the query."""

    def __init__(self, error: OptionError) -> None:
        self.error = error

    def _refuse(self) -> Any:
        raise self.error

    def initialOffset(self) -> dict:
        return self._refuse()

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        return self._refuse()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return self._refuse()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self._refuse()

    def commit(self, end: dict) -> None:
        self._refuse()


class KestrelPartition(InputPartition):
    """One task's share of a micro-batch: where its items (and their enqueue times) lie in
    the batch's write-ahead file (so ``read`` is pure: a retry reads the same bytes, and never
    touches a server). Its items come from one queue of one server, opened by one or more
    ``monitor`` commands."""

    def __init__(self, server: str, queue: str, items: WalSlice) -> None:
        super().__init__(None)
        self.server = server
        self.queue = queue
        self.items = items

    def __repr__(self) -> str:
        return f"KestrelPartition({self.server}, {self.queue}, {self.items.count} items)"


# server -> its ``connections_per_server`` connections
if TYPE_CHECKING:
    _ConnectionSet = dict[str, list[Connection]]


@dataclass
class _ReaderState:
    """What the planner process holds between Spark's calls: connections, planned batches.

    Two sets of connections take turns: Spark runs a batch planned (and confirmed) on one,
    while the next batch is opened ahead on the other (:class:`_Prefetch`).
    """

    sets: tuple[_ConnectionSet, _ConnectionSet]
    keep_alive: KeepAlive
    wal: WriteAheadLog
    buffers: BufferPool  # item bytes of planned batches, for the batches opened next
    planned: dict[int, _PlannedBatch] = field(default_factory=dict)
    prefetch: _Prefetch | None = None
    retry_at: dict[str, float] = field(default_factory=dict)
    idle_until: float = 0.0
    planned_any: bool = False  # this process has planned a batch from the queue
    turns: int = 0  # batches opened: which queue goes first in the next one
    # items waiting per (queue, server), last seen
    backlog: dict[tuple[str, str], int] = field(default_factory=dict)
    # server -> when the attempts that have failed since it last answered began (monotonic)
    failing_since: dict[str, float] = field(default_factory=dict)
    # Trigger.AvailableNow: per (queue, server), how many of the items waiting at the start
    # are left
    available_now: dict[tuple[str, str], int] | None = None

    @classmethod
    def start(cls, options: SourceOptions) -> _ReaderState:
        from ._kestrel import Connection, KeepAlive
        from ._wal import WriteAheadLog

        wal = WriteAheadLog(options.wal or options.wal_location or "")  # first: it may fail

        def one_set() -> _ConnectionSet:
            return {str(a): [Connection(a, options.connect_timeout, options.io_timeout)
                             for _ in range(options.connections_per_server)]
                    for a in options.servers}

        sets = (one_set(), one_set())
        keep_alive = KeepAlive(options.keep_alive)
        for connection in _all_connections(sets):
            keep_alive.add(connection)
        # A batch's buffers (one per connection and queue opened) go back once its file is
        # written, before the read-ahead opens the next batch: one batch's worth is reused.
        per_batch = (options.connections_per_server + len(options.queues)) * max(1, len(options.servers))
        return cls(sets, keep_alive, wal, BufferPool(per_batch))

    def forget_backlog(self, server: str) -> None:
        """Its backlog is unknown while the server cannot be reached."""
        for key in [key for key in self.backlog if key[1] == server]:
            del self.backlog[key]


def _all_connections(sets: tuple[_ConnectionSet, ...]) -> Iterator[Connection]:
    return (c for one in sets for per_server in one.values() for c in per_server)


@dataclass(frozen=True)
class _Held:
    """Items of one queue opened on one connection, not yet confirmed."""

    server: str
    queue: str
    connection: Connection
    read_at: float
    items: PackedValues
    buffer: bytearray  # where ``items``' bytes are (from the pool; ``items`` views it)

    @property
    def part(self) -> BatchPart:
        from ._wal import BatchPart

        return BatchPart(self.server, self.read_at, self.items, self.queue)


@dataclass
class _Opened:
    """Items opened on one connection set, as opened on each connection."""

    on: int  # index of the connection set in ``_ReaderState.sets``
    held: list[_Held] = field(default_factory=list)
    # the read-ahead's write-ahead file of these items, synced but not yet renamed into place
    prepared: Prepared | None = None

    def discard(self) -> None:
        if self.prepared is not None:
            self.prepared.discard()

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
                            items=part.items.count, error=str(exc)[:300])
                continue
            kept.held.append(part)
        if len(kept.held) == len(self.held):
            kept.prepared = self.prepared
        else:
            self.discard()  # it holds items a server has taken back
        return kept


@dataclass(frozen=True)
class _PartCount:
    """What a planned batch keeps of a part once its file is written: where its items came
    from and how many (the items are in the file, their buffers back in the pool)."""

    queue: str
    server: str
    count: int


@dataclass(frozen=True)
class _PlannedBatch:
    """A micro-batch in the write-ahead log: its items are Spark's, no longer the queue's.
    It keeps no item bytes: its slices were cut while its file was written, and anything else
    (another cut, a restart's replay) reads the file."""

    seq: int
    parts: tuple[_PartCount, ...]
    file: WalFile

    @classmethod
    def counted(cls, seq: int, parts: Iterable[BatchPart], file: WalFile) -> _PlannedBatch:
        return cls(seq, tuple(_PartCount(p.queue, p.server, p.count) for p in parts), file)

    def slices(self, step: int, wal: WriteAheadLog, queue: str) -> list[SlicedItems]:
        """The batch cut into slices of at most ``step`` items (:meth:`WalFile.slices`): those
        it was written with, or else cut from its file read again (``queue``: its parts' queue
        in a file that names none)."""
        if step == self.file.step:
            return list(self.file.sliced)
        parts, file = wal.read(self.seq, queue)
        return file.slices(parts, step)

    def counts(self, queues: tuple[str, ...]) -> dict[str, Any]:
        """Items per server (``{server: n}``), or per queue and server (``{queue: {server: n}}``)
        when the source reads several queues."""
        return _per_queue_and_server(((p.queue, p.server, p.count) for p in self.parts), queues)


def _per_queue_and_server(counts: Iterable[tuple[str, str, int]],
                          queues: tuple[str, ...]) -> dict[str, Any]:
    """Counts summed per server (one queue read: ``{server: n}``, as before several could be),
    or per queue then server (``{queue: {server: n}}``)."""
    nested: dict[str, dict[str, int]] = {}
    for queue, server, count in counts:
        per_server = nested.setdefault(queue, {})
        per_server[server] = per_server.get(server, 0) + count
    if len(queues) == 1:
        return nested.get(queues[0], {})
    return nested


class _Prefetch:
    """Opens the next batch on a thread while Spark runs the current one.

    The planner process is idle while the executors work, and opening a micro-batch's 50,000
    items costs the server and this process ~0.5–1 s; doing it then takes it off the
    micro-batch's critical path. Only Spark's calls publish what was opened: the items stay
    open on their connections, in no write-ahead file, until the next ``latestOffset`` plans
    them (or ``stop`` drops the connections and the servers take them back).
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

    def discard(self) -> None:
        """Its write-ahead file is no batch: remove it (after :meth:`wait`)."""
        if self._result is not None:
            self._result.discard()

    def join(self) -> _Opened:
        """The opened items; raises what opening raised."""
        self._thread.join()
        if self._error is not None or self._result is None:
            raise self._error or RuntimeError("read-ahead ended without a result")
        return self._result


class KestrelStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
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

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        if self.options.max_items_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_items_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: the query drains what each server holds now, then stops.
        Every server must answer: one that cannot be reached within ``serverRetryTimeout``
        fails the query (what it holds could not be drained)."""
        live, queue = self.live, self.options.queue
        left: dict[tuple[str, str], int] = {}
        started = time.monotonic()
        waiting = dict(live.sets[0])
        while True:
            for name, connections in list(waiting.items()):
                try:
                    for each, depth in connections[0].depths(self.options.queues).items():
                        left[(each, name)] = depth
                except KestrelError as exc:
                    connections[0].close()
                    live.failing_since.setdefault(name, started)
                    log.warning("server_unavailable", queue=queue, server=name,
                                error=str(exc)[:300])
                else:
                    del waiting[name]
                    live.failing_since.pop(name, None)
            if not waiting:
                break
            left_to_try = started + self.options.server_retry_timeout - time.monotonic()
            if left_to_try <= 0:
                raise self._unreachable(sorted(waiting), "availableNow")
            time.sleep(min(_RECONNECT_AFTER, left_to_try))
        live.available_now = left
        live.backlog = dict(left)

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        """Plan batch ``start.seq + 1`` (or return ``start``: nothing to read)."""
        live = self.live
        done = int(start.get("seq", 0))
        self._forget_through(done)  # Spark asks only once ``done`` is in its commit log
        seq = done + 1
        if seq in live.planned:  # asked again before that batch ran: the same answer
            return self._offset(live.planned[seq])
        if live.wal.has(seq):
            # Planned before a restart, or before a stop, but not yet in Spark's offset log:
            # it is this batch, whatever the queue holds now.
            return self._offset(self._from_wal(seq, "batch_replanned_from_wal"))
        budget = getattr(limit, "max_rows", None)
        if live.available_now is not None and not any(live.available_now.values()):
            return start  # AvailableNow: everything waiting at the start has been read
        opened = self._take_prefetch()
        if self.options.server_set:  # no read-ahead is running now: the sets may change
            from ._serverset import follow_members

            follow_members(live.sets, self.options.server_set, self.options.connect_timeout,
                           self._connections, live.keep_alive)
        if opened is None or not opened.held:
            now = time.monotonic()
            if now < live.idle_until:
                return start
            opened = self._open_all(0, self._first_batch_budget(budget))
            if not opened.held:
                self._fail_if_none_reachable()
                live.idle_until = time.monotonic() + _IDLE_RECHECK
                return start
        planned = self._plan(seq, opened)
        if planned is None:
            return start
        if budget is None and self.options.read_ahead and live.available_now is None:
            # A read limit can change between calls; only an unlimited query reads ahead.
            ahead = 1 - opened.on
            live.prefetch = _Prefetch(lambda: self._open_ahead(ahead, seq + 1))
        return self._offset(planned)

    def reportLatestOffset(self) -> dict:
        """What the query's progress shows as the source's ``latestOffset``: the last planned
        batch, the backlog (items waiting per server as last seen, reachable servers only;
        per queue, then server, when several queues are read) and which servers answered the
        last look and which could not be reached."""
        live = self.live
        planned = max(live.planned, default=0)
        servers = list(live.sets[0])
        backlog = _per_queue_and_server(
            ((queue, server, n) for (queue, server), n in live.backlog.items()), self.options.queues)
        return {"seq": planned, "backlog": backlog,
                "backlogTotal": sum(live.backlog.values()),
                "reachable": [s for s in servers if s not in live.failing_since],
                "unreachable": [s for s in servers if s in live.failing_since]}

    def partitions(self, start: dict, end: dict) -> list[KestrelPartition]:
        from ._replay import kill_point

        first, last = int(start.get("seq", 0)) + 1, int(end.get("seq", 0))
        kill_point("planned", last)
        total = sum(p.count for seq in range(first, last + 1)
                    for p in self._planned(seq).parts)
        if not total:
            return []
        step = self._step(total)
        return [KestrelPartition(each.server, each.queue, each.where)
                for seq in range(first, last + 1)
                for each in self._planned(seq).slices(step, self.live.wal, self.options.queue)]

    # Spark hands back only the partitions that partitions() made, which its types cannot say
    def read(self, partition: KestrelPartition) -> Iterator[Any]:  # type: ignore[override]
        """One Arrow record batch made from the slice's bytes as they are in the file: the
        value column's offsets come from the item lengths, its data is the items' bytes."""
        import pyarrow as pa

        from ._wal import read_slice

        packed = read_slice(partition.items)
        n = packed.count
        if not n:
            return
        if len(packed.data) > _MAX_BINARY_COLUMN:
            raise ValueError(f"kestrel source: a partition of {len(packed.data):,} bytes does "
                             "not fit one Arrow binary column (2 GiB); lower itemsPerPartition")
        # Every column is built from buffers: pa.scalar and pa.array import pandas, ~0.5 s of
        # CPU in each Python worker before its first rows. The enqueue times are as the file
        # keeps them (epoch ms), cast to Spark's microseconds.
        stamps = pa.Array.from_buffers(pa.timestamp("ms", tz="UTC"), n,
                                       [None, pa.py_buffer(packed.stamps or b"")])
        yield pa.RecordBatch.from_arrays(
            [pa.Array.from_buffers(pa.binary(), n, [None, _value_offsets(packed),
                                                    pa.py_buffer(packed.data)]),
             _repeated(partition.queue, n), _repeated(partition.server, n),
             stamps.cast(pa.timestamp("us", tz="UTC"))],
            names=["value", "queue", "server", "timestamp"])

    def commit(self, end: dict) -> None:
        self._forget_through(int(end.get("seq", 0)))

    def stop(self) -> None:
        """The query ended: items opened ahead go back to their servers with the connections
        (planned batches stay in the write-ahead log for the next run)."""
        live, self._live = self._live, None
        if live is None:
            return
        if live.prefetch is not None:
            live.prefetch.wait()  # its items go back with the connections below
            live.prefetch.discard()
        live.keep_alive.stop()
        for connection in _all_connections(live.sets):
            connection.close()
        live.wal.close()

    # helpers -------------------------------------------------------------------------------

    def _step(self, total: int) -> int:
        """Items per partition of ``total`` items: the step :meth:`partitions` cuts a batch
        by, and the one its write-ahead file is written with (so their slices are
        checksummed while the file is, :meth:`WriteAheadLog.prepare`)."""
        return min(self.options.items_per_partition,
                   math.ceil(total / self.options.min_partitions))

    def _write(self, seq: int, parts: list[BatchPart]) -> WalFile:
        return self.live.wal.write(seq, parts, self._step(sum(p.count for p in parts)))

    def _fail_if_none_reachable(self) -> None:
        """No server has answered for ``serverRetryTimeout`` since the first failed attempt
        (which itself took up to ``connectTimeout``): fail the query, naming them. While one
        server answers, the query goes on and its progress lists the others."""
        live = self.live
        servers = list(live.sets[0])
        if not servers or any(name not in live.failing_since for name in servers):
            return
        if time.monotonic() - min(live.failing_since.values()) >= self.options.server_retry_timeout:
            raise self._unreachable(servers, "the stream")

    def _unreachable(self, servers: list[str], what: str) -> ConnectionError:
        options = self.options
        return ConnectionError(
            f"kestrel source: cannot reach {', '.join(servers)} (queue {options.queue}) for "
            f"{what}: tried for connectTimeout {options.connect_timeout:g}s plus "
            f"serverRetryTimeout {options.server_retry_timeout:g}s; start the server, fix "
            f"option servers, or raise option serverRetryTimeout")

    def _connections(self, address: ServerAddress) -> list[Connection]:
        from ._kestrel import Connection

        options = self.options
        return [Connection(address, options.connect_timeout, options.io_timeout)
                for _ in range(options.connections_per_server)]

    def _offset(self, batch: _PlannedBatch) -> dict:
        return {"seq": batch.seq, "items": batch.counts(self.options.queues)}

    def _planned(self, seq: int) -> _PlannedBatch:
        live = self.live
        batch = live.planned.get(seq)
        if batch is None:
            if not live.wal.has(seq):
                raise RuntimeError(
                    f"kestrel source: micro-batch {seq} is in the query's offset log but not in "
                    f"walLocation {live.wal.location.text}: the checkpoint and its walLocation must "
                    f"stay together (was walLocation changed or emptied?)")
            # A restarted query replays its last uncommitted batch, as it was planned.
            batch = self._from_wal(seq, "batch_replayed_from_wal")
        return batch

    def _from_wal(self, seq: int, event: str) -> _PlannedBatch:
        """Batch ``seq`` as an earlier planner process planned it, read from its file; the
        items of it that a kill gave back before their confirm are taken back off the queues
        first (:func:`._replay.take_back_returned`), so the queue never delivers them again."""
        from ._kestrel import Connection
        from ._replay import ConfirmRecord, take_back_returned

        live, options = self.live, self.options
        parts, written = live.wal.read(seq, options.queue)
        take_back_returned(seq, parts, ConfirmRecord(live.wal.store, seq),
                           lambda server: Connection(ServerAddress.parse(server),
                                                     options.connect_timeout, options.io_timeout))
        # cut now, by the step partitions() cuts by, while the file's bytes are at hand
        step = self._step(sum(p.count for p in parts))
        written = dataclasses.replace(written, step=step, sliced=tuple(written.slices(parts, step)))
        batch = live.planned[seq] = _PlannedBatch.counted(seq, parts, written)
        log.info(event, queue=options.queue, seq=seq, items=batch.counts(options.queues))
        return batch

    def _plan(self, seq: int, opened: _Opened) -> _PlannedBatch | None:
        """Make the opened items batch ``seq``: durable in the write-ahead log first, then
        confirmed on their servers. None if every server had taken its items back."""
        buffers = [p.buffer for p in opened.held]
        batch = self._durable_and_confirmed(seq, opened)
        opened.held, opened.prepared = [], None
        # The items are in the file now, and nothing reads their buffers again (another cut of
        # the batch, or a replay, reads the file): the read-ahead about to start takes them.
        self.live.buffers.give_back(buffers)
        return batch

    def _durable_and_confirmed(self, seq: int, opened: _Opened) -> _PlannedBatch | None:
        from ._replay import ConfirmRecord, kill_point

        live, queue = self.live, self.options.queue
        held = opened.held
        parts = [p.part for p in held]
        prepared = opened.prepared
        if prepared is not None and prepared.file.seq == seq:
            written = live.wal.publish(prepared)  # written and synced by the read-ahead
        else:
            opened.discard()
            written = self._write(seq, parts)
        batch = _PlannedBatch.counted(seq, parts, written)
        record = ConfirmRecord(live.wal.store, seq)
        kill_point("after-wal", seq)
        returned: list[_Held] = []
        for number, part in enumerate(held):
            if number:
                kill_point("between-confirms", seq)
            if part.connection.hung_up():
                # Closed before the confirm could be sent: the server has these items back.
                part.connection.close()
                returned.append(part)
                continue
            try:
                part.connection.confirm(part.queue, part.items.count)
                record.add(part.part)
            except KestrelError as exc:
                # Sent, but no answer: it may or may not have landed. The items stay in the
                # batch (never lost); if the server had not applied it they come again
                # (ADR 0013's window).
                part.connection.close()
                log.warning("confirm_uncertain", queue=queue, server=part.server, seq=seq,
                            items=part.items.count, error=str(exc)[:300])
        if returned:
            gone = {id(p) for p in returned}
            kept = [p.part for p in held if id(p) not in gone]
            log.warning("batch_items_returned", queue=queue, seq=seq,
                        items=sum(p.items.count for p in returned))
            if not kept:
                live.wal.remove(seq)
                return None
            batch = _PlannedBatch.counted(seq, kept, self._write(seq, kept))
        kill_point("after-confirms", seq)
        live.planned[seq] = batch
        live.planned_any = True
        return batch

    def _forget_through(self, seq: int) -> None:
        from ._replay import ConfirmRecord

        live = self.live
        for number in [n for n in live.planned if n <= seq]:
            del live.planned[number]
        live.wal.remove_through(seq)
        ConfirmRecord.remove_through(live.wal.store, seq)

    def _take_prefetch(self) -> _Opened | None:
        live = self.live
        prefetch, live.prefetch = live.prefetch, None
        if prefetch is None:
            return None
        try:
            return prefetch.join().still_held(self.options.queue)
        except Exception as exc:  # noqa: BLE001 - its items go back with its connections
            for connection in _all_connections(live.sets):
                connection.close()  # nothing else is open: planned batches are confirmed
            log.warning("prefetch_failed", queue=self.options.queue, error=repr(exc)[:300])
            return None

    def _first_batch_budget(self, budget: int | None) -> int | None:
        """A planner process's first batch is small: its rows reach the sink after a short
        batch (the JVM and the Python workers are busy starting then), and the read-ahead
        opens the next, full batch meanwhile."""
        if self.live.planned_any:
            return budget
        return min(FIRST_BATCH_ITEMS, budget if budget is not None else FIRST_BATCH_ITEMS)

    def _open_ahead(self, on: int, seq: int) -> _Opened:
        """The read-ahead: open the next batch and write its write-ahead file under its
        temporary name, so planning it only renames the file (and confirms)."""
        opened = self._open_all(on, None)
        if opened.held:
            parts = [p.part for p in opened.held]
            opened.prepared = self.live.wal.prepare(seq, parts,
                                                    self._step(sum(p.count for p in parts)))
        return opened

    def _open_all(self, on: int, budget: int | None) -> _Opened:
        """Open the next batch on connection set ``on``: up to ``maxItemsPerBatch`` per server
        (and ``budget`` in all, if Spark gives a read limit)."""
        opened = _Opened(on)
        now = time.monotonic()
        # Several queues share a batch's room in turn: each batch starts at the next queue, so
        # a full queue never keeps the others waiting.
        queues = self.options.queues
        turn = self.live.turns % len(queues)
        self.live.turns += 1
        queues = queues[turn:] + queues[:turn]
        for name, connections in self.live.sets[on].items():
            cap = self.options.max_items_per_batch
            if budget is not None:
                cap = min(cap, budget - sum(p.items.count for p in opened.held))
                if cap <= 0:
                    break
            self._open(name, connections, queues, cap, now, opened.held)
        return opened

    def _open(self, name: str, connections: list[Connection], queues: tuple[str, ...],
              cap: int, now: float, held: list[_Held]) -> None:
        """Open up to ``cap`` of what one server has waiting in ``queues`` (in that order),
        ``itemsPerConnection`` of a queue on each of its connections in turn (one ``stats``,
        then one ``monitor`` per connection and queue), each item with its enqueue time."""
        live = self.live
        if now < live.retry_at.get(name, 0.0):
            return
        target = live.available_now
        connection = connections[0]
        try:
            depths = connection.depths(queues)
            live.failing_since.pop(name, None)
            for queue, depth in depths.items():
                live.backlog[(queue, name)] = depth
            for queue in queues:
                left = min(cap, depths[queue])
                if target is not None:
                    left = min(left, target.get((queue, name), 0))
                for connection in connections:
                    if left <= 0:
                        break
                    buffer = live.buffers.take()
                    got = connection.open_waiting(
                        queue, min(self.options.items_per_connection, left), stamped=True,
                        into=buffer)
                    if not got.count:
                        break  # another reader took them first
                    read_at = time.time()
                    held.append(_Held(name, queue, connection, read_at,
                                      got.stamps_or(int(read_at * 1000)), buffer))
                    left -= got.count
                    cap -= got.count
                    live.backlog[(queue, name)] = max(0, live.backlog[(queue, name)] - got.count)
                    if target is not None:
                        target[(queue, name)] -= got.count
                if cap <= 0:
                    break
        except KestrelError as exc:
            # What the other connections opened stays in this batch; this one's is back on
            # the server with the closed connection.
            connection.close()
            live.retry_at[name] = now + _RECONNECT_AFTER
            live.failing_since.setdefault(name, now)
            live.forget_backlog(name)
            log.warning("server_unavailable", queue=self.options.queue, server=name,
                        error=str(exc)[:300])


def _value_offsets(packed: PackedValues) -> Any:
    """The Arrow buffer of a binary column's offsets (int32, one more than the values) from
    the values' lengths, summed by Arrow: a Python running sum costs ~0.05 µs per row."""
    import pyarrow as pa
    import pyarrow.compute as pc  # imported by the timestamp column's cast anyway

    count = packed.count
    if sys.byteorder != "little":  # the file's lengths are little-endian; Arrow's are native
        return pa.py_buffer(array("i", accumulate(packed.sizes(), initial=0)))
    # The sums fit an int32 (read() refuses a column over 2 GiB), so their uint32 bytes are
    # the offsets after the first, 0.
    sums = pc.cumulative_sum(pa.Array.from_buffers(pa.uint32(), count,
                                                   [None, pa.py_buffer(packed.lengths)]))
    offsets = bytearray(4 * (count + 1))
    offsets[4:] = memoryview(sums.buffers()[1])[:4 * count]
    return pa.py_buffer(offsets)


@functools.lru_cache(maxsize=16)
def _repeated(text: str, count: int) -> Any:
    """An Arrow string column of ``count`` times ``text``, made from its buffers. A worker
    reads partition after partition of the same queues and servers and sizes, and a column
    is immutable: it is made once for them (~0.06 µs per row each time)."""
    import pyarrow as pa

    value = text.encode("utf-8")
    offsets = array("i", range(0, (count + 1) * len(value), len(value))) if value \
        else array("i", bytes(4 * (count + 1)))
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(value * count)])


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

    from ._kestrel import Connection
    from ._serverset import server_set_members

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
