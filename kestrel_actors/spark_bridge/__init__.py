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

from .._lazy import lazy_face

# Each name's private module, imported on first use: Spark imports ``_source`` (and so this
# package) in every Python process that runs the ``kestrel`` data source — its planners and
# each executor's Python workers — and the bridge's modules (the ledger, the journal) would
# add ~0.5 s to each of those starts.
_HOMES = {
    "KestrelError": "..client", "ServerAddress": "..client",
    "BatchRunner": "._batch", "JobFailed": "._batch", "JobTimedOut": "._batch",
    "BridgeConfig": "._config", "default_state_dir": "._config", "load_job": "._config",
    "parse_duration": "._config", "parse_key_values": "._config", "parse_servers": "._config",
    "Connection": "._kestrel", "ConnectionLost": "._kestrel", "KeepAlive": "._kestrel",
    "BatchLedger": "._ledger", "LedgerLockedError": "._ledger", "format_batch_id": "._ledger",
    "NullSink": "._output", "PathSink": "._output", "QueueSink": "._output", "Sink": "._output",
    "make_sink": "._output",
    "BatchMeta": "._meta", "BatchResult": "._meta",
    "BridgeReport": "._progress", "ProgressLine": "._progress",
    "run_bridge": "._runner",
    "create_spark_session": "._spark", "ship_job_code": "._spark", "spark_defaults": "._spark",
    # subclasses pyspark's classes: pyspark is imported only when it is asked for
    "KestrelDataSource": "._source",
}

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


__getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, __all__)
