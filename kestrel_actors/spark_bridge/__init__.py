"""The Spark bridge: feed batches of a Kestrel queue into PySpark jobs, confirm when durable.

A bridge is a client of one or more servers. Per server, one pykka ThreadingActor loops:

1. ``monitor <queue> <seconds> <max_items>`` opens up to ``batch_size`` items, waiting at most
   ``batch_wait`` (whole seconds on the wire, so sub-second waits round up to 1 s);
2. ``sc.parallelize(items, partitions)`` and the user's ``job(rdd, meta)``;
3. the result is written durably (a queue on the same server, or
   ``<output-path>/batch=<id>/`` in JSON or Parquet with mode overwrite);
4. the batch counter is committed, then ``confirm <queue> <n>``.

Any failure drops the connection (the server puts the open items back at the head of the
queue) and the batch is retried with backoff under the same batch id. See ``_ledger`` for the
exactly-once argument with path output, ``_output`` for what each destination promises.

Importing this package does not import pyspark (that happens when a bridge starts), and the
bridge never imports gevent.
"""

from ._batch import BatchMeta, BatchResult, BatchRunner
from ._client import (
    KestrelClient,
    KestrelConnectionError,
    KestrelError,
    KestrelProtocolError,
    KestrelReplyError,
    ServerAddress,
)
from ._config import (
    BridgeConfig,
    default_state_dir,
    load_job,
    parse_duration,
    parse_key_values,
    parse_servers,
)
from ._ledger import BatchLedger, LedgerLockedError, format_batch_id
from ._output import NullSink, PathSink, QueueSink, Sink, make_sink
from ._progress import BridgeReport, ProgressLine
from ._runner import run_bridge
from ._session import create_spark_session, spark_defaults

__all__ = [
    "BatchLedger",
    "BatchMeta",
    "BatchResult",
    "BatchRunner",
    "BridgeConfig",
    "BridgeReport",
    "KestrelClient",
    "KestrelConnectionError",
    "KestrelError",
    "KestrelProtocolError",
    "KestrelReplyError",
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
    "spark_defaults",
]
