"""The Spark bridge: feed batches of a Kestrel queue into PySpark jobs, confirm when durable.

A bridge is a client of one or more servers. Per server, one pykka ThreadingActor loops:

1. ``monitor <queue> <seconds> <max_items>`` opens up to ``batch_size`` items, waiting at most
   ``batch_wait`` (whole seconds on the wire, so sub-second waits round up to 1 s);
2. ``sc.parallelize(items, partitions)`` and the user's ``job(rdd, meta)``, in a job group
   cancelled after ``job_timeout``, with the connection pinged meanwhile (keep-alive);
3. the result is written durably (a queue on the same server, or
   ``<output-path>/batch=<id>/`` in JSON or Parquet with mode overwrite);
4. the connection is checked, the batch counter committed, then ``confirm <queue> <n>``.

Any failure drops the connection (the server puts the open items back at the head of the
queue) and the batch is retried with backoff under the same batch id; after ``max_failures``
failed jobs the batch goes to the dead-letter queue instead. See ``_ledger`` for the
exactly-once argument with path output, ``_output`` for what each destination promises, and
``_kestrel`` for the one seam through which all of this talks to a server (over
:mod:`kestrel_actors.client`, the project's one memcache client; ``ServerAddress`` and
``KestrelError`` here are that client's).

The package also offers ``KestrelDataSource`` (``format("kestrel")``), a PySpark Python Data
Source: a Structured Streaming source and a batch/stream sink (see ``_source``).

Importing this package does not import pyspark (that happens when a bridge starts or
``KestrelDataSource`` is first used), and the bridge never imports gevent.
"""

from ..client import KestrelError, ServerAddress
from ._batch import BatchRunner, JobFailed, JobTimedOut
from ._config import (
    BridgeConfig,
    default_state_dir,
    load_job,
    parse_duration,
    parse_key_values,
    parse_servers,
)
from ._kestrel import Connection, ConnectionLost, KeepAlive
from ._ledger import BatchLedger, LedgerLockedError, format_batch_id
from ._meta import BatchMeta, BatchResult
from ._output import NullSink, PathSink, QueueSink, Sink, make_sink
from ._progress import BridgeReport, ProgressLine
from ._runner import run_bridge
from ._spark import create_spark_session, ship_job_code, spark_defaults

__all__ = [
    "BatchLedger",
    "BatchMeta",
    "BatchResult",
    "BatchRunner",
    "BridgeConfig",
    "BridgeReport",
    "Connection",
    "ConnectionLost",
    "JobFailed",
    "JobTimedOut",
    "KeepAlive",
    "KestrelDataSource",
    "KestrelError",
    "LedgerLockedError",
    "NullSink",
    "PathSink",
    "ProgressLine",
    "QueueSink",
    "ServerAddress",
    "Sink",
    "create_spark_session",
    "default_state_dir",
    "format_batch_id",
    "load_job",
    "make_sink",
    "parse_duration",
    "parse_key_values",
    "parse_servers",
    "run_bridge",
    "ship_job_code",
    "spark_defaults",
]


def __getattr__(name: str):
    # The data source subclasses pyspark's classes: import pyspark only when it is asked for.
    if name == "KestrelDataSource":
        from ._source import KestrelDataSource

        return KestrelDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
