"""``kestrel-actors serve``: run the server in the foreground until SIGTERM, SIGINT or shutdown."""

from __future__ import annotations

import os
import sys

import click

from ._errors import fail
from ._zookeeper import FLAGS as ZOOKEEPER_FLAGS
from ._zookeeper import with_zookeeper, zookeeper_options

MIB = 1024 * 1024


@click.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="TOML configuration file (see docs/configuration.md); flags given here win.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=22133, show_default=True, type=click.IntRange(0, 65535), help="Memcache protocol port.")
@click.option("--text-port", default=2222, show_default=True, type=click.IntRange(0, 65535),
              help="Text protocol port; 0 disables it.")
@click.option("--thrift-port", default=2229, show_default=True, type=click.IntRange(0, 65535),
              help="Thrift protocol port (framed transport, binary protocol); 0 disables it.")
@click.option("--admin-port", default=2223, show_default=True, type=click.IntRange(0, 65535),
              help="Admin HTTP port (ostrich's /stats.json, Prometheus /metrics, a live page); 0 disables it.")
@click.option("--admin-host", default="127.0.0.1", show_default=True,
              help="Address the admin port listens on; separate from --host, so that opening the "
                   "memcache port to the network does not open /shutdown.")
@click.option("--admin-token", default=None, callback=lambda _ctx, _param, value: _token(value),
              help="Require this token (Authorization: Bearer TOKEN) on POST /shutdown, /quiesce and "
                   "/reload. Visible to local users in ps: prefer admin_token in --config.")
@click.option("--data-dir", default="./data", show_default=True,
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
@click.option("--max-buffered-bytes", default="1G", show_default=True, metavar="SIZE",
              callback=lambda _ctx, param, value: _size(param, value),
              help="Bound on what all connections buffer together (unfinished requests, unsent "
                   "replies), in bytes or with a unit (512M, 2G); past it the connections holding "
                   "the most are closed.")
@click.option("--sync-journal", default=None,
              help="Queue default fsync policy: never, always (reply after fsync) or a period like 100ms.")
@click.option("--busy-poll", default="200us", show_default=True, metavar="DURATION",
              callback=lambda _ctx, param, value: _duration(param, value),
              help="After a read, poll the sockets without sleeping for up to this long (yielding "
                   "the CPU each turn): 200us, 1ms, 0 to sleep at once.")
@click.option("--client-timeout", default=None, type=click.FloatRange(min=0),
              help="Close a connection that sends nothing for this many seconds (off by default).")
@click.option("--expiration-timer-frequency", default=1.0, show_default=True, type=float,
              help="Seconds between background expiry sweeps (0 disables them).")
@zookeeper_options
@click.pass_context
def serve(ctx: click.Context, config_path: str | None, log_format: str, log_level: str, **flags) -> None:
    """Run a kestrel-actors server in the foreground."""
    from .._malloc import tune_malloc
    from ..config import ServerConfig
    from ..logs import configure_logging

    tune_malloc()  # large buffers go back to the system when freed (ADR 0011)
    configure_logging(log_format, log_level, sys.stdout)  # where a service manager reads it
    sync_journal = flags.pop("sync_journal")
    zookeeper = {name: flags.pop(name) for name in ZOOKEEPER_FLAGS}
    if flags["expiration_timer_frequency"] == 0:
        flags["expiration_timer_frequency"] = None
    if config_path is None:
        config = ServerConfig(**flags)
    else:
        from ..config import ConfigError, load_config

        try:
            config = load_config(config_path)
        except ConfigError as exc:
            fail(str(exc), 1)
        given = {
            name: value for name, value in flags.items()
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        }
        config = config.replace(**given)
    if sync_journal is not None:
        config = _with_sync_journal(config, sync_journal)
    config = with_zookeeper(config, zookeeper)
    data_dir_lock = _lock_data_dir(config.data_dir)
    from ..journal import make_file_opener, queue_names
    from ..server import Server, StartupError

    try:
        server = Server(
            config,
            opener=make_file_opener(config.data_dir, read_behind=True, max_item_bytes=config.max_item_bytes),
            discover=lambda: queue_names(config.data_dir),
            data_dir_lock=data_dir_lock,
        )
        server.serve_forever()
    except StartupError as exc:
        fail(str(exc), 1)


def _lock_data_dir(data_dir: str) -> int | None:
    """Lock the data directory before the server's modules are imported (a second of start-up),
    so that a second server on it is refused at once; ``None`` if the directory is unusable,
    which the server's own check then reports."""
    from ..journal import DataDirLocked, lock_data_dir

    try:
        os.makedirs(data_dir, exist_ok=True)
        return lock_data_dir(data_dir)
    except DataDirLocked as exc:
        fail(str(exc), 1)
    except OSError:
        return None


def _token(value: str | None) -> str | None:
    from ..config import BadValue
    from ..config import token as parse_token

    if value is None:
        return None
    try:
        return parse_token(value)
    except BadValue as exc:
        raise click.BadParameter(str(exc), param_hint="--admin-token") from exc


def _size(param: click.Parameter, value: str | int) -> int:
    from ..config import BadValue, positive_size

    try:
        return positive_size(value)
    except BadValue as exc:
        raise click.BadParameter(str(exc), param=param) from exc


def _duration(param: click.Parameter, value: str | float) -> float:
    from ..config import BadValue, duration

    try:
        return duration(value, bare_seconds=True)
    except BadValue as exc:
        raise click.BadParameter(str(exc), param=param) from exc


def _with_sync_journal(config, value: str):
    """Apply ``--sync-journal`` to the queue defaults and every configured queue."""
    from ..config import BadValue
    from ..config import sync_journal as parse_sync_journal

    try:
        policy = parse_sync_journal(value)
    except BadValue as exc:
        raise click.BadParameter(str(exc), param_hint="--sync-journal") from exc
    return config.replace(
        queue_defaults=config.queue_defaults.replace(sync_journal=policy),
        queues={name: queue.replace(sync_journal=policy) for name, queue in config.queues.items()},
    )
