"""An fdatasync the hub hands to the kernel, not to a thread: Linux AIO's ``IOCB_CMD_FDSYNC``.

Why: with ``sync_journal = always`` every round of the group commit waits for one fdatasync,
and on gevent's threadpool each costs a hand-off both ways: a worker thread woken (a futex, a
wait for a CPU) that needs the GIL to start the call and again to return from it, while the
hub holds the GIL serving the sessions. With 100 clients on this 2-core VM the journal's
``writev`` came 0.12–0.18 ms before the worker's fdatasync started (median; mean 0.26–0.74 ms,
p99 up to 6.6 ms, the GIL's 5 ms switch interval), and the server made 0.086 futex calls per
durable SET against Redis's 0.001 (Redis blocks its one thread in its fdatasync: issue 56).
``io_submit`` queues the fdatasync from the hub in one system call that does not wait (the
kernel runs it on a workqueue), and its end makes an eventfd readable that the hub's loop
watches: no thread of ours, no GIL, the result read on the hub as a thread's was.

Only Linux on x86-64 and arm64 (the system call numbers below), and only when ``fdatasync``
is libc's own (no ``LD_PRELOAD``): a preloaded one (the fault shim of ``tests/server/test_disk_failures.py``, a
tracer) would not see these calls, so then, or when the kernel refuses, :func:`open_aio_sync`
returns None and the writer keeps the threadpool.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys
from collections.abc import Callable
from typing import Any, Final

__all__ = ["AioSync", "failure", "open_aio_sync"]

_SYSCALLS: Final = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}
"""io_setup, io_destroy, io_getevents, io_submit (glibc wraps none of them)."""
_IOCB: Final = struct.Struct("<QIIHhIQQqQII")
"""struct iocb, little-endian: data, key, rw_flags, opcode, reqprio, fd, buf, nbytes, offset,
reserved2, flags, resfd."""
_EVENT: Final = struct.Struct("<QQqq")
"""struct io_event: data, obj, res (0 or -errno), res2."""
_FDSYNC: Final = 3
_FLAG_RESFD: Final = 1
_UNSUPPORTED: Final = frozenset((errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM))

_ONE: Final = ctypes.c_long(1)
_ZERO: Final = ctypes.c_long(0)
"""The counts passed as C longs: the system calls read whole registers."""

_libc: Any = None
_usable: bool | None = None


def _load() -> bool:
    """Whether AIO may be used in this process (decided once)."""
    global _libc, _usable
    if _usable is None:
        _usable = False
        # a preloaded library may replace fdatasync, and it would not see these calls (the
        # executable's own reference to the symbol hides which one the process resolves)
        preloaded = bool(os.environ.get("LD_PRELOAD")) or os.path.exists("/etc/ld.so.preload")
        if sys.platform == "linux" and platform.machine() in _SYSCALLS and not preloaded:
            try:
                _libc = ctypes.CDLL(None, use_errno=True)
            except OSError:
                return False
            _usable = True
    return _usable


class AioSync:
    """One journal writer's fdatasyncs through one AIO context, one at a time."""

    def __init__(self, ctx: ctypes.c_ulong, loop: Any) -> None:
        self._ctx = ctx
        self._setup, self._destroy, self._getevents, self._submit = _SYSCALLS[platform.machine()]
        self._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._iocb = ctypes.create_string_buffer(_IOCB.size)
        self._pointers = (ctypes.c_void_p * 1)(ctypes.addressof(self._iocb))
        self._events = ctypes.create_string_buffer(_EVENT.size)
        self._no_wait = (ctypes.c_long * 2)(0, 0)
        self._done: Callable[[int], None] | None = None
        self._watcher = loop.io(self._eventfd, 1)
        self._watcher.ref = False  # the writer's own lock waits for a round in flight, not the loop
        self._watcher.start(self._ready)
        self.broken = False
        """The kernel refused a submission as unsupported: use the threadpool from now on."""

    def submit(self, fd: int, done: Callable[[int], None]) -> bool:
        """Start an fdatasync of ``fd``; ``done(result)`` runs on the hub when it ends (0, or
        minus the errno). False when it could not be started (nothing will be called)."""
        _IOCB.pack_into(self._iocb, 0, 0, 0, 0, _FDSYNC, 0, fd, 0, 0, 0, 0, _FLAG_RESFD, self._eventfd)
        self._done = done
        if _libc.syscall(self._submit, self._ctx, _ONE, self._pointers) == 1:
            return True
        self._done = None
        if ctypes.get_errno() in _UNSUPPORTED:
            self.broken = True
        return False

    def _ready(self) -> None:
        try:
            os.eventfd_read(self._eventfd)
        except BlockingIOError:
            return
        if _libc.syscall(self._getevents, self._ctx, _ZERO, _ONE, self._events, self._no_wait) != 1:
            return  # not ended yet (the eventfd counts ends only): the next wake-up reads it
        done, self._done = self._done, None
        if done is not None:
            done(_EVENT.unpack_from(self._events)[2])

    def close(self) -> None:
        """Release the context (waits for a submission in flight) and the eventfd."""
        self._watcher.stop()
        self._watcher.close()
        _libc.syscall(self._destroy, self._ctx)
        os.close(self._eventfd)


def open_aio_sync(loop: Any) -> AioSync | None:
    """An :class:`AioSync` on ``loop`` (the hub's), or None where AIO cannot serve."""
    if not _load():
        return None
    ctx = ctypes.c_ulong(0)
    if _libc.syscall(_SYSCALLS[platform.machine()][0], _ONE, ctypes.byref(ctx)) != 0:
        return None  # aio-max-nr reached, or no AIO in this kernel
    return AioSync(ctx, loop)


def failure(result: int) -> OSError:
    """The error of an fdatasync that ended with ``result`` < 0."""
    return OSError(-result, os.strerror(-result))
