"""``kestrel-actors serve``: run the server in the foreground until SIGTERM, SIGINT or shutdown."""

from __future__ import annotations

import sys

import click

MIB = 1024 * 1024


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=22133, show_default=True, type=int, help="Memcache protocol port.")
@click.option("--data-dir", default="./data", show_default=True, type=click.Path(file_okay=False),
              help="Directory of the queue journals.")
@click.option("--log-format", type=click.Choice(["console", "json"]), default="console", show_default=True)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@click.option("--max-open-transactions", default=1, show_default=True, type=click.IntRange(min=0),
              help="Open (tentative) reads a connection may hold per queue.")
@click.option("--max-item-bytes", default=64 * MIB, show_default=True, type=click.IntRange(min=0),
              help="Largest data block a SET may declare; larger is CLIENT_ERROR and a close.")
@click.option("--monitor-max-items", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Most items one monitor command may hold open.")
@click.option("--max-connections", default=20_000, show_default=True, type=click.IntRange(min=1))
@click.option("--expiration-timer-frequency", default=1.0, show_default=True, type=float,
              help="Seconds between background expiry sweeps (0 disables them).")
def serve(host, port, data_dir, log_format, log_level, max_open_transactions, max_item_bytes,
          monitor_max_items, max_connections, expiration_timer_frequency) -> None:
    """Run a kestrel-actors server in the foreground."""
    from ..config import ServerConfig
    from ..logs import configure_logging
    from ..server import Server, StartupError

    configure_logging(log_format, log_level)
    config = ServerConfig(
        host=host,
        port=port,
        data_dir=data_dir,
        max_open_transactions=max_open_transactions,
        max_item_bytes=max_item_bytes,
        monitor_max_items=monitor_max_items,
        max_connections=max_connections,
        expiration_timer_frequency=expiration_timer_frequency or None,
    )
    try:
        server = Server(config)
        server.serve_forever()
    except StartupError as exc:
        click.echo(f"kestrel-actors: {exc}", err=True)
        sys.exit(1)
