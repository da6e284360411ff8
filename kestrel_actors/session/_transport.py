"""A client socket as the connection actor sees it: bytes in through a callback, bytes out.

Reading runs in a hub I/O watcher callback, not in a greenlet of its own: when the socket is
readable the callback does one non-blocking read, decodes, and tells the connection actor.
That saves a greenlet switch per request over a reader loop. Writing never waits either: a
reply is sent with one non-blocking write and whatever the kernel does not take is kept
and sent by a write watcher, because the connection actor's handlers may run on another
actor's greenlet (inline dispatch, ADR 0002) and must not suspend it. Reading pauses while
the actor has a backlog of commands or the output buffer is large, so a client that
pipelines without reading replies cannot make the server buffer without bound.

A client that does not read costs little: once any reply waits unsent, the transport is
``backed_up`` and the session makes no more replies until the client has taken them all (the
drain tells it to go on). The kernel holds at most ``UNSENT_IN_KERNEL`` bytes not yet sent
(``TCP_NOTSENT_LOWAT``; its own autotuned buffer took 3 MiB of a non-reader's replies), so
what waits is the server's to keep, in sight of the budget below. A session's flush of many
replies (a part of a batch of fetches, up to about 1 MiB) comes as parts (``send_parts``) and
is written with ``writev`` as it is: joined, each flush cost a fresh mapping and its page
faults. So does a lone GET hit's reply (its header, data and ``END``) from 8 KiB on: joined,
its data was copied once more (below that, the kernel's gathering costs more: ADR 0020). What
the kernel does not take is kept, from where it stopped (``_drop_sent``), and written on with
``writev``: a write costs what it sends, not what waits.

The end of input (the client's FIN: a half-close, ``shutdown(SHUT_WR)``, or a close) is not a
hang-up: the client may still read, so the session answers every request read before it, then
closes (behaviour §1). A reset or a failed read or write is a hang-up: the client has gone, and
the session ends at once. A FIN cannot be told from a full close, so from the end of input on
no fetch of the session waits in a queue: an item handed to a waiter of a client that has gone
would be lost.

A paused connection is not blind to its client ending: while reading is paused its socket
is registered for ``EPOLLRDHUP`` (the peer's FIN or RST, however much unread data is queued
before it) in one epoll set per hub, which the hub watches as a single descriptor. A reset
seen there ends the session at once; a FIN ends its waits at once (the requests still unread
before it are read once reading resumes), so a fetch parked for a client that has gone is
cancelled before an item can reach it. Nothing of this runs per request: a socket enters the
set only when its reading pauses and leaves it when reading resumes.

A newcomer whose first read is large (a long pipeline, a large SET) waits for its turn: such
newcomers are handled one per loop pass, oldest first, while a newcomer with a small first
read (most clients' first requests) is handled at once. The listener asks the kernel once
how much waits (``first_read_bytes``). One found heavy when accepted is not even set up until
its turn (``take_turns``: its session and transport are made then, and its first read is done
at once); the listener takes a burst of them from the kernel's accept backlog in one pass for
about 10 µs each, so a fresh client behind them is served at once and the burst does not stall
the connected clients (ADR 0011). A light one whose request waits already is read as it is set
up; one with nothing waiting yet is looked at when it becomes readable, and if heavy by then
waits at its first read. Only a connection's first read is looked at: nothing of this runs per
request.

What a connection holds (its decoder's unfinished request, the requests read but not yet
handled, the unsent replies) is told to the server's :class:`BufferBudget` whenever it changes,
which closes the heaviest connections when the sum is over ``--max-buffered-bytes``. A closed
connection lets go of its buffers at once: its objects form reference cycles (the callbacks
hold the session actor, which holds the transport), and with the collector tuned for the
request path (``server._tune_gc``) a cycle holding a half-sent 48 MiB request could live on
for a long time after its client has gone.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import select
import socket
import struct
import termios
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

import gevent
import structlog
from mypy_extensions import i64, mypyc_attr

from ..messages import peer_name
from ..protocol import Decoder

if TYPE_CHECKING:
    from ..stats import ServerStats
    from ._budget import BufferBudget

__all__ = [
    "CLIENT_SOCKET_OPTIONS", "LIGHT_FIRST_READ", "CommandSink", "SocketTransport", "Transport", "first_read_bytes",
    "heavy_first_read", "take_turns",
]

log = structlog.get_logger("kestrel_actors.transport")

READ_SIZE: Final = 64 * 1024
"""Below malloc's mmap threshold: a larger read buffer costs an mmap and munmap per read.

``os.read`` makes a ``bytes`` of this size and shrinks it to what came (about 680 instructions
of a one-client SET's 18,700), and still no read costs less while the decoder gets ``bytes``: glibc's
``malloc`` costs about 300 instructions for any block over 1 KiB, so a smaller read saves nothing
(4 KiB: the same per SET, 1.8 times the instructions per pipelined item, in more reads), and a
reused buffer (``os.readv``) copied out into ``bytes`` of the exact size costs 1,640 more per SET
(callgrind, ADR 0020)."""
_read: Final = os.read
_write: Final = os.write
_writev: Final = os.writev
"""The socket is read and written through its descriptor, with ``os.read`` and ``os.write``
(``recv`` and ``send`` with no flags, to the kernel): the socket's own ``recv`` and ``send``
parse their arguments from a tuple made for each call, the ``os`` functions from the call's
arguments, which saves about 1,100 instructions per request and its reply."""
BACKLOG_COMMANDS: Final = 4096
"""Commands handed over before reading pauses until the connection actor catches up."""
OUTPUT_HIGH: Final = 1024 * 1024
"""Unsent reply bytes above which reading pauses until the client has taken them."""
UNSENT_IN_KERNEL: Final = 128 * 1024
"""Reply bytes the kernel may hold not yet sent (``TCP_NOTSENT_LOWAT``): past them a write
takes no more, and what it leaves is the server's to keep (see the module docstring)."""
CLIENT_SOCKET_OPTIONS: Final = (
    (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_IN_KERNEL),
)
"""Every client socket's options (level, option, value): replies leave at once (``TCP_NODELAY``),
a peer that vanished is found (``SO_KEEPALIVE``, behaviour §1), the kernel holds at most
``UNSENT_IN_KERNEL`` unsent bytes. The listener sets them on its own socket, and Linux copies them
to every socket it accepts: three system calls less per connection (``server._Listener``)."""
IOV_MAX: Final = 1024
"""Buffers one ``writev`` may take (Linux's ``IOV_MAX``)."""
CLOSE_LINGER = 10.0
"""Seconds a closing connection may take to deliver its last unsent replies."""
LIGHT_FIRST_READ: Final = 1024
"""A newcomer's first read of at most this many bytes is handled at once; a larger one waits
for its turn (one per loop pass: see the module docstring)."""


_PerLoop = TypeVar("_PerLoop")


def _one_per_loop(by_loop: dict[Any, _PerLoop], loop: Any, make: Callable[[Any], _PerLoop]) -> _PerLoop:
    """The one object of a kind that ``loop`` (a hub's) has, made at the first asking."""
    found = by_loop.get(loop)
    if found is None:
        found = by_loop[loop] = make(loop)
    return found


class _Newcomers:
    """The heavy newcomers of one hub, taking turns: one per loop pass, oldest first. A turn
    is a callable that returns whether it took the turn (a connection closed meanwhile does
    not, and the next one goes)."""

    _by_loop: ClassVar[dict[Any, _Newcomers]] = {}

    def __init__(self, loop: Any) -> None:
        self.waiting: deque[Callable[[], bool]] = deque()
        self.turn_taken = False
        """A heavy newcomer was handled in this pass."""
        self.timer = loop.timer(0.0)
        """Fires in the next pass: the next turn."""

    @classmethod
    def of(cls, loop: Any) -> _Newcomers:
        return _one_per_loop(cls._by_loop, loop, cls)

    def may_go(self, turn: Callable[[], bool]) -> bool:
        """Whether a heavy newcomer may be handled now (taking this pass's turn); if not,
        ``turn`` is queued, and called in a later pass."""
        if not self.turn_taken and not self.waiting:
            self.turn_taken = True
            self._next_pass()
            return True
        self.waiting.append(turn)
        self._next_pass()
        return False

    def _next_pass(self) -> None:
        if not self.timer.active:
            self.timer.start(self._turn)

    def _turn(self) -> None:
        self.turn_taken = False
        waiting = self.waiting
        while waiting:
            if waiting.popleft()():
                self.turn_taken = True
                break
        if self.turn_taken:
            self._next_pass()


class BusyPoll:
    """One hub's busy poll: after a read, the hub polls its sockets without sleeping for up to
    ``seconds`` (libev's idle watcher keeps its ``epoll_wait`` at a timeout of 0), and only then
    sleeps. On this kind of VM a thread asleep in ``epoll_wait`` halts its vCPU, and the wake-up
    of a halted vCPU cost a one-client request more than the server's work (ADR 0025): a client
    whose next request comes within ``seconds`` finds the hub awake. Each empty turn yields the
    CPU (``sched_yield``), so a process that shares the vCPU runs as if the hub slept. While a
    thread of the hub's pool works (an ``fdatasync``, a journal read) the hub sleeps instead: a
    polling hub retakes the GIL every turn, and the thread, done, waited up to CPython's switch
    interval for it (the durable row ran at 0.83×); nor does a read start the poll then (each
    start and stop cost a durable SET about 3 µs).

    Nor does the hub poll on a vCPU another process wants. Time off the CPU between two empty
    turns of a poll (the clock's time less the hub thread's CPU time: a polling hub does not
    sleep) was another task's, at a yield or by preemption: that vCPU does not halt, so there is
    no wake-up to save, and a hub that polls on is runnable when its next request comes, so it
    waits for the end of the other task's slice (a one-client request took 3.9 ms beside a
    process computing on the same CPU, 0.07 ms with the hub asleep: the scheduler runs a woken
    task at once). Over :data:`WANTED_GAP` of it, the poll stops, and no read starts it for a
    pause (:data:`WANTED_PAUSE`). Nothing runs per request but :meth:`touch`; an idle server
    polls not at all."""

    _by_loop: ClassVar[dict[Any, BusyPoll]] = {}

    __slots__ = ("loop", "watcher", "pool", "seconds", "polling", "touched", "until", "wanted_gap",
                 "turn_clock", "turn_cpu", "given_way", "pause", "pause_seconds")

    def __init__(self, loop: Any) -> None:
        """Made on the thread of the hub whose ``loop`` this is (``of``)."""
        self.loop = loop
        self.watcher = loop.idle()
        self.pool: Any = gevent.get_hub().threadpool
        """The hub's threads; ``len``: the jobs they have not finished."""
        self.seconds = 0.0
        """How long to poll after the last read; 0: never (``busy_poll``, set by the server)."""
        self.polling = False
        """Whether ``watcher`` is started (asked per read: a watcher's ``active`` is a lookup)."""
        self.touched = False
        """A read came since the last empty turn: the poll runs for ``seconds`` from then."""
        self.until = 0.0
        self.wanted_gap = WANTED_GAP
        self.turn_clock = 0.0
        """The clock's time at this poll's last empty turn; 0: none yet."""
        self.turn_cpu = 0.0
        """The hub thread's CPU time then."""
        self.given_way = False
        """Another task wanted the vCPU, and the pause since is not over: no read starts the poll."""
        self.pause: Any = None
        """The timer that ends the give-way (it holds no server up: ``ref=False``)."""
        self.pause_seconds = 0.0
        """The last give-way's pause; 0 once a poll has ended by itself."""

    @classmethod
    def of(cls, loop: Any) -> BusyPoll:
        return _one_per_loop(cls._by_loop, loop, cls)

    def touch(self) -> None:
        """A read was handled: poll for ``seconds`` after the hub has nothing left to do."""
        self.touched = True
        if not self.polling and self.seconds > 0.0 and not self.given_way and not len(self.pool):
            self.polling = True
            self.watcher.start(self._empty_turn)

    def _empty_turn(self) -> None:
        # libev runs an idle watcher only in a turn that found nothing else to do
        clock, cpu = _monotonic(), _thread_time()
        off = clock - self.turn_clock - (cpu - self.turn_cpu)
        if self.turn_clock and off > self.wanted_gap:
            # asked first: the other task may have run past the poll's end
            self._stop()
            self.given_way = True
            # as long as the other task had the vCPU, doubled while it takes it again at each
            # poll after a pause (a process that computes), up to WANTED_PAUSE
            self.pause_seconds = min(max(off, 2.0 * self.pause_seconds), WANTED_PAUSE)
            # a fresh timer: libev restarts a fired one with the time it had left (none)
            self.pause = self.loop.timer(self.pause_seconds, ref=False)
            self.pause.start(self._paused)
            return
        now = self.loop.now()
        if self.touched:
            self.touched = False
            self.until = now + self.seconds
        elif now >= self.until or len(self.pool):
            self._stop()
            self.pause_seconds = 0.0  # a poll that ended with nobody else wanting the vCPU
            return
        self.turn_clock, self.turn_cpu = clock, cpu
        _sched_yield()

    def _stop(self) -> None:
        self.polling = False
        self.watcher.stop()
        self.turn_clock = 0.0  # the hub sleeps now: the next poll's first turn has none before it

    def _paused(self) -> None:
        self.given_way = False


WANTED_GAP: Final = 0.0005
"""Seconds off the CPU between two empty turns of a poll beyond which another task wanted the
vCPU: a task given it runs until it blocks or its slice ends, ms for one that computes (a yield
with nothing else to run returns in about a µs; a kernel thread's turn, or a load generator's
between two requests on the same vCPU, takes tens of µs, and pausing the poll for it cost the
one-client rows more than it saved)."""

WANTED_PAUSE: Final = 0.05
"""The longest pause of the poll after it gave way. A pause lasts as long as the other task
had the vCPU, and doubles at each give-way that follows a pause (the task took the vCPU again
at the next poll), until a poll ends by itself: each poll beside a process that computes costs
one request that process's slice, while each request in a pause pays the wake-up the poll saves
(a fixed pause of ten times the slice lost the one-client rows' gain on this shared machine)."""

_monotonic: Final = time.monotonic
_thread_time: Final = time.thread_time
_sched_yield: Final = os.sched_yield
_ioctl: Final = fcntl.ioctl
_FIONREAD: Final = termios.FIONREAD
_waiting: Final = array.array("i", [0])
"""``FIONREAD``'s answer, written in place: one buffer for the hub's thread, which alone asks."""


def first_read_bytes(fd: int) -> int:
    """How many bytes a newcomer's first read would take now (``FIONREAD``; 0 if the kernel cannot
    say: the read itself tells what happened). Over ``LIGHT_FIRST_READ`` it waits for its turn
    (see the module docstring). The idle check asks it too: unread bytes are not idleness."""
    try:
        _ioctl(fd, _FIONREAD, _waiting)
    except OSError:
        return 0
    return _waiting[0]


def heavy_first_read(fd: int) -> bool:
    """Whether a newcomer's first read would be over ``LIGHT_FIRST_READ`` bytes: it then waits
    for its turn (see the module docstring)."""
    return first_read_bytes(fd) > LIGHT_FIRST_READ


def take_turns(turn: Callable[[], bool]) -> bool:
    """Whether a heavy newcomer may be set up now (taking this pass's turn), else ``turn``
    sets it up in a later pass: see the module docstring."""
    return _Newcomers.of(gevent.get_hub().loop).may_go(turn)


class _HangUpWatch:
    """The paused sockets of one hub, watched for their peer hanging up (see the module docstring).

    One epoll set, level-triggered on ``EPOLLRDHUP`` only (``EPOLLHUP`` and ``EPOLLERR`` come
    with every registration): it becomes readable only when one of its sockets' clients has
    gone, never for incoming requests. The hub watches the set's own descriptor.
    """

    _by_loop: ClassVar[dict[Any, _HangUpWatch]] = {}

    def __init__(self, loop: Any) -> None:
        self.epoll = select.epoll()
        self.transports: dict[int, SocketTransport] = {}
        self.watcher = loop.io(self.epoll.fileno(), 1)
        self.watcher.start(self._fired)

    @classmethod
    def of(cls, loop: Any) -> _HangUpWatch:
        return _one_per_loop(cls._by_loop, loop, cls)

    def add(self, transport: SocketTransport) -> None:
        fd = transport.fd
        if fd in self.transports:
            return
        try:
            self.epoll.register(fd, select.EPOLLRDHUP)
        except OSError:  # closed meanwhile: the actor learns it from its next send
            return
        self.transports[fd] = transport
        transport.watched = True

    def discard(self, transport: SocketTransport) -> None:
        # asked as every connection ends, which is nearly never watched: its own flag says so,
        # where a look in the dict boxed its descriptor and hashed it (twice a connection)
        if not transport.watched:
            return
        transport.watched = False
        fd = transport.fd
        del self.transports[fd]
        try:
            self.epoll.unregister(fd)
        except OSError:
            pass

    def _fired(self) -> None:
        try:
            ready = self.epoll.poll(0)
        except OSError:
            return
        for fd, events in ready:
            transport = self.transports.get(fd)
            if transport is not None:
                self.discard(transport)
                transport.hung_up(events)


@mypyc_attr(allow_interpreted_subclasses=True)  # a test's or a bench's stand-in keeps what is sent
class Transport:
    """What a session sends its replies through.

    A compiled base class rather than a ``Protocol``: the session reads ``backed_up`` and calls
    ``sendall`` for every request, natively through this class, by name through a ``Protocol``.
    """

    __slots__ = ("backed_up",)

    def __init__(self) -> None:
        self.backed_up = False
        """Whether unsent replies are piling up (over ``OUTPUT_HIGH``): the session should stop
        producing more."""

    def sendall(self, data: bytes) -> None:
        """Send ``data`` or keep it to send; raises ``OSError`` once the client has gone."""
        raise NotImplementedError

    def send_parts(self, parts: list[bytes], size: int) -> None:
        """Send ``parts`` (``size`` bytes in all) in order, as :meth:`sendall` their
        concatenation: which this does, unless a transport sends them without joining them.
        ``parts`` is not kept: the caller may clear it."""
        self.sendall(b"".join(parts))

    def resume(self) -> None:
        """The session has answered everything it was handed: read on."""
        raise NotImplementedError

    def reuse(self, command: Any) -> None:
        """``command`` has been answered and nobody holds it any longer: its decoder may refill
        it (``Decoder.reuse``). A transport without one lets it go."""

    def close(self) -> None:
        """Close once what is kept has been sent."""
        raise NotImplementedError


class CommandSink:
    """Where a transport hands the commands it decoded (``on_commands``): a plain callable,
    or a compiled subclass that overrides :meth:`hand_over`.

    A compiled class rather than a ``Callable``: the server's sink (``_connections``) is
    called for every read natively, where a closure is a call by the generic protocol, whose
    arguments are parsed again, and so is the bound method it calls in turn.
    """

    __slots__ = ("_call",)

    def __init__(self, call: Callable[[list[Any]], None] | None = None) -> None:
        self._call = call

    def hand_over(self, commands: list[Any]) -> None:
        """Take ``commands`` (decoded in order; an empty list: the client has taken the
        replies that waited, go on)."""
        if self._call is not None:
            self._call(commands)


_IGNORE_COMMANDS: Final = CommandSink()
"""A released transport's sink: it hands nothing on."""


class SocketTransport(Transport):
    """Owns one accepted, non-blocking socket; see the module docstring."""

    __slots__ = ("sock", "_reading", "fd", "decoder", "on_commands", "on_hang_up", "on_input_end", "stats",
                 "_watcher", "_handed", "closed", "_idle_timer", "_idle_timeout", "_last_read", "_unread_seen",
                 "_out", "_out_bytes", "_writer", "_closing", "_linger", "_hang_ups", "budget",
                 "held", "address", "_handed_bytes", "_out_held", "input_ended", "_fin_seen", "_queued", "watched",
                 "_busy_poll")

    def __init__(
        self,
        sock: Any,
        decoder: Decoder,
        on_commands: Callable[[list[Any]], None] | CommandSink,
        on_hang_up: Callable[[], None],
        stats: ServerStats,
        budget: BufferBudget,
        idle_timeout: float | None = None,
        address: Any = "",
        on_input_end: Callable[[bool], None] | None = None,
        loop: Any = None,
    ) -> None:
        """``on_hang_up``: the client has gone (a reset, a failed read or write, the idle
        timeout). ``on_input_end(final)``: the client's FIN, read (``final``: every request
        before it has been handed over) or seen by the hang-up watch while reading is paused
        (requests before it may still be unread); without it, a FIN is a hang-up. ``loop``: this
        thread's hub's loop, if the caller has it at hand (asking the hub costs a connection
        about 1,500 instructions)."""
        super().__init__()
        self.sock = sock
        self.address = address
        """The client's address as ``accept`` gave it (or a label): :attr:`peer` names it."""
        self.budget = budget
        # the byte counts the budget is told of in native 64-bit integers: a read and a resume
        # each add them up and tell the budget, which boxed arithmetic made ~90 instructions
        self.held: i64 = 0
        """Bytes this connection holds, as last told to ``budget``."""
        self._handed_bytes: i64 = 0
        """Bytes of the reads whose requests were handed over since the actor last caught up."""
        self.fd = sock.fileno()
        self.decoder = decoder
        self.on_commands: CommandSink = (on_commands if isinstance(on_commands, CommandSink)
                                         else CommandSink(on_commands))
        self.on_hang_up = on_hang_up
        self.on_input_end: Callable[[bool], None] = on_input_end or _hang_up_instead(on_hang_up)
        self.input_ended = False
        """The end of input has been read: nothing more comes from this client."""
        self._fin_seen = False
        """The client's FIN has been told to the session (read, or seen while paused)."""
        self._queued = False
        """Its heavy first read waits for its turn (``_Newcomers``)."""
        self.stats = stats
        """Where the bytes read are counted (``bytes_read``)."""
        self._handed = 0
        self.closed = False
        self._out: list[bytes | memoryview] = []
        self._out_bytes = 0
        self._out_held: i64 = 0
        """The memory ``_out`` keeps: a view keeps the whole reply it is part of."""
        self._closing = False
        self._linger: Any = None
        if loop is None:
            loop = gevent.get_hub().loop
        self._watcher: Any = _read_watcher(loop, self.fd)  # the stubs lack a watcher's loop and active
        self._reading = False
        """Whether ``_watcher`` is started: kept here, because its ``active`` is a lookup by name
        and ``resume`` asks after every request."""
        self._hang_ups = _HangUpWatch.of(loop)
        self._busy_poll = BusyPoll.of(loop)
        self.watched = False
        """Whether the hang-up watch holds it (``_HangUpWatch.add``, ``discard``)."""
        self._writer: Any = None
        """The write watcher, made the first time the kernel does not take a whole reply."""
        self._idle_timeout = idle_timeout
        self._idle_timer: Any = None
        self._last_read = 0.0
        """When the client was last seen sending (a read, or more unread bytes: ``_check_idle``);
        kept only with an idle timeout (asking the loop cost every connection 400 instructions)."""
        self._unread_seen = 0
        """The unread bytes ``_check_idle`` saw then (0 after a read)."""
        if idle_timeout:
            # Kestrel's client_timeout: a connection that sends nothing for that long is closed
            self._idle_timer = loop.timer(idle_timeout, idle_timeout / 4)
            self._last_read = loop.now()

    @property
    def peer(self) -> str:
        """The client's ``host:port``, written out only when logged (``Session.peer``)."""
        return peer_name(self.address)

    def start(self, read_now: bool = False) -> None:
        """Read from now on; ``read_now``: the first read is known to be due now, and is done at
        once (a heavy newcomer's turn has come, ``take_turns``, or a light newcomer's request
        was waiting when it was accepted): its size is not asked of the kernel again."""
        self.budget.join(self)  # left in _release: a transport never started is never a member
        self._watcher.start(self._readable if read_now else self._first_readable)
        self._reading = True
        if self._idle_timer is not None:
            self._idle_timer.start(self._check_idle)
        if read_now:
            self._readable()

    def _check_idle(self) -> None:
        """Close the connection if its client has sent nothing for ``idle_timeout``. Bytes
        waiting unread, more than the last check saw, were sent since: when the loop was held
        up (the process stopped, the hub busy) past the timeout, this check comes due in the
        same pass as the read of the request that came meanwhile, and runs first; and while
        reading is paused, a client that goes on sending is not idle either."""
        if self.closed:
            return
        now = self._idle_timer.loop.now()
        if now - self._last_read < self._idle_timeout:
            return
        unread = first_read_bytes(self.fd)
        if unread > self._unread_seen:
            self._last_read = now
            self._unread_seen = unread
            return
        log.info("closing idle connection", idle_seconds=self._idle_timeout)
        self._stop_reading()
        self._idle_timer.stop()
        self.on_hang_up()

    def _first_readable(self) -> None:
        """The first read: at once if small, else when its turn comes (module docstring)."""
        if heavy_first_read(self.fd) and not _Newcomers.of(self._watcher.loop).may_go(self.take_turn):
            self._queued = True
            self._pause()
            return
        self._watcher.start(self._readable)
        self._readable()

    def take_turn(self) -> bool:
        """Its heavy first read's turn has come (called by ``_Newcomers``); ``False`` if it
        has closed meanwhile."""
        if self.closed or self._closing:
            return False
        self._queued = False
        self._hang_ups.discard(self)
        self._watcher.start(self._readable)
        self._reading = True
        self._readable()
        return True

    def _readable(self) -> None:
        try:
            data: bytes = _read(self.fd, READ_SIZE)  # typed: its length is native
        except BlockingIOError:
            return
        except OSError:  # a reset: the client has gone
            self._stop_reading()
            self.on_hang_up()
            return
        except Exception:
            log.exception("read failed")
            self._stop_reading()
            self.on_hang_up()
            return
        if not len(data):  # (compiled, a bytes' truth is a generic call, its length native)
            self._stop_reading()
            self.input_ended = self._fin_seen = True
            self.on_input_end(True)
            return
        self._busy_poll.touch()
        if self._idle_timer is not None:
            self._last_read = self._idle_timer.loop.now()
            self._unread_seen = 0
        self.stats.bytes_read += len(data)
        decoder = self.decoder
        try:
            commands = decoder.feed(data)
        except Exception:
            log.exception("decoder failed")
            self._stop_reading()
            self.on_hang_up()
            return
        if decoder.closed:
            self._pause()  # the actor answers what came before, then closes
        if commands:
            self._handed += len(commands)
            self._handed_bytes += len(data)
            self.on_commands.hand_over(commands)
            if self._handed > BACKLOG_COMMANDS:
                self._pause()
        if not self.closed:
            self._account()

    def _account(self) -> None:
        """Tell the budget what this connection holds, if that changed."""
        held = self._out_held + self.decoder.buffered + self._handed_bytes
        if held != self.held:
            self.budget.moved(held - self.held)
            self.held = held

    def _pause(self) -> None:
        """Stop reading requests, but keep watching for the client hanging up."""
        self._watcher.stop()
        self._reading = False
        if not self.closed and not self._closing and not self._fin_seen:
            self._hang_ups.add(self)

    def _read_again(self) -> None:
        self._hang_ups.discard(self)
        self._watcher.start(self._readable)
        self._reading = True

    def _stop_reading(self) -> None:
        # asked up to three times as a connection ends (its FIN read, the close, the release):
        # a stopped watcher is not stopped again (a generic call into gevent each)
        if self._reading:
            self._watcher.stop()
            self._reading = False
        self._hang_ups.discard(self)

    def hung_up(self, events: int) -> None:
        """The client reset the connection, or sent its FIN, while reading was paused (called
        by the hang-up watch with the socket's epoll events)."""
        if self.closed:
            return
        if events & _GONE:
            if self._closing:
                self._close_now()  # nobody is left to take the last replies
                return
            self._watcher.stop()
            self._reading = False
            self.on_hang_up()
        elif not self._closing and not self._fin_seen:
            # a FIN alone: the client may still read; the requests before it are read once
            # reading resumes, and the session's waits end now
            self._fin_seen = True
            self.on_input_end(False)

    def _may_read(self) -> bool:
        return (not self._closing and not self.decoder.closed and not self.input_ended and not self._queued
                and self._handed <= BACKLOG_COMMANDS and self._out_bytes <= OUTPUT_HIGH)

    def resume(self) -> None:
        """The connection actor has caught up: read again if reading was paused."""
        self._handed = 0
        if self._handed_bytes:
            self._handed_bytes = 0
            if self.held and not self.closed:  # else the read that handed them accounts
                self._account()
        if not self._reading and self._may_read():
            self._read_again()

    def reuse(self, command: Any) -> None:
        self.decoder.reuse(command)

    def sendall(self, data: bytes) -> None:
        """Send ``data`` after anything still unsent; never waits. Raises ``OSError`` if the
        connection failed (later failures reach the actor as end of input)."""
        if self.closed:  # its descriptor number may belong to another connection by now
            raise OSError(errno.EBADF, "the connection is closed")
        if self._out:
            self._keep(data)
            return
        try:
            sent = _write(self.fd, data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            self._keep(_unsent(data, sent))
            self._await_writable()

    def send_parts(self, parts: list[bytes], size: int) -> None:
        """Send ``parts`` (``size`` bytes) after anything still unsent, with one ``writev``
        and no joining (see the module docstring). Never waits, does not keep ``parts``
        itself, and raises ``OSError`` as :meth:`sendall` does."""
        if self.closed:
            raise OSError(errno.EBADF, "the connection is closed")
        out = self._out
        if out:  # written after what waits, by the write watcher
            out.extend(parts)
            self._out_bytes += size
            self._out_held += size
            self._backed_up()
            return
        try:
            sent = _writev(self.fd, parts if len(parts) <= IOV_MAX else parts[:IOV_MAX])
        except BlockingIOError:
            sent = 0
        if sent == size:  # the usual case: the kernel took it all, nothing is kept
            return
        out.extend(parts)
        self._out_bytes += size - sent
        self._out_held += size - self._drop_sent(sent)
        self._await_writable()
        self._backed_up()

    def _await_writable(self) -> None:
        if self._writer is None:
            self._writer = self._watcher.loop.io(self.sock.fileno(), 2)
        self._writer.start(self._writable)

    def _keep(self, data: bytes | memoryview) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        self._out_held += _footprint(data)
        self._backed_up()

    def _backed_up(self) -> None:
        """Replies wait in ``_out``: the client takes them slower than they come. The session
        makes no more until they are sent, and past ``OUTPUT_HIGH`` reading pauses too; the
        drain (:meth:`_writable`) resumes both."""
        self.backed_up = True
        if self._out_bytes > OUTPUT_HIGH:
            self._pause()
        self._account()

    def _write_out(self) -> None:
        """Write what ``_out`` holds (its first ``IOV_MAX`` buffers) with one ``writev`` and
        drop what the kernel took; raises ``OSError`` if the client is gone. The work is in
        proportion to what is sent, not to what waits: nothing is joined, and only the unsent
        part of one buffer may be copied (``_unsent``)."""
        out = self._out
        try:
            sent = _writev(self.fd, out if len(out) <= IOV_MAX else out[:IOV_MAX])
        except BlockingIOError:
            return
        self._out_bytes -= sent
        self._out_held -= self._drop_sent(sent)

    def _drop_sent(self, sent: int) -> int:
        """Drop the first ``sent`` bytes of ``_out`` (what a ``writev`` took): whole buffers,
        and of the one it stopped in, all but its unsent part (``_unsent``). Returns the memory
        let go of (``_footprint``); the caller settles ``_out_bytes`` and ``_out_held``."""
        out = self._out
        held = 0
        index = 0
        for part in out:  # (a for loop reads each slot with no bounds check)
            if isinstance(part, bytes):  # a reply's part (two per item of a monitor stream)
                size = len(part)  # native, and all the memory it keeps: no _footprint call
                if sent < size:
                    break
                held += size
            else:
                size = part.nbytes
                if sent < size:
                    break
                held += _footprint(part)
            sent -= size
            index += 1
        if sent:
            head = out[index]
            rest = _unsent(head, sent)
            held += _footprint(head) - _footprint(rest)
            out[index] = rest
        del out[:index]
        return held

    def _writable(self) -> None:
        try:
            self._write_out()
        except OSError:  # the client is gone: what is unsent is lost with it
            self._drop_output()
            self._account()
            self._writer.stop()
            if self._closing:
                self._close_now()
            else:
                self._stop_reading()
                self.on_hang_up()
            return
        self._account()
        if self._out:
            return
        self._writer.stop()
        self.backed_up = False
        if self._closing:
            self._close_now()
            return
        if not self._reading and self._may_read():
            self._read_again()
        self.on_commands.hand_over([])  # the actor stopped producing while backed up: go on

    def close(self) -> None:
        """Stop reading and close once the unsent replies are delivered (or after a linger)."""
        if self.closed or self._closing:
            return
        self._closing = True
        self._stop_reading()
        if self._idle_timer is not None:
            self._idle_timer.stop()
        if not self._out:
            self._close_now()
            return
        self._linger = self._watcher.loop.timer(CLOSE_LINGER)
        self._linger.start(self._close_now)

    def shed(self) -> None:
        """End this connection now, dropping what it holds: the server buffers more than
        ``--max-buffered-bytes`` and this connection holds the most (called by the budget)."""
        if self.closed:
            return
        try:
            # a reset, not a FIN: the kernel drops the unsent replies too, and the client
            # sees that it was cut off
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        except OSError:
            pass
        on_hang_up = self.on_hang_up
        self._closing = True
        self._close_now()
        on_hang_up()

    def _close_now(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._release()
        self._stop_reading()
        _spare_watcher(self._watcher)
        self._watcher = _NO_WATCHER  # another connection's from now on: never started or stopped here
        if self._writer is not None:
            self._writer.stop()
            self._writer.close()
        if self._linger is not None:
            self._linger.close()
        if self._idle_timer is not None:
            self._idle_timer.close()
        try:
            self.sock.close()
        except OSError:
            pass

    def _release(self) -> None:
        """Let go of the buffers now, and of the callbacks (they close the cycle through the
        session actor): see the module docstring."""
        self._drop_output()
        self._handed_bytes = 0
        self.decoder.release()
        if self.held:
            self.budget.moved(-self.held)
            self.held = 0
        self.budget.leave(self)
        self.on_commands = _IGNORE_COMMANDS
        self.on_hang_up = _IGNORE_HANG_UP
        self.on_input_end = _IGNORE_INPUT_END

    def _drop_output(self) -> None:
        self._out, self._out_bytes, self._out_held, self.backed_up = [], 0, 0, False


SPARE_WATCHERS: Final = 1024
"""Read watchers of closed connections kept per hub for the next ones (see ``_read_watcher``)."""
_spare_watchers: Final[dict[Any, list[Any]]] = {}


def _read_watcher(loop: Any, fd: int) -> Any:
    """A read watcher of ``fd`` (stopped): a closed connection's, given this descriptor, if one is
    spare. gevent checks a descriptor with an ``fcntl`` system call when it makes a watcher, not
    when an idle one is given another (one of ten system calls per connection), and making and
    freeing a watcher costs more instructions than handing one on."""
    spare = _spare_watchers.get(loop)
    if spare:
        watcher = spare.pop()
        watcher.fd = fd
        return watcher
    return loop.io(fd, 1)


def _spare_watcher(watcher: Any) -> None:
    """Keep a closed connection's read watcher (stopped: its callback let go) for the next one."""
    spare = _spare_watchers.get(watcher.loop)
    if spare is None:
        spare = _spare_watchers[watcher.loop] = []
    if len(spare) < SPARE_WATCHERS:
        spare.append(watcher)
    else:
        watcher.close()


class _NoWatcher:
    """A closed transport's read watcher: its own has gone to another connection."""

    loop: Any = None

    def start(self, *_args: Any) -> None:
        pass

    def stop(self) -> None:
        pass


_NO_WATCHER: Final = _NoWatcher()


def _unsent(data: bytes | memoryview, sent: int) -> bytes | memoryview:
    """The part of ``data`` the kernel did not take: a view while that is most of the reply
    it belongs to (a large reply is not copied per send), a copy once it is less than half
    (else a few unsent bytes would keep a whole large reply alive)."""
    rest = memoryview(data)[sent:]
    if 2 * len(rest) < _footprint(data):
        return bytes(rest)
    return rest


def _footprint(data: bytes | memoryview) -> int:
    """The memory ``data`` keeps alive. Compiled, ``isinstance(data, bytes)`` and a bytes'
    length are native, where ``type(data) is memoryview`` looked the builtin up by name, once
    per part sent (three per item of a monitor stream)."""
    if isinstance(data, bytes):
        return len(data)
    return len(data.obj)  # type: ignore[arg-type]


_GONE: Final = select.EPOLLHUP | select.EPOLLERR
"""A hang-up watch event with either of these is a reset (or both directions shut), not a FIN alone."""

_RESET = struct.pack("ii", 1, 0)
"""``SO_LINGER`` on, with no time to linger: ``close`` resets the connection."""


def _ignore() -> None:
    pass


def _ignore_input_end(_final: bool) -> None:
    pass


_IGNORE_HANG_UP: Final = _ignore
_IGNORE_INPUT_END: Final = _ignore_input_end
"""What a closed transport calls (:meth:`SocketTransport._release`), through C statics: the two
functions by name are looked up in the module's dict, as every connection ends."""


def _hang_up_instead(on_hang_up: Callable[[], None]) -> Callable[[bool], None]:
    def on_input_end(_final: bool) -> None:
        on_hang_up()
    return on_input_end
