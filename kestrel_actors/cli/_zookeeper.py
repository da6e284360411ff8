"""``serve``'s ZooKeeper flags: the ``[zookeeper]`` block of the config file on the command line.

``--zookeeper HOST[:PORT]`` turns server-set membership on (docs/cluster.md); the other flags
set the block's other keys, or override the file's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["FLAGS", "with_zookeeper", "zookeeper_options"]

FLAGS = ("zookeeper", "zookeeper_path_prefix", "zookeeper_session_timeout", "zookeeper_credentials",
         "zookeeper_acl", "status_change_grace_period")


def zookeeper_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--zookeeper", default=None, metavar="HOST[:PORT]",
                     help="Join this ZooKeeper's server sets <prefix>/read and <prefix>/write "
                          "(port 2181 when omitted)."),
        click.option("--zookeeper-path-prefix", default=None, metavar="PATH",
                     help="The server sets' parent node, e.g. /kestrel/production."),
        click.option("--zookeeper-session-timeout", default=None, type=click.FloatRange(min=0.1),
                     help="ZooKeeper session timeout in seconds (default 10)."),
        click.option("--zookeeper-credentials", default=None, metavar="USER:PASSWORD",
                     envvar="KESTREL_ZOOKEEPER_CREDENTIALS",
                     help="Digest credentials (or $KESTREL_ZOOKEEPER_CREDENTIALS)."),
        click.option("--zookeeper-acl", default=None, type=click.Choice(["open", "creator-all"]),
                     help="ACL of the nodes the server creates (default open; creator-all needs "
                          "credentials)."),
        click.option("--status-change-grace-period", default=None, type=click.FloatRange(min=0),
                     help="Seconds between a stricter status being reported and being enforced; "
                          "also how long a looser one waits before ZooKeeper shows it."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def with_zookeeper(config: Any, flags: dict[str, Any]) -> Any:
    """``config`` with the ZooKeeper flags given (``None``: not given) applied."""
    from ..config import BadValue, ZooKeeperConfig, ZooKeeperCredentials, zookeeper_path

    grace = flags.get("status_change_grace_period")
    if grace is not None:
        config = config.replace(status_change_grace_period=grace)
    given = {name: flags.get(name) for name in FLAGS[:5]}
    if all(value is None for value in given.values()):
        return config
    changes: dict[str, Any] = {}
    if given["zookeeper"]:
        changes.update(_host_port(given["zookeeper"]))
    if given["zookeeper_path_prefix"] is not None:
        try:
            changes["path_prefix"] = zookeeper_path(given["zookeeper_path_prefix"])
        except BadValue as exc:
            raise click.BadParameter(str(exc), param_hint="--zookeeper-path-prefix") from None
    if given["zookeeper_session_timeout"] is not None:
        changes["session_timeout"] = given["zookeeper_session_timeout"]
    if given["zookeeper_credentials"] is not None:
        user, colon, password = given["zookeeper_credentials"].partition(":")
        if not user or not colon or not password:
            raise click.BadParameter("expected USER:PASSWORD", param_hint="--zookeeper-credentials")
        changes["credentials"] = ZooKeeperCredentials(user, password)
    if given["zookeeper_acl"] is not None:
        changes["acl"] = given["zookeeper_acl"]
    current = config.zookeeper
    if current is None:
        if "host" not in changes or "path_prefix" not in changes:
            raise click.UsageError("ZooKeeper needs --zookeeper HOST[:PORT] and --zookeeper-path-prefix "
                                   "(or a [zookeeper] block in --config)")
        zookeeper = ZooKeeperConfig(**changes)
    else:
        zookeeper = current.replace(**changes)
    if zookeeper.acl == "creator-all" and zookeeper.credentials is None:
        raise click.UsageError("--zookeeper-acl creator-all needs --zookeeper-credentials")
    return config.replace(zookeeper=zookeeper)


def _host_port(text: str) -> dict[str, Any]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` → the block's ``host`` (and ``port``)."""
    host, colon, port = text.strip().rpartition(":")
    if colon and port.isdigit() and (":" not in host or host.endswith("]")):
        if not 0 < int(port) < 65536:
            raise click.BadParameter(f"port out of range in {text!r}", param_hint="--zookeeper")
        return {"host": host.strip("[]"), "port": int(port)}
    return {"host": text.strip().strip("[]")}
