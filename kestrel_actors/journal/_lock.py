"""One process at a time in a data directory: an exclusive ``flock`` on ``<data_dir>/.lock``.

``serve`` takes it before it opens any journal and keeps it for its whole life; ``journal
pack`` takes it for as long as it works. Neither waits: a directory already locked is
refused at once with the holder's pid, which the holder writes into the file. The kernel
drops a ``flock`` when the last descriptor of its open file is closed, so any exit of the
holder, SIGKILL included, frees the directory: no stale lock is ever left to clean up. The
file itself stays (its old pid is overwritten by the next holder); queue discovery skips
it as it skips every name that starts with a dot.
"""

from __future__ import annotations

import fcntl
import os
import time

from ._files import open_regular

__all__ = ["LOCK_FILE", "DataDirLocked", "lock_data_dir"]

LOCK_FILE = ".lock"

_PID_WAIT = 0.5
"""Seconds a refused process waits for the holder to write its pid (it writes it just after
taking the lock)."""


class DataDirLocked(Exception):
    """Another process holds the data directory's lock."""

    def __init__(self, data_dir: str, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "a process whose pid is not written yet"
        super().__init__(f"data directory {data_dir} is locked by {holder} "
                         f"(one kestrel-actors server or journal command per directory)")
        self.data_dir = data_dir
        self.pid = pid


def lock_data_dir(data_dir: str | os.PathLike[str]) -> int:
    """Lock ``data_dir`` for this process and write its pid; returns the lock's descriptor,
    to be kept open for as long as the lock should last.

    Raises :class:`DataDirLocked` at once if another process holds it, or ``OSError`` if the
    lock file cannot be opened (or is not a regular file).
    """
    path = os.path.join(data_dir, LOCK_FILE)
    fd = open_regular(path, os.O_RDWR | os.O_CREAT)  # a named pipe there must not hang us
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        raise DataDirLocked(os.fspath(data_dir), pid) from None
    except BaseException:
        os.close(fd)
        raise
    own_pid = b"%d\n" % os.getpid()
    try:
        os.pwrite(fd, own_pid, 0)  # over the last holder's pid, then cut what is left of it
        os.ftruncate(fd, len(own_pid))
    except OSError:
        pass  # a full disk: the lock holds all the same, a refusal just cannot name the pid
    return fd


def _holder(fd: int) -> int | None:
    deadline = time.monotonic() + _PID_WAIT
    while True:
        text = os.pread(fd, 32, 0).strip()
        if text.isdigit():
            return int(text)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)
