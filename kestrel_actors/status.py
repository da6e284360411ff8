"""The server's operating status (behaviour §7.2): Up, WriteAvoid, ReadOnly, Quiescent, Down.

A plain object, no timer and no I/O except the status file. Kestrel separates the status it
*reports* (``status`` command, persisted) from the one it *enforces* (what reads and writes
check): a change to a stricter status is reported at once but enforced only after the grace
period. Kestrel runs a timer for that; here the enforced status is computed lazily from an
injectable clock each time it is asked for, which gives the same answers without a timer.

Rules, as in Kestrel's ``ServerStatus``:

* A change is accepted when it loosens the reported status, or when no stricter change is
  pending. Otherwise it is rejected silently (the status stays, the client still gets the
  normal success reply).
* An accepted stricter change starts the grace period (or is enforced at once when the period
  is 0). An accepted change that is not stricter is enforced at once and cancels any pending
  one.
* Every accepted change is written to the status file as the status name plus ``\\n``, the
  parent directory created if needed. ``Down`` cannot be set by clients; :meth:`shutdown`
  enters it immediately and it is never written.
* At startup the file's first line is read case-insensitively; a missing, unreadable or
  unparsable file leaves the default status.
"""

from __future__ import annotations

import enum
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

__all__ = [
    "DEFAULT_STATUS_FILE",
    "ForbiddenStatusError",
    "ServerStatus",
    "Status",
    "StatusListener",
    "UnknownStatusError",
    "default_status_file",
    "session_refusals",
]

log = structlog.get_logger("kestrel_actors.status")

DEFAULT_STATUS_FILE = os.path.join(".kestrel", "status")
"""Where the status file goes, relative to the data directory, when none is configured.

Kestrel's default is ``/tmp/.kestrel-status``, shared by every server on the host. A directory
inside the data directory keeps servers apart and is ignored by queue discovery (only regular
files are queues)."""


class Status(enum.Enum):
    """A status: ``value`` is Kestrel's name for it (what the status file holds)."""

    UP = "Up"
    WRITE_AVOID = "WriteAvoid"
    READ_ONLY = "ReadOnly"
    QUIESCENT = "Quiescent"
    DOWN = "Down"

    @property
    def strictness(self) -> int:
        return _STRICTNESS[self]

    @property
    def blocks_reads(self) -> bool:
        """get, peek and monitor (memcache and text) are blocked; confirm, close and abort are not."""
        return self is Status.QUIESCENT or self is Status.DOWN

    @property
    def blocks_writes(self) -> bool:
        """set, text put, flush, flush_all, delete, flush_expired: blocked."""
        return self is not Status.UP and self is not Status.WRITE_AVOID

    @property
    def graceful_shutdown(self) -> bool:
        """Whether empty queues are rewritten before they are closed at shutdown (behaviour §6.6)."""
        return self is Status.READ_ONLY or self is Status.QUIESCENT

    def stricter_than(self, other: Status) -> bool:
        return _STRICTNESS[self] > _STRICTNESS[other]

    @property
    def reply_name(self) -> str:
        """The name the ``status`` command replies with: ``UP``, ``READONLY``, …"""
        return self.value.upper()

    @classmethod
    def parse(cls, name: str) -> Status | None:
        """The status named ``name`` (any case, ``down`` included), or ``None``."""
        return _BY_NAME.get(name.strip().upper())


_STRICTNESS = {
    Status.UP: 1,
    Status.WRITE_AVOID: 2,
    Status.READ_ONLY: 3,
    Status.QUIESCENT: 4,
    Status.DOWN: 100,
}
_BY_NAME = {status.value.upper(): status for status in Status}


class UnknownStatusError(ValueError):
    """``status <name>`` with a name that is not a status."""

    def __init__(self) -> None:
        super().__init__("Unknown status.")


class ForbiddenStatusError(ValueError):
    """``status down``: only shutdown may enter Down."""

    def __init__(self) -> None:
        super().__init__("Status forbidden.")


def default_status_file(data_dir: str | os.PathLike[str]) -> Path:
    """The status file used when ``status_file`` is not configured."""
    return Path(data_dir) / DEFAULT_STATUS_FILE


def session_refusals(
    sessions: int, refuse_writes: int | None, refuse_reads: int | None
) -> tuple[bool, bool]:
    """``(writes_refused, reads_refused)`` for a session opened while ``sessions`` sessions
    exist, itself included (``connectionLimitRefuseWrites``/``…Reads``, behaviour §1). The answer holds
    for the session's whole lifetime, as if the server were ReadOnly / Quiescent for it."""
    return (
        refuse_writes is not None and sessions > refuse_writes,
        refuse_reads is not None and sessions > refuse_reads,
    )


class StatusListener(Protocol):
    """Told of every accepted change just before it happens (Kestrel's ``proposeStatusChange``
    and ``statusChanged`` hooks, which ``ZooKeeperServerStatus`` overrides): start-up's status
    file and shutdown come with ``immediate``. It must not block: it runs in whatever
    handler changed the status."""

    def status_changing(self, old: Status, new: Status, immediate: bool) -> None: ...


class ServerStatus:
    """The reported and enforced status of one server, persisted to ``status_file``.

    ``clock`` returns seconds (monotonic by default); tests pass a fake one. Call :meth:`load`
    once at startup, before the listeners start.
    """

    def __init__(
        self,
        status_file: str | os.PathLike[str] | None,
        default: Status | str = Status.UP,
        grace_period: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(default, str):
            parsed = Status.parse(default)
            if parsed is None:
                raise UnknownStatusError()
            default = parsed
        self.path = Path(status_file) if status_file is not None else None
        self.default = default
        self.grace_period = grace_period
        self._clock = clock
        self._reported = default
        self._enforce_at: float | None = None
        self._enforce(default)
        self.listener: StatusListener | None = None

    @classmethod
    def from_config(cls, config: Any, clock: Callable[[], float] = time.monotonic) -> ServerStatus:
        """Build from a server config: ``status_file`` (``None``: :func:`default_status_file`),
        ``default_status`` and ``status_change_grace_period``. Settings a config lacks take
        Kestrel's defaults (Up, no grace period)."""
        status_file = getattr(config, "status_file", None)
        if status_file is None:
            status_file = default_status_file(config.data_dir)
        return cls(
            status_file,
            getattr(config, "default_status", Status.UP),
            getattr(config, "status_change_grace_period", 0.0) or 0.0,
            clock,
        )

    # -- queries ----------------------------------------------------------------------------

    @property
    def status(self) -> Status:
        """The reported status: what ``status`` replies and what the file holds."""
        return self._reported

    def enforced(self) -> Status:
        """The status that reads and writes obey now."""
        self._settle()
        return self._enforced

    # asked once per request: no settling call while no change is pending
    def blocks_reads(self) -> bool:
        if self._enforce_at is not None:
            self._settle()
        return self._reads_blocked

    def blocks_writes(self) -> bool:
        if self._enforce_at is not None:
            self._settle()
        return self._writes_blocked

    def graceful_shutdown(self) -> bool:
        return self.enforced().graceful_shutdown

    def pending(self) -> bool:
        """Whether a stricter change is reported but not yet enforced."""
        self._settle()
        return self._enforce_at is not None

    # -- changes ----------------------------------------------------------------------------

    def set(self, new: Status | str) -> Status:
        """A client's ``status <name>``: returns the reported status afterwards (unchanged when
        the change was rejected). Raises :class:`UnknownStatusError` for an unknown name and
        :class:`ForbiddenStatusError` for Down."""
        if isinstance(new, str):
            parsed = Status.parse(new)
            if parsed is None:
                raise UnknownStatusError()
            new = parsed
        if new is Status.DOWN:
            raise ForbiddenStatusError()
        self._settle()
        old = self._reported
        if not old.stricter_than(new) and self._enforce_at is not None:
            log.warning("status change rejected: a stricter change is pending",
                        status=old.value, requested=new.value)
            return old
        self._change(old, new, immediate=False)
        self._store()
        return new

    def shutdown(self) -> None:
        """Enter Down at once, cancelling any pending change; Down is never persisted."""
        self._enforce_at = None
        if self._reported is not Status.DOWN:
            self._change(self._reported, Status.DOWN, immediate=True)

    def load(self) -> Status:
        """Read the status file (startup). Missing, unreadable or unparsable: keep the default.

        Like Kestrel, a file that says ``Down`` is honoured (clients can loosen it)."""
        if self.path is None:
            return self._reported
        try:
            first = _read_first_line(self.path)
        except FileNotFoundError:
            log.info("no stored status; using the default", path=str(self.path),
                     status=self.default.value)
            return self._reported
        except (OSError, UnicodeDecodeError) as exc:
            log.error("cannot read the stored status; using the default", path=str(self.path),
                      error=str(exc), status=self.default.value)
            return self._reported
        loaded = Status.parse(first)
        if loaded is None:
            log.error("cannot parse the stored status; using the default", path=str(self.path),
                      stored=first.strip(), status=self.default.value)
            return self._reported
        self._change(self._reported, loaded, immediate=True)
        return loaded

    # -- internals --------------------------------------------------------------------------

    def _enforce(self, status: Status) -> None:
        self._enforced = status
        self._reads_blocked = status.blocks_reads
        self._writes_blocked = status.blocks_writes

    def _settle(self) -> None:
        """Enforce a pending change whose grace period is over (Kestrel's timer firing)."""
        if self._enforce_at is not None and self._clock() >= self._enforce_at:
            self._enforce(self._reported)
            self._enforce_at = None
            log.info("status grace period over; now enforced", status=self._reported.value)

    def _change(self, old: Status, new: Status, immediate: bool) -> None:
        if self.listener is not None:
            self.listener.status_changing(old, new, immediate)
        self._reported = new
        if new.stricter_than(old) and not immediate and self.grace_period > 0:
            self._enforce_at = self._clock() + self.grace_period
        else:
            self._enforce_at = None
            self._enforce(new)
        log.info("status changed", status=new.value, previous=old.value,
                 grace_period=self.grace_period if self._enforce_at is not None else 0)

    def _store(self) -> None:
        """Write the reported status (name + ``\\n``) atomically. A failure is logged and the
        change stands, as in Kestrel (the file then lags behind until the next change)."""
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + "~~tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_new(tmp, (self._reported.value + "\n").encode("utf-8"))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("cannot store the status", path=str(self.path), error=str(exc),
                      status=self._reported.value)


_NOT_FOLLOWED = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
"""The status file lives in the data directory: a symbolic link or a named pipe planted in its
place is neither followed (nothing outside is read or written) nor waited on."""


def _read_first_line(path: Path) -> str:
    """The first line of the status file, which must be a regular file (``OSError`` if not)."""
    fd = os.open(path, os.O_RDONLY | _NOT_FOLLOWED)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return file.readline(256).decode("utf-8")


def _write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file at ``path`` (whatever was there is removed first, never
    written through) and fsync it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOT_FOLLOWED, 0o644)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(fd)
