"""Server-wide counters and latency histograms: written by the queue actors and sessions, read by
the snapshot, STATS and the admin port.
"""

from __future__ import annotations

from ._server import (
    BOUNDS,
    BUCKETS,
    LATENCIES,
    MAX_FSYNC_ERROR_NAMES,
    QUEUE_METRICS,
    SERVER_METRICS,
    Histogram,
    QueueMetrics,
    ServerStats,
    bucket_index,
    record_batch,
)

__all__ = [
    "BOUNDS",
    "BUCKETS",
    "LATENCIES",
    "MAX_FSYNC_ERROR_NAMES",
    "QUEUE_METRICS",
    "SERVER_METRICS",
    "Histogram",
    "QueueMetrics",
    "ServerStats",
    "bucket_index",
    "record_batch",
]
