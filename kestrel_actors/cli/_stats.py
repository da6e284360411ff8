"""``kestrel-actors stats``: a server's figures in the terminal, from its admin port's /stats.json.

Once by default; with ``--watch`` a table that refreshes in place, like ``top`` (rich's Live
display), with rates in and out computed between two readings, cut to the terminal's height
(a last line counts the queues left out). ``--sort COLUMN`` (``-r`` reverses) and
``--filter TEXT`` choose the queues and their order in both.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any, NamedTuple

import click

from ._errors import describe, fail
from ._table import fitted_table

__all__ = ["stats"]


def fetch(host: str, port: int, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{host}:{port}/stats.json", timeout=timeout) as response:
        return json.load(response)


class Reading:
    """One /stats.json document and when it was read."""

    def __init__(self, stats: dict[str, Any], taken: float) -> None:
        self.stats = stats
        self.taken = taken


def _per_second(now: Reading, before: Reading | None, key: str) -> float | None:
    """The counter ``key``'s rate between two readings; ``None`` with only one."""
    if before is None or key not in before.stats["counters"] or now.taken <= before.taken:
        return None
    per_second = (now.stats["counters"].get(key, 0) - before.stats["counters"][key]) / (now.taken - before.taken)
    return max(per_second, 0.0)


def _rate(now: Reading, before: Reading | None, key: str) -> str:
    return _show_rate(_per_second(now, before, key))


def _show_rate(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"


def _age(msec: float, created: float) -> str:
    """Kestrel's age: since the last item read was added; none read yet shows as "–"."""
    if msec <= 0 or msec > (time.time() - created + 1) * 1000:
        return "–"
    return _duration(msec)


def _oldest(row: QueueRow) -> str:
    """How long the head item has waited; "–" for an empty queue."""
    return _duration(row.oldest) if row.items else "–"


def _duration(msec: float) -> str:
    if msec < 1000:
        return f"{msec:.0f} ms"
    seconds = msec / 1000
    for limit, divisor, unit in ((60, 1, "s"), (3600, 60, "min"), (86400, 3600, "h")):
        if seconds < limit:
            return f"{seconds / divisor:.1f} {unit}"
    return f"{seconds / 86400:.1f} d"


class QueueRow(NamedTuple):
    """One queue's line of the table, with the values it sorts by."""

    queue: str
    items: int
    bytes: int
    oldest: int
    """Milliseconds the head item has waited (``q/<name>/oldest_item_age_msec``)."""
    age: int
    created: int
    in_rate: float | None
    out_rate: float | None
    open: int
    waiters: int
    journal: int
    journal_failing: bool
    """The queue's journal cannot write (a full disk): its Journal cell says so."""


SORT_COLUMNS = {
    "queue": "queue", "items": "items", "bytes": "bytes", "oldest": "oldest", "age": "age",
    "in": "in_rate", "out": "out_rate", "open": "open", "waiters": "waiters", "journal": "journal",
}
"""``--sort`` names (the columns' titles) and the :class:`QueueRow` field each sorts by."""


class View(NamedTuple):
    """Which queues the table shows, in what order, and how many rows fit."""

    sort: str = "queue"
    reverse: bool = False
    filter: str = ""
    height: int | None = None
    """The terminal's lines (``--watch``): rows beyond them become one "N more" line."""


def queue_rows(now: Reading, before: Reading | None, view: View) -> list[QueueRow]:
    """The queues whose name holds ``view.filter`` (any case), sorted: names A to Z, figures
    largest first (as ``top``); ``view.reverse`` turns either round."""
    gauges = now.stats["gauges"]
    needle = view.filter.casefold()
    rows = []
    for key in gauges:
        if not (key.startswith("q/") and key.endswith("/items")):
            continue
        name = key[2:-len("/items")]
        if needle not in name.casefold():
            continue

        def q(stat: str, name: str = name) -> int:
            return int(gauges.get(f"q/{name}/{stat}", 0))
        rows.append(QueueRow(
            name, q("items"), q("bytes"), q("oldest_item_age_msec"), q("age_msec"), q("create_time"),
            _per_second(now, before, f"q/{name}/put_items"), _per_second(now, before, f"q/{name}/get_items_hit"),
            q("open_transactions"), q("waiters"), q("journal_size"), q("journal_failing") > 0,
        ))
    field = SORT_COLUMNS[view.sort]
    rows.sort(key=lambda row: row.queue)
    if field != "queue":
        rows.sort(key=lambda row: -1.0 if getattr(row, field) is None else getattr(row, field), reverse=True)
    return rows[::-1] if view.reverse else rows


TABLE_CHROME = 4
"""Lines of the table that are not rows: its top border, titles, the rule under them, its bottom."""


_WHOLE_TABLE = View()


def render(now: Reading, before: Reading | None, where: str, view: View = _WHOLE_TABLE, console: Any = None) -> Any:
    """The summary line and the per-queue table of one reading (rates against ``before``),
    cut to ``view.height`` lines (measured on ``console``) with a last line saying how many
    more queues there are."""
    from rich.console import Group
    from rich.text import Text

    gauges = now.stats["gauges"]
    labels = now.stats["labels"]
    status = labels.get("status", "?")
    colour = {"Up": "green", "WriteAvoid": "yellow", "ReadOnly": "yellow"}.get(status, "red")
    header = Text.assemble(
        ("kestrel-actors ", "bold"), (where, "dim"), "  ", (f" {status} ", f"bold white on {colour}"),
        f"  version {labels.get('version', '?')}  up {int(gauges.get('uptime', 0))} s  ",
        f"connections {int(gauges['connections']):,}  items {int(gauges['items']):,}  "
        f"bytes {_bytes(gauges['bytes'])}  sets/s {_rate(now, before, 'cmd_set')}  "
        f"gets/s {_rate(now, before, 'get_hits')}",
    )
    failing = sorted(key[2:-len("/journal_failing")] for key, value in gauges.items()
                     if key.startswith("q/") and key.endswith("/journal_failing") and value)
    if failing:  # the status stays Up on a full disk: the header says what is wrong
        header.append(f"\njournal write failing: {', '.join(failing)}", style="bold red")
    rows = queue_rows(now, before, view)
    if not rows:
        return Group(header, Text("no queue matches the filter" if view.filter else "no queues", style="dim"))
    shown = rows
    if view.height is not None and console is not None:
        header_lines = len(console.render_lines(header, console.options, pad=False))
        # one line spare: a frame as tall as the terminal would scroll it
        room = max(1, view.height - header_lines - TABLE_CHROME - 1)
        if len(rows) > room:
            shown = rows[: max(1, room - 1)]  # and a line for "N more"
    cells = [[row.queue, f"{row.items:,}", _bytes(row.bytes), _oldest(row), _age(row.age, row.created),
              _show_rate(row.in_rate), _show_rate(row.out_rate), f"{row.open:,}", f"{row.waiters:,}",
              Text("FAILING", style="bold red") if row.journal_failing else _bytes(row.journal)]
             for row in shown]
    table, hidden = fitted_table(console, _TITLES, cells, _DROPPED_FIRST)
    parts: list[Any] = [header, table]
    if hidden:
        parts.append(Text(f"not shown at this width: {', '.join(hidden)} (a wider terminal shows them)", style="dim"))
    if len(shown) < len(rows):
        parts.append(Text(f"{len(rows) - len(shown):,} more (not shown): --filter, or a taller terminal", style="dim"))
    return Group(*parts)


_TITLES = ("Queue", "Items", "Bytes", "Oldest", "Age", "In/s", "Out/s", "Open", "Waiters", "Journal")
_DROPPED_FIRST = ("Journal", "Age", "Waiters", "Bytes", "Open", "In/s", "Out/s")
"""The columns a narrow terminal leaves out, first to go first: Queue, Items and Oldest stay."""


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The server's host.")
@click.option("--port", default=2223, show_default=True, type=click.IntRange(1, 65535),
              help="The server's admin HTTP port (serve --admin-port).")
@click.option("--watch", is_flag=True, help="Refresh in place until interrupted, like top.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between refreshes with --watch.")
@click.option("--count", default=0, type=click.IntRange(min=0),
              help="With --watch: stop after this many refreshes (0: never).")
@click.option("--sort", "sort", default="queue", show_default=True, type=click.Choice(list(SORT_COLUMNS)),
              help="The column to sort by: names A to Z, figures largest first.")
@click.option("-r", "--reverse", is_flag=True, help="Reverse the order of --sort.")
@click.option("--filter", "name_filter", default="", metavar="TEXT",
              help="Only the queues whose name holds TEXT (any case).")
@click.option("-s", "--server", "servers", multiple=True,
              help="Instead of one admin port: the memcache stats of these servers (host:port; "
                   "repeat), or of a ZooKeeper server set's members (zk://host:port/path).")
def stats(host: str, port: int, watch: bool, interval: float, count: int, sort: str, reverse: bool,
          name_filter: str, servers: tuple[str, ...]) -> None:
    """Show a server's queues and figures (from its admin port's /stats.json), or a line per
    server of a pool or server set (--server).

    Exit codes: 0 shown, 2 usage error, 3 the admin port could not be read."""
    from rich.console import Console

    console = Console()
    if servers:
        from ._cluster_stats import show_cluster

        show_cluster(console, servers)
        return
    where = f"{host}:{port}"
    if not watch:
        try:
            reading = Reading(fetch(host, port), time.monotonic())
        except (OSError, ValueError, http.client.HTTPException) as exc:
            fail(f"cannot read http://{where}/stats.json: {describe(exc)}")
        console.print(render(reading, None, where, View(sort, reverse, name_filter)))
        return
    from rich.live import Live
    from rich.text import Text

    before: Reading | None = None
    shown = 0
    with Live(Text("connecting…"), console=console, auto_refresh=False, screen=False) as live:
        try:
            while True:
                try:
                    now = Reading(fetch(host, port), time.monotonic())
                    view = View(sort, reverse, name_filter, console.size.height)
                    live.update(render(now, before, where, view, console), refresh=True)
                    before = now
                except (OSError, ValueError, http.client.HTTPException) as exc:
                    live.update(Text(f"cannot read http://{where}/stats.json: {describe(exc)}", style="red"),
                                refresh=True)
                shown += 1
                if count and shown >= count:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return
