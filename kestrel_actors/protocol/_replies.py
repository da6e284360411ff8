"""DUMP_STATS and DUMP_CONFIG replies, composed from the answers the queues gathered (behaviour §7.3).

STATS itself is ``stats_reply`` over ``kestrel_actors.snapshot``'s memcache lines (one source
for memcache, ``/stats.json`` and ``/metrics``). ``queues`` are ``QueueStats`` answers: each has
a ``name`` and its ``lines``.
"""

from __future__ import annotations

from typing import Any

from ..queue_name import name_bytes
from ._memcache import END

__all__ = ["compose_dump_config", "compose_dump_stats", "config_settings"]

QueueStats = Any


def compose_dump_stats(names: tuple[str, ...], queues: list[QueueStats]) -> bytes:
    """One ``queue '<name>' {`` block per name (every queue if none were named), then END."""
    by_name = {queue.name: queue.lines for queue in queues}
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
            settings = config_settings(config)
            kind = "queue"
        body = "\r\n  ".join(f"{key}={value}" for key, value in settings)
        blocks.append(f"{kind} '{name}' {{\r\n  {body}\r\n}}")
    return name_bytes("\r\n".join(blocks)) + b"\r\n" + END


def config_settings(config: Any) -> list[tuple[str, str]]:
    """A queue's effective settings as ``dump_config`` (and the admin page) shows them."""
    return [(key, _config_value(value)) for key, value in vars(config).items()]


def _config_value(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
