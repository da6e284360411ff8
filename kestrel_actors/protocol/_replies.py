"""STATS, DUMP_STATS and DUMP_CONFIG replies, composed from the answers the queues gathered (§7.3)."""

from __future__ import annotations

import os
import time
from typing import Any

from .._names import name_bytes
from ._memcache import END, stats_reply

__all__ = ["compose_dump_config", "compose_dump_stats", "compose_stats"]

QueueStats = tuple[str, list[tuple[str, object]]]


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 30


def compose_stats(stats: Any, config: Any, version: str, queues: list[QueueStats]) -> bytes:
    """Global stats in Kestrel's order, then ``queue_<name>_<stat>`` for every queue and alias.

    ``reserved_memory_ratio`` divides the queues' ``max_memory_size`` by physical memory, the
    nearest thing a Python process has to the JVM's max heap.
    """
    real = [(name, dict(lines)) for name, lines in queues if "items" in dict(lines)]
    reserved = sum(config.queue_config(name).max_memory_size for name, _ in real)
    now = time.time()
    lines: list[tuple[str, object]] = [
        ("uptime", int(now - stats.start_time)),
        ("time", int(now)),
        ("version", version),
        ("curr_items", sum(values["items"] for _, values in real)),
        ("total_items", stats.total_items),
        ("bytes", sum(values["bytes"] for _, values in real)),
        ("reserved_memory_ratio", "%.3f" % (reserved / _physical_memory())),
        ("curr_connections", stats.curr_connections),
        ("total_connections", stats.total_connections),
        ("cmd_get", stats.cmd_get),
        ("cmd_set", stats.cmd_set),
        ("cmd_peek", stats.cmd_peek),
        ("get_hits", stats.get_hits),
        ("get_misses", stats.get_misses),
        ("bytes_read", stats.bytes_read),
        ("bytes_written", stats.bytes_written),
        ("queue_creates", stats.queue_creates),
        ("queue_deletes", stats.queue_deletes),
        ("queue_expires", stats.queue_expires),
    ]
    for name, queue_lines in queues:
        lines.extend((f"queue_{name}_{stat}", value) for stat, value in queue_lines)
    return stats_reply(lines)


def compose_dump_stats(names: tuple[str, ...], queues: list[QueueStats]) -> bytes:
    """One ``queue '<name>' {`` block per name (every queue if none were named), then END."""
    by_name = dict(queues)
    chosen = names or tuple(by_name)
    blocks = []
    for name in chosen:
        body = "\r\n  ".join(f"{stat}={value}" for stat, value in by_name.get(name, ()))
        blocks.append(f"queue '{name}' {{\r\n  {body}\r\n}}")
    return name_bytes("\r\n".join(blocks)) + b"\r\n" + END


def compose_dump_config(configs: list[tuple[str, Any]]) -> bytes:
    """``dump_config``: one block per queue with its effective settings, one per alias.

    Kestrel's guide lists the command (its code lost it); the block format is DUMP_STATS's.
    Durations are seconds and sizes bytes, as ``docs/configuration.md`` names them.
    """
    blocks = []
    for name, config in sorted(configs, key=lambda entry: entry[0]):
        if isinstance(config, tuple):
            settings = [("destinations", ",".join(config))]
            kind = "alias"
        else:
            settings = [(key, _config_value(value)) for key, value in vars(config).items()]
            kind = "queue"
        body = "\r\n  ".join(f"{key}={value}" for key, value in settings)
        blocks.append(f"{kind} '{name}' {{\r\n  {body}\r\n}}")
    return name_bytes("\r\n".join(blocks)) + b"\r\n" + END


def _config_value(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
