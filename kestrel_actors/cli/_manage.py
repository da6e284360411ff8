"""``kestrel-actors move|status|flush|delete``: everyday administration from a shell, through
the client (:mod:`kestrel_actors.client`), with the exit codes of the other client commands.

``move`` is reliable: each item is opened at the source (``get SRC/open``), stored at the
destination on the same server, and only then confirmed at the source, so an item is never in
neither queue; a failure between the store and the confirm (a crash, a lost connection) can
leave it in both. Items are bytes: binary and multi-line items move unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ._client import EXIT_CODES, EXIT_NOTHING, EXIT_REFUSED, QUEUE, _client, _guard, _servers
from ._errors import EXIT_DECLINED, fail

__all__ = ["delete", "flush", "move", "status"]


class _Refused(Exception):
    """The destination did not store an item: it goes back to the head of the source."""


@click.command(epilog=EXIT_CODES)
@click.argument("source", type=QUEUE)
@click.argument("destination", type=QUEUE)
@click.option("-n", "--count", default=None, type=click.IntRange(min=1),
              help="Move at most this many items (default: every item there now).")
@_servers
def move(source: str, destination: str, count: int | None, servers: tuple[str, ...],
         timeout: float) -> None:
    """Move the items of SOURCE to DESTINATION, on each server, oldest first. Each item is
    confirmed at SOURCE only once DESTINATION stored it; one DESTINATION refuses (full, too
    large) goes back to the head of SOURCE and stops the move (exit 4). Prints how many
    moved; exit 1 if there was nothing to move."""
    if source == destination:
        raise click.BadParameter("SOURCE and DESTINATION are the same queue", param_hint="DESTINATION")
    client = _client(servers, timeout)

    def run() -> int:
        from ..client import Client

        moved = 0
        try:
            with client:
                for address in client.servers:
                    with Client([str(address)], timeout=timeout) as one:
                        moved += _move_on(one, source, destination,
                                          None if count is None else count - moved)
                    if count is not None and moved >= count:
                        break
        except _Refused as exc:
            fail(f"moved {moved}; {exc}", EXIT_REFUSED)
        click.echo(f"moved {moved}")
        return 0 if moved else EXIT_NOTHING

    _guard(run)


def _move_on(client: Any, source: str, destination: str, limit: int | None) -> int:
    """Move up to ``limit`` items within one server; the item in hand goes back to the head of
    ``source`` if storing it raises or is refused."""
    moved = 0
    while limit is None or moved < limit:
        with client.reliable(source) as item:
            if item is None:
                break
            if not client.put(destination, item):
                raise _Refused(f"{destination} refused an item of {len(item)} bytes; it is back in {source}")
        moved += 1
    return moved


@click.command(epilog=EXIT_CODES)
@click.argument("new_status", required=False, metavar="[up|readonly|writeavoid|quiescent]",
                type=click.Choice(["up", "readonly", "writeavoid", "quiescent"], case_sensitive=False))
@_servers
def status(new_status: str | None, servers: tuple[str, ...], timeout: float) -> None:
    """Print each server's status, or set it on every server: `up` serves all, `readonly`
    refuses writes, `writeavoid` only leaves a ZooKeeper write set, `quiescent` refuses reads
    and writes (a grace period, when configured, delays the stricter ones)."""
    client = _client(servers, timeout)

    def run() -> int:
        with client:
            if new_status is not None:
                client.set_status(new_status)
            for address, current in client.status().items():
                click.echo(f"{address} {current}")
        return 0

    _guard(run)


def _confirmed(question: str) -> bool:
    """The answer at the prompt; no answer (end of input, Ctrl-C) is no."""
    try:
        answer = click.confirm(question, err=True)
    except click.Abort:
        answer = None
    if answer is None or not sys.stdin.isatty():  # no echoed newline ended the prompt's line
        click.echo("", err=True)
    return bool(answer)


def _destructive(verb: str, effect: str) -> Any:
    """``flush`` and ``delete``: ask first (``--yes`` does not), then act on every server."""

    @click.command(name=verb, epilog=EXIT_CODES,
                   help=f"{effect} on every server. Asks first unless --yes.")
    @click.argument("queue", type=QUEUE)
    @click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
    @_servers
    def command(queue: str, yes: bool, servers: tuple[str, ...], timeout: float) -> None:
        client = _client(servers, timeout)
        where = ", ".join(str(address) for address in client.servers)
        if not yes and not _confirmed(f"{verb} {queue} on {where}?"):
            fail(f"not confirmed: {queue} left as it was", EXIT_DECLINED)

        def run() -> int:
            with client:
                getattr(client, verb)(queue)
            return 0

        _guard(run)

    return command


flush = _destructive("flush", "Remove every waiting item of QUEUE (open reads stay open)")
delete = _destructive("delete", "Delete QUEUE, its items and its journal files")
