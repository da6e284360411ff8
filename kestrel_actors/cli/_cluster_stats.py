"""``kestrel-actors stats --server``: one line per server of a pool or a server set, from each
one's memcache ``stats`` (a server set publishes memcache endpoints, not admin ports)."""

from __future__ import annotations

import sys
from typing import Any

import click

__all__ = ["show_cluster"]

_COLUMNS = ("uptime", "curr_items", "curr_connections", "total_items", "cmd_get", "cmd_set",
            "zookeeper_state", "zookeeper_read_member", "zookeeper_write_member")


def show_cluster(console: Any, servers: tuple[str, ...]) -> None:
    from rich.table import Table

    from ..client import Client, KestrelError
    from ._client import logs_to_stderr

    logs_to_stderr()
    try:
        with Client(list(servers)) as client:
            everyone = [str(server) for server in client.servers]
            found = client.stats()
    except (KestrelError, ValueError) as exc:
        click.echo(f"kestrel-actors: {exc}", err=True)
        sys.exit(3)
    table = Table(title=f"{len(everyone)} server(s): {', '.join(servers)}")
    table.add_column("server")
    for column in _COLUMNS:
        table.add_column(column.replace("zookeeper_", "zk_"), justify="right")
    table.add_column("failing", justify="right")
    for address in everyone:
        figures = found.get(address)
        if figures is None:
            table.add_row(address, *["unreachable"] + [""] * len(_COLUMNS))
        else:
            table.add_row(address, *[figures.get(column, "–") for column in _COLUMNS], _failing(figures))
    console.print(table)


def _failing(figures: dict[str, str]) -> str:
    """How many of a server's queues cannot write their journal (``queue_<name>_journal_failing``)."""
    count = sum(1 for name, value in figures.items()
                if name.startswith("queue_") and name.endswith("_journal_failing") and value != "0")
    return f"[bold red]{count}[/]" if count else "0"
