"""``kestrel-actors stats``: a server's figures in the terminal, from its admin port's /stats.json.

Once by default; with ``--watch`` a table that refreshes in place, like ``top`` (rich's Live
display), with rates in and out computed between two readings.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import click

__all__ = ["stats"]


def fetch(host: str, port: int, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{host}:{port}/stats.json", timeout=timeout) as response:
        return json.load(response)


class Reading:
    """One /stats.json document and when it was read."""

    def __init__(self, stats: dict[str, Any], taken: float) -> None:
        self.stats = stats
        self.taken = taken


def _rate(now: Reading, before: Reading | None, key: str) -> str:
    if before is None or key not in before.stats["counters"] or now.taken <= before.taken:
        return "–"
    per_second = (now.stats["counters"].get(key, 0) - before.stats["counters"][key]) / (now.taken - before.taken)
    return f"{max(per_second, 0.0):,.1f}"


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
    if msec < 1000:
        return f"{msec:.0f} ms"
    seconds = msec / 1000
    for limit, divisor, unit in ((60, 1, "s"), (3600, 60, "min"), (86400, 3600, "h")):
        if seconds < limit:
            return f"{seconds / divisor:.1f} {unit}"
    return f"{seconds / 86400:.1f} d"


def render(now: Reading, before: Reading | None, where: str) -> Any:
    """The summary line and the per-queue table of one reading (rates against ``before``)."""
    from rich.console import Group
    from rich.table import Table
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
    table = Table(expand=False, header_style="bold")
    for title in ("Queue", "Items", "Bytes", "Age", "In/s", "Out/s", "Open", "Waiters", "Journal"):
        table.add_column(title, justify="left" if title == "Queue" else "right", no_wrap=True)
    names = sorted(key[2:-len("/items")] for key in gauges if key.startswith("q/") and key.endswith("/items"))
    for name in names:
        def q(stat: str) -> float:
            return gauges[f"q/{name}/{stat}"]
        table.add_row(
            name, f"{int(q('items')):,}", _bytes(q("bytes")), _age(q("age_msec"), q("create_time")),
            _rate(now, before, f"q/{name}/put_items"), _rate(now, before, f"q/{name}/get_items_hit"),
            f"{int(q('open_transactions')):,}", f"{int(q('waiters')):,}", _bytes(q("journal_size")),
        )
    if not names:
        return Group(header, Text("no queues", style="dim"))
    return Group(header, table)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The server's host.")
@click.option("--port", default=2223, show_default=True, type=click.IntRange(1, 65535),
              help="The server's admin HTTP port (serve --admin-port).")
@click.option("--watch", is_flag=True, help="Refresh in place until interrupted, like top.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between refreshes with --watch.")
@click.option("--count", default=0, type=click.IntRange(min=0),
              help="With --watch: stop after this many refreshes (0: never).")
@click.option("-s", "--server", "servers", multiple=True,
              help="Instead of one admin port: the memcache stats of these servers (host:port; "
                   "repeat), or of a ZooKeeper server set's members (zk://host:port/path).")
def stats(host: str, port: int, watch: bool, interval: float, count: int, servers: tuple[str, ...]) -> None:
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
            click.echo(f"kestrel-actors stats: cannot read http://{where}/stats.json: {exc!r}", err=True)
            sys.exit(3)
        console.print(render(reading, None, where))
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
                    live.update(render(now, before, where), refresh=True)
                    before = now
                except (OSError, ValueError, http.client.HTTPException) as exc:
                    live.update(Text(f"cannot read http://{where}/stats.json: {exc}", style="red"), refresh=True)
                shown += 1
                if count and shown >= count:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return
