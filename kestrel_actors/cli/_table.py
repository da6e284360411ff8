"""A table fitted to the terminal, for ``stats`` and ``stats --server``: whole cells, columns left out
first to last until it fits."""

from __future__ import annotations

from typing import Any

__all__ = ["fitted_table"]


def fitted_table(console: Any, titles: tuple[str, ...], rows: list[list[Any]],
                 dropped_first: tuple[str, ...], **table_args: Any) -> tuple[Any, list[str]]:
    """A table of ``rows`` under ``titles`` whose every cell and title is whole: as wide as
    ``console`` allows, leaving out columns in the order of ``dropped_first`` until it fits
    (rich would cut every cell to ``…`` instead), and wrapping cells if even that is too wide.
    The first title is left-aligned, the rest right-aligned. Returns the table and the titles
    left out."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    console = console or Console()

    def build(shown: list[int], wrap: bool = False) -> Any:
        table = Table(expand=False, header_style="bold", **table_args)
        for index in shown:
            table.add_column(titles[index], justify="left" if index == 0 else "right", no_wrap=not wrap,
                             overflow="fold" if wrap else "ellipsis")
        for row in rows:
            table.add_row(*[row[index] for index in shown])
        return table

    unbounded = console.options.update_width(1_000_000)  # a table's natural width, not the console's
    shown = list(range(len(titles)))
    hidden: list[str] = []
    table = build(shown)
    for title in dropped_first:
        if Measurement.get(console, unbounded, table).maximum <= console.width:
            break
        shown.remove(titles.index(title))
        hidden.append(title)
        table = build(shown)
    if Measurement.get(console, unbounded, table).maximum > console.width:
        table = build(shown, wrap=True)  # still too wide: cells wrap onto more lines, whole
    return table, hidden
