"""``kestrel-actors stats --server``: one line per server of a pool or a server set, from each
one's memcache ``stats`` (a server set publishes memcache endpoints, not admin ports)."""

from __future__ import annotations

from typing import Any

from ._errors import describe, fail
from ._table import fitted_table

__all__ = ["show_cluster"]

_COLUMNS = {"uptime": "uptime", "curr_items": "items", "curr_connections": "conns",
            "total_items": "total items", "cmd_get": "gets", "cmd_set": "sets", "zookeeper_state": "zk",
            "zookeeper_read_member": "read set", "zookeeper_write_member": "write set"}
"""The memcache ``stats`` shown, and their titles (short, so that 80 columns hold the table)."""


def show_cluster(console: Any, servers: tuple[str, ...]) -> None:
    from ..client import Client, KestrelError
    from ._client import logs_to_stderr

    logs_to_stderr()
    try:
        with Client(list(servers)) as client:
            everyone = [str(server) for server in client.servers]
            found = client.stats()
    except (KestrelError, ValueError) as exc:
        fail(describe(exc))
    titles = ("server", *_COLUMNS.values(), "failing")
    rows = []
    for address in everyone:
        figures = found.get(address)
        if figures is None:
            rows.append([f"{address} unreachable", *[""] * (len(_COLUMNS) + 1)])
        else:
            rows.append([address, *[figures.get(column, "–") for column in _COLUMNS], _failing(figures)])
    table, hidden = fitted_table(console, titles, rows, _DROPPED_FIRST,
                                 title=f"{len(everyone)} server(s): {', '.join(servers)}")
    console.print(table)
    if hidden:
        console.print(f"not shown at this width: {', '.join(hidden)} (a wider terminal shows them)", style="dim")


_DROPPED_FIRST = ("gets", "sets", "total items", "conns", "uptime")
"""What a narrow terminal leaves out first: the server, its items, its failing journals and its
memberships stay."""


def _failing(figures: dict[str, str]) -> str:
    """How many of a server's queues cannot write their journal (``queue_<name>_journal_failing``)."""
    count = sum(1 for name, value in figures.items()
                if name.startswith("queue_") and name.endswith("_journal_failing") and value != "0")
    return f"[bold red]{count}[/]" if count else "0"
