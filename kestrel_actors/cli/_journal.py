"""``kestrel-actors journal``: offline tools for journal files (Kestrel's ``qdump`` and ``qpack``).

``dump`` describes journal files one operation per line, as Kestrel's ``QDumper`` does::

    00000000  ADD 11     exp=29998ms
    00000020  RSV 1
    00000025  ACK 1
    00000030  REM

(``REM`` remove, ``RSV`` tentative remove, ``ACK`` confirm, ``CAN`` abort/unremove, ``XID``
saved xid, ``CON`` continue), then a summary. ``pack`` compacts a stopped server's queue into
one file; it takes the data directory's lock first, so it refuses a directory a server is
running in (``dump`` only reads the files it is given). Both open journal files only as
regular files, never through a symbolic link: anything else is one line on stderr and exit 1,
and ``pack`` then changes nothing. A record holding more data than ``--max-item-bytes`` (the
server's flag, 64 MiB by default) is damage, never read into memory. Nothing heavy is imported
until a command runs.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque

import click

from ._errors import describe as describe_error
from ._errors import fail

MIB = 1024 * 1024

_max_item_bytes = click.option(
    "--max-item-bytes", default=64 * MIB, show_default=True, type=click.IntRange(min=0),
    help="The server's --max-item-bytes: a record holding more data is damage.")


@click.group()
def journal() -> None:
    """Inspect and compact journal files (pack refuses a directory a server has locked)."""


@journal.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-q", "--quiet", is_flag=True, help="Only the summary, not every operation.")
@click.option("-d", "--dump", "show_data", is_flag=True, help="Also print the data of each added item.")
@click.option("-A", "--raw", is_flag=True, help="Print only the raw data of the added items.")
@_max_item_bytes
def dump(paths: tuple[str, ...], quiet: bool, show_data: bool, raw: bool, max_item_bytes: int) -> None:
    """Describe the contents of journal files (Kestrel's qdump), one file at a time."""
    failed = False
    for path in paths:
        failed |= not _dump_file(path, quiet or raw, show_data, raw, max_item_bytes, header=not (raw or quiet))
    sys.exit(1 if failed else 0)


def _dump_file(path: str, quiet: bool, show_data: bool, raw: bool, max_item_bytes: int, header: bool) -> bool:
    from ..journal import (
        ADD_OPS,
        OP_CONFIRM_REMOVE,
        OP_CONTINUE,
        OP_REMOVE,
        OP_REMOVE_TENTATIVE,
        OP_REMOVE_TENTATIVE_XID,
        OP_SAVE_XID,
        OP_UNREMOVE,
        NotRegularFile,
        Record,
        RecordReader,
        open_regular,
    )
    from ..queue import Item, next_xid

    try:
        fd = open_regular(path)
    except NotRegularFile as exc:
        click.echo(f"{click.get_current_context().command_path}: Can't open journal file: {exc}", err=True)
        return False
    except OSError as exc:
        click.echo(f"{click.get_current_context().command_path}: Can't open journal file: {path} "
                   f"({describe_error(exc)})", err=True)
        return False
    if header:
        click.echo(f"Queue: {path}")
    now = int(time.time() * 1000)
    queue: deque[int] = deque()
    open_sizes: dict[int, int] = {}
    xid = 0
    out = sys.stdout.buffer if raw else None

    def describe(label: str, record: Record, item: Item) -> str:
        text = f"{label} {len(item.data):<6d}"
        if record.xid > 0:
            text += f" xid={record.xid}"
        if item.expiry > 0:
            text += " expired" if item.expiry < now else f" exp={item.expiry - now}ms"
        return text

    try:
        reader = RecordReader(fd, now_ms=now, max_item_size=max_item_bytes)
        for record in reader:
            op = record.op
            if op in ADD_OPS or op == OP_CONTINUE:
                item = record.item
                assert item is not None  # the add records and CONTINUE always carry their item
                line = describe("CON" if op == OP_CONTINUE else "ADD", record, item)
                if op == OP_CONTINUE:
                    open_sizes.pop(record.xid, None)
                queue.append(len(item.data))
            elif op == OP_REMOVE:
                line = "REM"
                if queue:
                    queue.popleft()
            elif op in (OP_REMOVE_TENTATIVE, OP_REMOVE_TENTATIVE_XID):
                xid = next_xid(xid, open_sizes) if op == OP_REMOVE_TENTATIVE else record.xid
                if queue:
                    open_sizes[xid] = queue.popleft()
                line = f"RSV {xid}"
            elif op == OP_SAVE_XID:
                xid = record.xid
                line = f"XID {xid}"
            elif op == OP_UNREMOVE:
                if record.xid in open_sizes:
                    queue.appendleft(open_sizes.pop(record.xid))
                line = f"CAN {record.xid}"
            elif op == OP_CONFIRM_REMOVE:
                open_sizes.pop(record.xid, None)
                line = f"ACK {record.xid}"
            else:  # pragma: no cover - the reader yields only known opcodes
                line = f"op {op}"
            if not quiet:
                click.echo(f"{record.offset & 0xFFFFFFFF:08x}  {line}")
            if record.item is not None and (show_data or raw):
                if raw:
                    out.write(record.item.data)  # type: ignore[union-attr]
                else:
                    click.echo("    " + record.item.data.decode("latin-1"))
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if raw:
        out.flush()  # type: ignore[union-attr]
    else:
        total_items = len(queue) + len(open_sizes)
        total_bytes = sum(queue) + sum(open_sizes.values())
        click.echo()
        click.echo(f"Journal size: {reader.position} bytes, with {reader.records} operations.")
        click.echo(f"{total_items} items totalling {total_bytes} bytes.")
        click.echo(f"{len(open_sizes)} of them open (reserved), {len(queue)} queued.")
    problem = reader.problem
    if problem is not None:
        what = "ends inside a record" if problem.kind == "torn" else "is corrupt"
        click.echo(f"{path}: journal {what} at offset {problem.offset} ({problem.message}); "
                   f"{size - problem.offset} bytes after it were not read.", err=True)
        return False
    return True


@journal.command()
@click.argument("queue")
@click.option("--data-dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="The server's data directory.")
@_max_item_bytes
def pack(queue: str, data_dir: str, max_item_bytes: int) -> None:
    """Compact every journal file of QUEUE into one (offline: it refuses a directory that a
    running server, or another pack, has locked).

    The result holds the queue's open reads and its items; damage is set aside first, as the
    server would do at startup. A file of QUEUE that is not a regular file (a symbolic link, a
    named pipe, ...) is refused, and nothing is changed.
    """
    from ..journal import DataDirLocked, NotRegularFile, lock_data_dir
    from ..logs import configure_logging

    configure_logging("console", "warning")

    if not queue or any(c in queue for c in "./~"):
        raise click.BadParameter("not a queue name", param_hint="QUEUE")
    try:
        lock = lock_data_dir(data_dir)  # a live server holds it already: refused, nothing touched
    except (DataDirLocked, OSError) as exc:
        fail(str(exc) if isinstance(exc, DataDirLocked) else f"cannot lock {data_dir}: {describe_error(exc)}", 1)
    try:
        _pack(queue, data_dir, max_item_bytes)
    except NotRegularFile as exc:
        fail(f"{exc}; nothing was changed", 1)
    finally:
        os.close(lock)


def _pack(queue: str, data_dir: str, max_item_bytes: int) -> None:
    from ..journal import check_regular, journal_files, pack_queue

    check_regular(data_dir, queue)  # before the listing below, which would skip such a file
    files = [f for f in journal_files(data_dir, queue) if os.path.exists(os.path.join(data_dir, f))]
    if not files:
        fail(f"no journal files for queue {queue!r} in {data_dir}", 1)
    before = sum(os.path.getsize(os.path.join(data_dir, f)) for f in files)
    items, size = pack_queue(data_dir, queue, max_item_bytes)
    click.echo(f"Packed {queue!r}: {len(files)} file(s), {before} bytes -> 1 file, {size} bytes "
               f"({items} items).")
