"""Deterministic batch ids: a persisted counter per (queue, server).

Why a counter and not a hash of the items: after a failure the server hands the same items
back, but in a different order (behaviour §2.6 reverses them) and, if more arrived meanwhile, mixed with
new ones, so the retried batch rarely hashes the same. A counter that only moves forward once a
batch is fully written gives the retry the *same* id whatever it contains, and ``mode
overwrite`` on ``<output>/batch=<id>/`` then replaces the failed attempt's partial output.

The protocol (see ``_batch.run_batch``)::

    fetch (items opened) → job → write batch=<id> (durable) → commit: counter = id+1 (fsync)
    → confirm

* A failure before the commit: the items are not confirmed, the connection is dropped, they
  come back, and the retry rewrites the same ``batch=<id>`` — exactly once in effect.
* A failure after the commit but before the server saw ``confirm``: the items come back and
  are processed again as batch id+1 — a duplicate, never a loss.
* A directory whose id is below the counter is never written again, and an item is confirmed
  only after its directory is below the counter, so confirmed output is never overwritten.

An exclusive ``flock`` on ``<state>.lock`` stops two bridges from numbering the same
(queue, server) at once, which would let one overwrite the other's confirmed output.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from datetime import UTC, datetime
from pathlib import Path

from ..client import ServerAddress
from ..journal import fsync_dir

__all__ = ["BatchLedger", "LedgerLockedError", "format_batch_id"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


class LedgerLockedError(RuntimeError):
    """Another bridge already numbers batches of this queue on this server."""


def format_batch_id(queue: str, server: ServerAddress, number: int) -> str:
    """``<queue>-<host>-<port>-<number:08d>``, safe as a path segment and a partition value."""
    return f"{_safe(queue)}-{_safe(server.host)}-{server.port}-{number:08d}"


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)


class BatchLedger:
    """The counter of one (queue, server) in ``state_dir``; :meth:`open` takes the lock."""

    def __init__(self, state_dir: Path, queue: str, server: ServerAddress) -> None:
        self.queue = queue
        self.server = server
        name = f"{_safe(queue)}@{_safe(server.host)}_{server.port}"
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / f"{name}.json"
        self.lock_path = self.state_dir / f"{name}.lock"
        self.next_number = 0
        self._lock_fd: int | None = None
        self._closing = threading.Lock()
        """A bridge actor's ``on_stop`` and ``run_bridge``'s clean-up may close the ledger at once
        (pykka marks an actor stopped before its ``on_stop`` runs): one ``os.close`` per open, or
        the second would fail, or close whatever file was given the number meanwhile."""

    def open(self) -> BatchLedger:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LedgerLockedError(
                f"another bridge holds {self.lock_path} (queue {self.queue!r} on {self.server})"
            ) from None
        self._lock_fd = fd
        try:
            self.next_number = int(json.loads(self.path.read_text())["next_batch"])
        except FileNotFoundError:
            self.next_number = 0
        except (ValueError, KeyError, TypeError) as exc:
            self.close()
            raise RuntimeError(f"corrupt batch ledger {self.path}: {exc}") from exc
        return self

    @property
    def current_id(self) -> str:
        """The id of the batch being worked on; the same on every retry until :meth:`commit`."""
        return format_batch_id(self.queue, self.server, self.next_number)

    def commit(self) -> None:
        """Advance the counter durably (write a temp file, fsync, rename, fsync the dir)."""
        if self._lock_fd is None:
            raise RuntimeError("ledger is not open")
        number = self.next_number + 1
        body = json.dumps({
            "queue": self.queue,
            "server": str(self.server),
            "next_batch": number,
            "updated": datetime.now(UTC).isoformat(),
        }).encode()
        tmp = self.path.with_suffix(".json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_dir(self.state_dir)
        self.next_number = number

    def close(self) -> None:
        with self._closing:
            fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # releases the flock
