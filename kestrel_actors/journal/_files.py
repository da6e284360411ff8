"""The files of a queue's journal in the data directory (behaviour §6.1).

=========================  ===============================================================
``<name>``                 the current journal, appended to
``<name>.<ms>``            a rotated (archived) journal; replayed oldest first, then ``<name>``
``<name>.<ms>.pack``       a finished pack or rewrite: it summarises every archive whose
                           timestamp is ``<= ms``; any listing deletes those archives and
                           renames the pack to ``<name>.<ms>`` (the commit point of a pack)
``<name>~~<ms>``           a temporary file being written; deleted when the queue is replayed
``<name>~~<ms>.gone``      an archive a rewrite replaced, renamed out of the way and being
                           deleted on the threadpool; deleted when the queue is replayed
=========================  ===============================================================

Queue names never contain ``.``, ``/`` or ``~``, so the part of a file name before the first
``.`` (or ``~~``) is the queue's name. Unlike Kestrel, a stray ``<name>.<not-a-number>`` file
does not stop the server: it is logged and ignored. So is anything that is not a regular file
(a symbolic link, a directory, a named pipe, a socket, a device), whatever its name: it is
looked at with ``lstat`` only and never opened, since opening a named pipe waits for a writer
for ever and writing through a symbolic link would write outside the data directory. Every
journal file is opened with :func:`open_regular` (``O_NOFOLLOW``, then ``fstat``), so a file
replaced by one of those after the listing is refused too.
"""

from __future__ import annotations

import os
import stat
import threading
import time

import structlog

__all__ = [
    "GONE_SUFFIX",
    "PACK_SUFFIX",
    "TEMP_MARK",
    "NotRegularFile",
    "archived_files",
    "check_regular",
    "delete_files",
    "delete_temp_files",
    "erase_files",
    "file_size",
    "file_timestamp",
    "files_by_queue",
    "fsync_dir",
    "is_regular",
    "journal_files",
    "open_regular",
    "queue_names",
    "total_size",
    "unique_file",
]

log = structlog.get_logger("kestrel_actors.journal")

TEMP_MARK = "~~"
CHECKPOINT_DIR = ".checkpoint"
"""Where each queue's checkpoint is kept (journal/_checkpoint.py)."""
PACK_SUFFIX = ".pack"
GONE_SUFFIX = ".gone"

_warned: set[str] = set()


def _warn_stray(name: str, filename: str) -> None:
    if filename not in _warned:
        _warned.add(filename)
        log.warning("ignoring a stray file in the journal directory", queue=name, file=filename)


class NotRegularFile(OSError):
    """A journal's path names something other than a regular file (a directory, a pipe, ...)."""


def _warn_not_regular(data_dir: str, filename: str) -> None:
    if filename not in _warned:
        _warned.add(filename)
        try:
            kind = _kind(os.lstat(os.path.join(data_dir, filename)).st_mode)
        except OSError:
            kind = "gone"
        log.warning("ignoring something in the journal directory that is not a regular file",
                    file=filename, kind=kind)


def is_regular(data_dir: str, filename: str) -> bool:
    """True if ``filename`` is a regular file (a symbolic link is not); never opens it."""
    try:
        return stat.S_ISREG(os.lstat(os.path.join(data_dir, filename)).st_mode)
    except OSError:
        return False


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "a device"


def _not_regular(path: str, mode: int) -> NotRegularFile:
    return NotRegularFile(f"{path} is {_kind(mode)}, not a regular file")


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """``os.open`` that never follows a symbolic link, never blocks on a named pipe and only
    ever hands back a regular file.

    ``O_NOFOLLOW`` refuses a symbolic link in the last component (so nothing outside the data
    directory is read or written through one); ``O_NONBLOCK`` makes opening a pipe return at
    once (it has no effect on a regular file's reads and writes); anything that is not a
    regular file is closed again and raises :class:`NotRegularFile`. A missing file raises
    ``FileNotFoundError`` as ``os.open`` does.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a symlink (ELOOP), a pipe without a reader (ENXIO), a directory, ...
        try:
            found = os.lstat(path).st_mode
        except OSError:
            raise exc from None
        if stat.S_ISREG(found):
            raise
        raise _not_regular(path, found) from exc
    try:
        found = os.fstat(fd).st_mode
        if not stat.S_ISREG(found):
            raise _not_regular(path, found)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(data_dir: str, name: str) -> None:
    """Raise :class:`NotRegularFile` if any file named like one of queue ``name``'s journal
    files (``<name>``, ``<name>.<ms>``, ``<name>.<ms>.pack``) is not a regular file.

    The offline tools check this before changing anything: they refuse such a queue whole
    rather than skip part of its journal (which would change what it replays to)."""
    prefix = name + "."
    for filename in _listdir(data_dir):
        if filename != name and not (filename.startswith(prefix) and _parse_suffix(filename[len(prefix):])):
            continue
        try:
            found = os.lstat(os.path.join(data_dir, filename)).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(found):
            raise _not_regular(os.path.join(data_dir, filename), found)


def _parse_suffix(rest: str) -> tuple[int, bool] | None:
    """``"123"`` → (123, False); ``"123.pack"`` → (123, True); anything else → None."""
    pack = rest.endswith(PACK_SUFFIX)
    if pack:
        rest = rest[: -len(PACK_SUFFIX)]
    if not rest.isdigit() or not rest.isascii():
        return None
    return int(rest), pack


def file_timestamp(filename: str, name: str) -> int | None:
    """The timestamp of archive ``<name>.<ms>`` (or its pack); None for anything else."""
    if not filename.startswith(name + "."):
        return None
    parsed = _parse_suffix(filename[len(name) + 1:])
    return None if parsed is None else parsed[0]


def _listdir(data_dir: str) -> list[str]:
    try:
        return os.listdir(data_dir)
    except FileNotFoundError:
        return []


def files_by_queue(data_dir: str) -> dict[str, list[str]]:
    """One listing of ``data_dir``, each file under the name of the queue it would belong to
    (its name up to the first ``.`` or ``~~``).

    Start-up hands each queue its own list (the ``listing`` of :func:`journal_files` and
    :func:`delete_temp_files`): with thousands of queues, a listing per queue made start-up
    quadratic (5,000 queues: 50 million names compared).
    """
    grouped: dict[str, list[str]] = {}
    for filename in _listdir(data_dir):
        owner = filename.partition(".")[0].partition(TEMP_MARK)[0]
        grouped.setdefault(owner, []).append(filename)
    return grouped


def _timed_files(data_dir: str, name: str, listing: list[str] | None = None) -> list[tuple[int, bool, str]]:
    prefix = name + "."
    found = []
    for filename in _listdir(data_dir) if listing is None else listing:
        if not filename.startswith(prefix):
            continue
        parsed = _parse_suffix(filename[len(prefix):])
        if parsed is None:
            _warn_stray(name, filename)
            continue
        if not is_regular(data_dir, filename):
            _warn_not_regular(data_dir, filename)
            continue
        found.append((parsed[0], parsed[1], filename))
    found.sort()
    return found


def _collapse_pack(data_dir: str, name: str, files: list[tuple[int, bool, str]], gone: list[str] | None) -> bool:
    """Finish the first pack found: delete the archives it summarises (or, given ``gone``,
    rename each to ``<name>~~<ms>.gone`` and list its path there), rename it into place."""
    for pack_ts, is_pack, pack_name in files:
        if not is_pack:
            continue
        for ts, other_is_pack, filename in files:
            if ts <= pack_ts and not other_is_pack:
                path = os.path.join(data_dir, filename)
                try:
                    if gone is None:
                        os.unlink(path)
                    else:
                        doomed = os.path.join(data_dir, f"{name}{TEMP_MARK}{ts}{GONE_SUFFIX}")
                        os.replace(path, doomed)
                        gone.append(doomed)
                except FileNotFoundError:
                    pass
        final = pack_name[: -len(PACK_SUFFIX)]
        try:
            os.replace(os.path.join(data_dir, pack_name), os.path.join(data_dir, final))
        except FileNotFoundError:
            pass  # someone else finished it first
        log.info("finished a journal pack", queue=name, file=final)
        return True
    return False


_listing = threading.Lock()
"""Listings finish packs by deleting and renaming files, and a pack job lists from a worker
thread while the queue lists from the hub: one listing at a time, or the second could delete
the file the first just renamed into place."""


def archived_files(data_dir: str, name: str, listing: list[str] | None = None,
                   gone: list[str] | None = None) -> list[str]:
    """The archived files of queue ``name``, oldest first, after finishing any pack.

    ``listing``: the directory's files of this queue, listed just before (else it is listed
    now); once a pack is finished the directory is listed again. ``gone``: the archives a pack
    replaces are not deleted but renamed out of the way (``<name>~~<ms>.gone``) and their
    paths appended there, for :func:`delete_files` to delete off the event loop (a rewrite:
    unlinking a big file frees its blocks, which can take the disk tens of milliseconds)."""
    with _listing:
        while True:
            files = _timed_files(data_dir, name, listing)
            if not _collapse_pack(data_dir, name, files, gone):
                return [filename for _ts, _pack, filename in files]
            listing = None


def journal_files(data_dir: str, name: str, listing: list[str] | None = None) -> list[str]:
    """Every file to replay, in order: the archives, then ``<name>`` (which may not exist)."""
    return [*archived_files(data_dir, name, listing), name]


def queue_names(data_dir: str) -> list[str]:
    """The queues that have journal files in ``data_dir`` (sorted), as Kestrel finds them at startup.

    Only regular files count; temporary ``~~`` files and strays are skipped. A name may hold
    any bytes (see :mod:`kestrel_actors.queue_name`); whether it can name a queue is the
    collection's call.
    """
    names = set()
    for filename in _listdir(data_dir):
        if TEMP_MARK in filename or not filename or filename.startswith("."):
            continue
        if not is_regular(data_dir, filename):
            _warn_not_regular(data_dir, filename)
            continue
        name, dot, rest = filename.partition(".")
        if dot and _parse_suffix(rest) is None:
            _warn_stray(name, filename)
            continue
        names.add(name)
    return sorted(names)


def delete_files(paths: list[str]) -> None:
    """Unlink each of ``paths`` (blocking: run it on the threadpool); one already gone, or one
    that cannot be unlinked now, is left to :func:`delete_temp_files` at the next start."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def delete_temp_files(data_dir: str, name: str, listing: list[str] | None = None) -> list[str]:
    """Delete ``<name>~~*`` (an interrupted rewrite or pack, the replaced archives a rewrite
    had not deleted yet); returns the names deleted. ``listing``: as for :func:`archived_files`."""
    prefix = name + TEMP_MARK
    deleted = []
    for filename in _listdir(data_dir) if listing is None else listing:
        if filename.startswith(prefix):
            try:
                os.unlink(os.path.join(data_dir, filename))
                deleted.append(filename)
            except FileNotFoundError:
                pass
    if deleted:
        log.info("deleted unfinished temporary journal files", queue=name, files=deleted)
    return deleted


def erase_files(data_dir: str, name: str) -> None:
    """Delete every file of queue ``name``: current, archives, packs, temporaries and its
    checkpoint (not strays)."""
    doomed = [name] + [filename for _ts, _pack, filename in _timed_files(data_dir, name)]
    doomed += [f for f in _listdir(data_dir) if f.startswith(name + TEMP_MARK)]
    doomed += [os.path.join(CHECKPOINT_DIR, name)]
    for filename in doomed:
        try:
            os.unlink(os.path.join(data_dir, filename))
        except FileNotFoundError:
            pass


def unique_file(data_dir: str, name: str, infix: str, suffix: str = "", min_ts: int = 0) -> str:
    """Create an empty ``<name><infix><ms><suffix>`` that did not exist; returns its file name.

    As Kestrel does, the timestamp is the current time in ms, retried every 1 ms until the
    name is free. ``min_ts`` keeps it above existing archives even if the clock went back.
    """
    while True:
        ts = max(int(time.time() * 1000), min_ts)
        filename = f"{name}{infix}{ts}{suffix}"
        try:
            fd = os.open(os.path.join(data_dir, filename), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            min_ts = ts + 1
            time.sleep(0.001)
            continue
        os.close(fd)
        return filename


def fsync_dir(data_dir: str | os.PathLike[str]) -> None:
    """Make renames and creations in ``data_dir`` durable."""
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def total_size(data_dir: str, filenames: list[str]) -> int:
    return sum(file_size(os.path.join(data_dir, f)) for f in filenames)
