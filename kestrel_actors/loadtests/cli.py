"""``python -m kestrel_actors.loadtests <scenario>`` and ``kestrel-actors load <scenario>``.

Scenario options keep the letters of Kestrel's ``src/scripts/load/*`` tools but one: the host is
``-H``/``--host`` (Kestrel's ``-h``), because ``-h`` is help in every ``kestrel-actors`` command.
Every scenario also takes the options in ``command.common_options``. Each scenario prints
Kestrel's report lines, a summary (ops/s, average, p50, p95, p99 and max in ms), then one JSON
line with the figures; the exit code is 0 (ok), 1 (correctness failure), 2 (usage) or 3 (the run
could not complete).
"""

from __future__ import annotations

import click

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def main() -> None:
    """Kestrel's load tests (put-many, many-clients, flood, packing, leaky-reader) plus get-many and mixed.

    Every scenario expects a server that is already running, flushes its queue(s) first
    unless given -F, prints Kestrel's report lines, a summary (ops/s; average, p50, p95, p99
    and max latency in ms) and then one JSON line of figures (--json-out, --csv: to files too).
    Exit code: 0 ok, 1 correctness failure, 2 usage error, 3 the run could not complete.
    """


def _register() -> None:
    from .scenarios import flood, get_many, leaky_reader, many_clients, mixed, packing, put_many

    for module in (put_many, get_many, mixed, many_clients, flood, packing, leaky_reader):
        main.add_command(module.command)


_register()
