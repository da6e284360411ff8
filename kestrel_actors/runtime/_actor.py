"""A gevent runtime for pykka: actors are greenlets, futures are gevent primitives.

pykka 3+ ships only a threading runtime. On threads every actor hop is an OS-level handoff
(lock, condition, GIL transfer); on gevent it is a deque append and a greenlet switch on the
one hub thread (see ``docs/adr/0001-actor-runtime.md``). The process is *not* monkey-patched:
actors and the network use gevent's own APIs, and anything that really blocks (fsync, Spark)
goes to gevent's threadpool or another process.

A pykka runtime is an actor class that fills three hooks, as ``ThreadingActor`` does:
``_create_actor_inbox`` (here a :class:`_Mailbox`), ``_create_future``
(:class:`GeventFuture`) and ``_start_actor_loop`` (a greenlet running pykka's own
``_actor_loop``). pykka's message loop, failure handling and teardown run as they are, on the
actor's greenlet; pykka's own test suite runs against this runtime in ``make test``
(``tests/runtime/test_pykka_suite.py``). Four pykka internals are kept for speed, and only four
(ADR 0001 says why, with the measurements and the pykka versions tested): ``__init__`` sets
pykka's four fields itself, as properties over its own attributes (``actor_stopped`` a plain
flag, not a ``threading.Event``),
the actor's ref is an ``ActorRef`` whose ``tell`` runs an inline handler without an envelope,
an actor started with ``start_unlisted`` (a session) is not in pykka's ``ActorRegistry``,
so ``_stop`` does pykka's steps less the registry for it, and once such an actor's loop has
ended its ref's weak reference to it (pykka's ``_actor_weakref``) is swapped for a dead one, so
that reference counting may free it (:meth:`_Mailbox._ended`). An unlisted actor that never had
its greenlet and is stopped from its own handler ends without pykka's loop, which would do no more
than on_start and the stop (:meth:`_Mailbox._end_unspawned`).
Everything else happens behind the inbox's ``put``/``get``:

* **inline dispatch** (ADR 0002): a tell to an *idle* actor (its greenlet parked in ``get`` on
  an empty inbox, or not spawned yet) of a class with ``inline_dispatch = True`` runs the
  actor's ``on_receive`` at once on the sender's greenlet instead of waking the actor's own.
  The actor is busy meanwhile, so it still handles one message at a time and in order; what
  reaches it meanwhile is queued and handled by the same sender before ``tell`` returns. On
  the hub only if the actor says none of its handlers can suspend now
  (:meth:`GeventActor.may_run_on_hub`: the hub has nowhere to switch to), and there at most
  two deep: a session's handler runs the queue it asks, but a tell made inside that nested
  run waits until the outer run is over (:class:`_HubRuns`), so that a request's own session
  answers before the sessions the request woke. Never for an
  ``ask``, for pykka's own messages (every class of the public ``pykka.messages`` module: its
  proxy calls and its stop), or for a message type marked :func:`on_own_greenlet`: those
  wake the actor's greenlet, where pykka's loop handles them. A handler that raises inline
  is reported to pykka's loop the same way, as the next message, so that pykka's failure
  handling (log, unregister, ``on_failure``) stays pykka's. An actor with
  ``greenlet_on_demand = True`` gets its greenlet only when something must run there;
* a *dead letter* hook: a tell still in the inbox when an actor stops is handed to
  :meth:`GeventActor.on_dead_letter` as pykka's teardown takes it out, instead of vanishing;
* :meth:`GeventActor.on_inbox_empty`, called before an actor waits on an empty inbox, be it
  its greenlet in ``get`` or a sender at the end of an inline run.

``_dispatcher`` adds a :class:`~._dispatcher.Dispatcher`: a hub callback (a socket read)
tells at once when it is the loop's only ready event and the receiver may run on the hub;
otherwise it hands the tell over, and the dispatcher makes a burst's tells together: a small
burst on the hub while their receivers may run there (:func:`runs_off_hub`), else on a
dispatcher greenlet.
"""

from __future__ import annotations

import itertools
import queue
import sys
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Final, TypeVar

import gevent
import gevent.event
import pykka
import pykka.messages
import structlog
from greenlet import getcurrent, greenlet
from mypy_extensions import mypyc_attr
from pykka import ActorDeadError
from pykka.messages import ProxyCall, ProxyGetAttr, ProxySetAttr

__all__ = [
    "GeventActor", "GeventFuture", "GeventRef", "ReplyFuture", "hub_runs", "of_this_hub", "on_own_greenlet",
    "runs_off_hub", "tell", "tell_quietly",
]

T = TypeVar("T")

log = structlog.get_logger("kestrel_actors.runtime")

_URN_FORMAT = str(uuid.uuid4().urn)[:-12] + "%012x"
"""Actor URNs: one random UUID per process, its last 48 bits a counter. As unique as pykka's
``uuid4()`` per actor, without a ``getrandom`` system call for every connection."""
_URN_NUMBERS: Final = itertools.count(1)
_getcurrent: Final = getcurrent
_get_hub: Final = gevent.get_hub
"""``gevent.get_hub`` through a C static, not a lookup in two modules' dicts: every connection's
inbox asks it (about 450 instructions)."""
"""``getcurrent`` as a ``Final``: compiled code calls it through a C static rather than a lookup in
the module's dict (a tell asks it; ADR 0015)."""
# deque's methods through C statics too: ``items.popleft()`` looks the name up on each call
_new_deque: Final = deque
_append: Final = deque.append
_appendleft: Final = deque.appendleft
_popleft: Final = deque.popleft
_extend: Final = deque.extend
_clear: Final = deque.clear


class CountedDeque:
    """A deque with its length kept as a native count, every change through these methods.

    ``len`` of a deque, or its truth, is a generic call from compiled code (``PyObject_Size``,
    about 45 instructions); ``count`` is a field read. An actor's inbox (:class:`_Mailbox`,
    tested twice a message) and a session's requests not yet run (four times a request) ask it
    on the request path: ~290 instructions of a durable SET's (ADR 0018)."""

    __slots__ = ("items", "count")

    def __init__(self) -> None:
        self.items: deque[Any] = _new_deque()  # through a C static, not the module's dict
        self.count = 0

    def head(self) -> Any:
        """The oldest entry (there is one: ``count`` is positive)."""
        return self.items[0]

    def append(self, entry: Any) -> None:
        _append(self.items, entry)
        self.count += 1

    def appendleft(self, entry: Any) -> None:
        _appendleft(self.items, entry)
        self.count += 1

    def extend(self, entries: list[Any]) -> None:
        _extend(self.items, entries)
        self.count += len(entries)

    def popleft(self) -> Any:
        entry = _popleft(self.items)  # raises on an empty deque before the count moves
        self.count -= 1
        return entry

    def clear(self) -> None:
        if self.count:  # (nearly always empty: a deque's clear costs a call even then)
            _clear(self.items)
            self.count = 0


class _StoppedFlag:
    """``Actor.actor_stopped`` for actors on the hub thread: the ``threading.Event`` methods
    pykka and its users call (``is_set``, ``set``, ``wait``) over a bool.

    A ``threading.Event`` costs a lock, a condition and 4 µs per actor (one per connection),
    and its ``wait`` would block the hub. This runtime reads ``_set`` directly on its
    per-message paths (a method call each saved).
    """

    __slots__ = ("_set", "_event")

    def __init__(self) -> None:
        self._set = False
        self._event: gevent.event.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        if self._event is not None:
            self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait, this greenlet only, until the actor has stopped or ``timeout`` has passed."""
        if not self._set:
            if self._event is None:
                self._event = gevent.event.Event()
            self._event.wait(timeout)
        return self._set


_PYKKA_MESSAGES = frozenset(
    kind
    for kind in vars(pykka.messages).values()
    if isinstance(kind, type) and kind.__module__ == pykka.messages.__name__
)
"""pykka's own messages: every class its public ``pykka.messages`` module defines (the proxy
calls and the stop). They are pykka's to handle, on the actor's greenlet, never inline."""

_STOP_MESSAGES: Final = _PYKKA_MESSAGES - {ProxyCall, ProxyGetAttr, ProxySetAttr}
"""pykka's messages other than its three public proxy messages: its stop."""

assert len(_STOP_MESSAGES) == 1, _STOP_MESSAGES
_STOP: Final[type] = next(iter(_STOP_MESSAGES))
"""pykka's stop message (what its ``Actor.stop`` tells)."""
_STOP_MESSAGE: Final = _STOP()
"""The one stop :meth:`GeventActor.stop` tells: a ``NamedTuple`` of no fields, whose making is an
interpreted ``__new__`` (pykka's loop tells it by its type alone)."""

_OWN_GREENLET: set[type] = set()
"""Message types that never run inline (see :func:`on_own_greenlet`)."""
_NOT_INLINE: Final[set[type]] = set(_PYKKA_MESSAGES)
"""What a tell never runs inline: pykka's messages and :data:`_OWN_GREENLET`."""


def on_own_greenlet(cls: type[T]) -> type[T]:
    """Class decorator: a message of this type always runs on its actor's own greenlet, never
    inline on a sender's or the hub (work that may wait, such as a journal rotation)."""
    _OWN_GREENLET.add(cls)
    _NOT_INLINE.add(cls)
    return cls


@mypyc_attr(allow_interpreted_subclasses=True)
class GeventFuture(pykka.Future[T]):
    """A pykka future backed by :class:`gevent.event.AsyncResult`.

    ``get()`` blocks the calling greenlet only, never the hub. It keeps pykka's contract
    (``queue.Full`` on a second value, or on a value after a get hook, as ``ThreadingFuture``);
    besides pykka's API it offers :meth:`add_done_callback`, which lets an actor react to a
    reply *later* (as a message to itself) rather than blocking in a handler.
    """

    def __init__(self) -> None:
        super().__init__()
        self._result: gevent.event.AsyncResult[Any] = gevent.event.AsyncResult()
        self._hooked = False

    def get(self, *, timeout: float | None = None) -> Any:
        try:
            return super().get(timeout=timeout)
        except NotImplementedError:
            pass
        try:
            return self._result.get(timeout=timeout)
        except gevent.Timeout as exc:
            raise pykka.Timeout(f"{timeout} seconds") from exc

    def set(self, value: Any | None = None) -> None:
        if self._hooked or self._result.ready():
            raise queue.Full
        self._result.set(value)

    def set_exception(self, exc_info: Any = None) -> None:
        if exc_info is None:
            exc_info = sys.exc_info()
        if self._hooked or self._result.ready():
            raise queue.Full
        exc_type, exc_value, exc_tb = exc_info
        if exc_value is None:
            exc_value = exc_type()
        self._result.set_exception(exc_value, exc_info=(exc_type, exc_value, exc_tb))

    def set_get_hook(self, func: Callable[[float | None], T]) -> None:
        if self._result.ready():
            raise queue.Full
        self._hooked = True
        super().set_get_hook(func)

    def ready(self) -> bool:
        return self._result.ready()

    def add_done_callback(self, callback: Callable[[GeventFuture[T]], None]) -> None:
        """Call ``callback(self)`` on the hub once the future has a value or an exception."""
        self._result.rawlink(lambda _result: callback(self))


@mypyc_attr(allow_interpreted_subclasses=True)
class ReplyFuture(GeventFuture[T]):
    """A future that can stand where an actor expects a ``reply_to`` with ``tell()``.

    Actors in this package answer by ``reply_to.tell(message)``; a caller outside any actor
    (a test, the CLI, a gather in the collection) passes a ``ReplyFuture`` and ``get()``s it.
    """

    def tell(self, message: T) -> None:
        self.set(message)


class _Letter:
    """What the inbox hands pykka's loop: the two attributes pykka reads of what ``get``
    returns (``message``, ``reply_to``).

    The inbox holds a tell as its bare message (a queue's answer to its busy session comes
    for every request: no record made for it) and anything else as a ``_Letter``: an ask or
    pykka's own tell (``put``, its envelope's two fields copied), or a letter the inbox
    writes itself (a failure). ``get`` wraps a bare tell into one for pykka's loop."""

    __slots__ = ("message", "reply_to")

    def __init__(self, message: Any, reply_to: Any = None) -> None:
        self.message = message
        self.reply_to = reply_to


def _failure_letter(exc: BaseException) -> _Letter:
    """A proxy call (pykka's public message) that raises ``exc`` in pykka's loop, on the actor's
    greenlet: pykka then fails the actor (an ``Exception``) or stops every actor (any other
    ``BaseException``), as if the handler had raised there."""
    return _Letter(ProxyCall(attr_path=("_raise_from_inline",), args=(exc,), kwargs={}))


def _is_stop(entry: Any) -> bool:
    """Whether an inbox entry is pykka's stop, told (bare, by ``Actor.stop``) or put."""
    if type(entry) is _Letter:
        return entry.reply_to is None and type(entry.message) in _STOP_MESSAGES
    return type(entry) in _STOP_MESSAGES


_AFTER_STOP: Final = _Letter(ProxyGetAttr(attr_path=("actor_urn",)))
"""Put first in the inbox when an inline handler stopped the actor (``_stop()``, as a deleted
queue does) while its greenlet was parked: pykka's loop takes one more message before it sees
the actor stopped, and reading an attribute does nothing. The loop then ends, and its teardown
takes the rest (the dead letters)."""


_NO_ACTOR: Final[weakref.ref[Any]] = weakref.ref(set())
"""A weak reference whose object is gone (the set is freed at once): what an ended unlisted actor's
ref holds instead of the weak reference to it (:meth:`_Mailbox._ended`)."""


class _HubRuns:
    """The inline runs of one hub. A run may nest one other (a session's handler runs the queue
    it asks, inside it); a tell made inside that nested run waits until the outer run is over,
    and then runs, in the order told.

    So a queue's answer to the session whose request it ran (queued in the session's inbox, the
    session being busy up the stack) is handled, its client answered, before the readers that
    request woke are served, as the queue orders its answers. Nested deeper, the woken readers'
    sessions would answer first.
    """

    __slots__ = ("depth", "queued", "hub", "callbacks")

    def __init__(self, hub: Any) -> None:
        self.depth = 0
        self.queued: deque[_Mailbox] = deque()
        self.hub: weakref.ref[Any] = _NO_ACTOR if hub is None else weakref.ref(hub)
        """Its hub, weakly (a hub's runs are kept by the hub, weakly, in ``_hub_runs``)."""
        self.callbacks = 0
        """Hub callbacks running that said so (:meth:`callback_begins`)."""

    def callback_begins(self) -> None:
        """A callback of this hub that tells actors begins (a journal's fdatasync end answering
        its round): until :meth:`callback_ends`, a tell whose teller is not given knows it is
        the hub, without asking ``getcurrent`` (about 180 instructions, once a durable SET).
        Nothing the callback runs switches greenlets: nothing on the hub may."""
        self.callbacks += 1

    def callback_ends(self) -> None:
        self.callbacks -= 1

    def run(self, mailbox: _Mailbox, message: Any) -> None:
        """Run the tell ``message`` inline on the hub (the caller checked that it may): now, or
        once the outer run is over."""
        depth = self.depth
        if depth == 2:
            mailbox.idle = False  # taken: what else reaches it queues behind this
            mailbox.items.append(message)  # a bare tell (see _Letter)
            _append(self.queued, mailbox)
            return
        self.depth = depth + 1
        try:
            mailbox._run_inline(message, mailbox.hub)
        except BaseException:
            if depth == 0:
                self._hand_over()
            raise
        finally:
            self.depth = depth
        if depth == 0 and len(self.queued):  # tells the run made to actors busy up the stack
            queued = self.queued
            self.depth = 1
            try:
                while queued:
                    _popleft(queued).run_queued()
            except BaseException:
                self._hand_over()
                raise
            finally:
                self.depth = 0

    def _hand_over(self) -> None:
        """A run raised: what is queued goes to the actors' own greenlets."""
        queued = self.queued
        while queued:
            _popleft(queued).wake()


_hub_runs: weakref.WeakKeyDictionary[Any, _HubRuns] = weakref.WeakKeyDictionary()
_last_runs: Final[list[_HubRuns]] = [_HubRuns(None)]
"""The inline runs of the hub a mailbox was last made on, made there (its one entry, replaced
whole): a session's mailbox is made on the hub (an accept's callback), for every connection, and
finds its hub and their runs here without ``gevent.get_hub`` and :func:`of_hub` (about 1,200
instructions a connection)."""


def hub_runs() -> _HubRuns:
    """This thread's hub's inline runs: what a hub callback tells through
    (:meth:`_HubRuns.callback_begins`)."""
    return of_this_hub(_hub_runs, _HubRuns)


def of_this_hub(made: weakref.WeakKeyDictionary[Any, T], make: Callable[[Any], T]) -> T:
    """The one ``make(hub)`` of this thread's hub, kept in ``made`` (made on first use).

    Services with one instance per event loop (the hub's inline runs, the dispatcher, thrift's
    open reads) use it, so that a test or tool running its own hub gets its own.
    """
    return of_hub(made, make, _get_hub())


def of_hub(made: weakref.WeakKeyDictionary[Any, T], make: Callable[[Any], T], hub: Any) -> T:
    """:func:`of_this_hub` for a caller that has this thread's ``hub`` at hand already."""
    recent = _recent.get(id(made))
    if recent is not None and recent[0]() is hub:
        return recent[1]  # type: ignore[no-any-return]
    value = made.get(hub)
    if value is None:
        value = made[hub] = make(hub)
    _recent[id(made)] = (weakref.ref(hub), value)
    return value


_recent: Final[dict[int, tuple[weakref.ref[Any], Any]]] = {}
"""Each ``made`` of :func:`of_this_hub` (by id: they live as long as the process) with the hub
it answered last and the answer: every connection asks twice (its inbox's inline runs, the
dispatcher), and ``WeakKeyDictionary.get`` is an interpreted call that makes a weak reference
each time."""


class _Mailbox:
    """An actor's inbox: a deque, the actor's greenlet, and whether the actor is idle.

    ``idle`` means the actor's greenlet is parked in :meth:`get` on an empty inbox and no
    handler of the actor runs anywhere: only then may a sender run a handler inline (see the
    module docstring).
    """

    __slots__ = ("items", "idle", "inline", "actor", "greenlet", "hub", "hub_runs", "runner", "hot", "hot2")

    def __init__(self) -> None:
        self.items = CountedDeque()
        self.idle = False
        self.inline = False
        self.actor: GeventActor | None = None
        self.greenlet: Any = None
        current = _getcurrent()
        runs = _last_runs[0]
        hub: Any = current
        if runs.hub() is not current:  # not made on the hub a mailbox was last made on
            hub = _get_hub()
            runs = of_hub(_hub_runs, _HubRuns, hub)
            if current is hub:
                _last_runs[0] = runs
        self.hub = hub
        self.hub_runs: _HubRuns = runs
        self.runner: Any = None
        """The greenlet that runs the actor's handler now (or last ran one; None: not known):
        a tell its handler makes (:meth:`GeventRef.tell_from`) need not ask ``getcurrent``."""
        self.hot: Any = None
        self.hot2: Any = None
        """The actor's :attr:`GeventActor.hot_messages`, its first and its last (None: none)."""

    def takes_inline(self, kind: type) -> bool:
        """Whether a tell of a message of type ``kind`` may run inline (not one of pykka's, nor
        marked :func:`on_own_greenlet`). The actor's hot messages are told apart by identity
        first: the look-up in a set cost about 70 instructions, three times a request."""
        return kind is self.hot or kind is self.hot2 or kind not in _NOT_INLINE

    def put(self, envelope: Any, /) -> None:
        """Queue ``envelope`` (pykka's ``ask`` and ``Actor.stop`` come here) as a
        :class:`_Letter`, or run a tell inline; wake the actor's greenlet if it waits for it."""
        if self.idle and self.inline and envelope.reply_to is None and self.ran_inline(envelope.message):
            return
        self.enqueue(_Letter(envelope.message, envelope.reply_to))

    def enqueue(self, entry: Any) -> None:
        """Queue ``entry`` (a bare tell or a :class:`_Letter`) for the actor's greenlet, waking
        it if it waits."""
        self.items.append(entry)
        if self.idle:
            self.wake()

    def ran_inline(self, message: Any) -> bool:
        """Run the tell ``message`` at once on this greenlet if the rules allow (the caller saw
        the actor idle, of an inline class): whether it did."""
        if not self.takes_inline(type(message)):
            return False
        current = _getcurrent()
        if current is not self.hub:
            self._run_inline(message, current)
            return True
        if self.actor.may_run_on_hub():  # type: ignore[union-attr]
            self.hub_runs.run(self, message)
            return True
        return False

    def wake(self) -> None:
        """Let the actor's greenlet run what is queued (the caller saw the actor idle): switch
        to it where it is parked in :meth:`get`, or spawn it if it never ran."""
        self.idle = False
        if self.greenlet is None:
            # a bare greenlet: gevent.spawn's Greenlet costs 5 µs more, for links nobody uses
            self.greenlet = greenlet(self._loop, self.hub)
        self.hub.loop.run_callback(self.greenlet.switch)

    def _loop(self) -> None:
        """What the actor's greenlet runs: pykka's loop, then :meth:`_ended`."""
        actor = self.actor
        assert actor is not None
        actor._actor_loop()
        self._ended()

    def _ended(self) -> None:
        """pykka's loop is over (the actor has stopped and its teardown has run): an unlisted
        actor (one per connection) lets go of its mailbox here. The actor, its mailbox and its
        ref refer to one another; cut, reference counting frees a connection's objects as soon
        as nothing refers to them, where the cyclic collector would have found them later, at a
        cost of its own (ADR 0020). A tell after this raises ``ActorDeadError`` (its ref's
        flag), an ``ask`` too (pykka's ``is_alive``): no one reads ``actor`` again."""
        actor = self.actor
        if actor is not None and not actor.listed:
            # pykka's ActorRef keeps a weak reference to its actor. The compiled actor's dealloc
            # does not clear weak references (mypyc: a native class that has them from pykka's
            # Actor), so the actor must have none left when reference counting frees it: a
            # weak reference left to freed memory unlinks itself there later, and crashed the
            # server. The collector clears them first, which is why the cycles hid it. pykka
            # reads this only for a live actor (its proxy); a dead weak reference stands in.
            actor.ref.weak_actor = _NO_ACTOR
            self.actor = None

    def get(self) -> Any:
        """The next envelope for pykka's loop; parks the actor's greenlet while there is none.

        pykka's teardown takes what is left through here too: a tell among it goes to
        ``on_dead_letter`` on its way out.
        """
        items = self.items
        actor: GeventActor = self.actor  # type: ignore[assignment]
        while not items.count:
            # pykka's loop runs on the actor's own greenlet (or, from _end_unspawned, on a
            # sender's: None lets a tell its handler makes ask which); a sender's inline run
            # may have set another while this one was parked
            self.runner = self.greenlet
            try:
                actor.on_inbox_empty()
            except Exception as exc:  # noqa: BLE001 - the actor's failure, for pykka's loop
                return _failure_letter(exc)
            if items.count:
                break
            self.idle = True
            try:
                self.hub.switch()  # until wake()
            except BaseException as exc:  # noqa: BLE001 - thrown into the parked greenlet
                self.idle = False
                self.runner = self.greenlet
                return _failure_letter(exc)
        self.runner = self.greenlet
        entry = items.popleft()
        envelope = entry if type(entry) is _Letter else _Letter(entry)
        if envelope.reply_to is None and actor.stopped_flag._set:
            message = envelope.message
            if type(message) not in _PYKKA_MESSAGES:
                try:
                    actor.on_dead_letter(message)
                except Exception:
                    log.exception("dead letter handler failed", actor=str(actor))
        return envelope

    def empty(self) -> bool:
        return not self.items.count

    def run_queued(self) -> None:
        """Run on the hub the tell :class:`_HubRuns` queued here, if the actor still may run
        there; otherwise its greenlet takes it. The tell is the inbox's first letter (the
        actor was idle, its inbox empty, when it was queued) and passed the inline rules then."""
        actor = self.actor
        if actor is None:  # its loop has ended (_ended): the tell is a dead letter
            return
        if not actor.stopped_flag._set and actor.may_run_on_hub():
            self._run_inline(self.items.popleft(), self.hub)  # a bare tell (``_HubRuns.run``)
        else:
            self.wake()

    def _run_inline(self, message: Any, runner: Any) -> None:
        """Handle the tell ``message`` and then the inbox in order on this greenlet, the actor
        idle until now, until the inbox is empty (the actor is idle again) or a message needs
        the actor's own greenlet (it is woken for the rest: an ask, pykka's messages, one
        marked :func:`on_own_greenlet`, the actor stopped or failed).

        One set of rules with the actor's own loop: ``on_inbox_empty`` before every wait, a
        failed tell fails the actor. ``runner``: the sender's greenlet; if it is the hub, each
        further message asks :meth:`GeventActor.may_run_on_hub` again, since the first may have
        changed the answer.
        """
        actor: GeventActor = self.actor  # type: ignore[assignment]
        items = self.items
        stopped = actor.stopped_flag
        on_hub = runner is self.hub
        self.runner = runner
        self.idle = False
        try:
            actor.on_receive(message)
            while not stopped._set:
                if not items.count:
                    actor.on_inbox_empty()
                    if items.count or stopped._set:
                        continue
                    self.idle = True
                    return
                # taken first and put back if it is not run here: a deque has no native index,
                # and a look at ``items[0]`` before the ``popleft`` was a generic read per message
                entry = items.popleft()
                if type(entry) is _Letter:
                    # tested on the entry itself, so that the compiled build reads it natively
                    if entry.reply_to is not None:  # an ask: pykka's loop answers it
                        items.appendleft(entry)
                        break
                    message = entry.message
                else:
                    # a bare tell queued while the actor was busy (a queue's answer to its
                    # session, for every request)
                    message = entry
                if (
                    not self.takes_inline(type(message))
                    or (on_hub and not actor.may_run_on_hub())
                ):
                    items.appendleft(entry)
                    break
                actor.on_receive(message)
        except BaseException as exc:
            if not isinstance(exc, (gevent.GreenletExit, gevent.Timeout)):
                items.appendleft(_failure_letter(exc))
                self.wake()
                return
            # thrown into this, the sender's, greenlet while the handler waited: the sender's
            # to handle; the actor, its handler cut short, fails alone
            cut_short = RuntimeError(f"{exc!r} was thrown into the greenlet running a handler")
            cut_short.__cause__ = exc
            items.appendleft(_failure_letter(cut_short))
            self.wake()
            raise
        if stopped._set:
            items.appendleft(_AFTER_STOP)  # a handler called _stop(): pykka's loop must end
        elif not _is_stop(items.head()):
            self.wake()
            return
        if self.greenlet is None and (not on_hub or actor.may_run_on_hub()):
            # an actor that never needed its greenlet, and what comes next ends it: pykka's loop
            # runs here, on this greenlet, and cannot wait (its first message is the end); a
            # session's hang-up is spared a greenlet's spawn and first switch
            self._end_unspawned(actor)
            self._ended()
            return
        self.wake()

    def _end_unspawned(self, actor: GeventActor) -> None:
        """pykka's loop for an actor whose greenlet never ran, its next message its end. An
        unlisted actor (a session: one per connection) stopped by :meth:`GeventActor.stop` has
        nothing else in its inbox: what pykka's loop does then is done here, compiled (its five
        interpreted calls cost a connection about 6,000 instructions): ``on_start`` (a failure
        handled as pykka does: logged, the actor stopped), the stop taken (its ``_stop``), and an
        empty inbox left. Anything else (a listed actor, a stop asked for with a reply, more
        letters) runs pykka's own loop."""
        items = self.items
        if actor.listed or items.count != 1 or type(items.head()) not in _STOP_MESSAGES:
            actor._actor_loop()
            return
        try:
            actor.on_start()
        except Exception:  # noqa: BLE001 - pykka's own handling (its _actor_loop_setup)
            actor._handle_failure(*sys.exc_info())
        items.popleft()  # a bare stop: no reply to set, not a dead letter (pykka's teardown, alike)
        if not actor.stopped_flag._set:
            actor._stop()


class GeventRef(pykka.ActorRef[Any]):
    """pykka's ``ActorRef`` with a ``tell`` for this runtime's hot path (one of the three
    internals ADR 0001 keeps). Every actor of this runtime has one (``actor_ref``, ``ref``);
    code that holds refs on the request path types them as this class, so that the compiled
    build calls ``tell`` and ``is_alive`` directly (ADR 0015).

    pykka's ``tell`` costs two method calls for the liveness check and an envelope for the
    inbox; an inline tell here needs neither (the handler runs before ``tell`` returns). It
    saves 0.2 µs a tell, and every request makes three (the dispatcher's, the session's batch,
    the queue's answer). What does not run inline goes to the inbox as pykka's tell would.
    """

    def __init__(self, actor: GeventActor) -> None:
        # pykka's ActorRef.__init__ sets these five (the internal ADR 0001 keeps for pykka's
        # Actor.__init__, here for its ref): an interpreted call through ``super()`` cost a
        # connection 1.5 µs more than the stores (one ref per connection's actor). They are this
        # class's own attributes, pykka's names properties over them: stored in an instance dict
        # (made for the first), they cost a connection 1,800 instructions more
        self.weak_actor: weakref.ref[Any] = weakref.ref(actor)
        self.kind: type[Any] = type(actor)
        self.urn_number = actor.urn_number
        """Its actor's (``actor_urn``, formatted when read)."""
        self._urn: str | None = None
        self.mailbox: _Mailbox = actor.mailbox
        self.stopped_flag = actor.stopped_flag

    @property
    def _actor_weakref(self) -> weakref.ref[Any]:
        """pykka's weak reference to the actor (its proxies read it)."""
        return self.weak_actor

    @_actor_weakref.setter
    def _actor_weakref(self, ref: weakref.ref[Any]) -> None:
        self.weak_actor = ref

    @property
    def actor_class(self) -> type[Any]:
        return self.kind

    @actor_class.setter
    def actor_class(self, kind: type[Any]) -> None:
        self.kind = kind

    @property
    def actor_inbox(self) -> Any:
        return self.mailbox

    @actor_inbox.setter
    def actor_inbox(self, mailbox: Any) -> None:
        self.mailbox = mailbox

    @property
    def actor_stopped(self) -> Any:
        return self.stopped_flag

    @actor_stopped.setter
    def actor_stopped(self, flag: Any) -> None:
        self.stopped_flag = flag

    @property
    def actor_urn(self) -> str:
        """pykka's ``actor_urn``: its actor's, formatted when first read."""
        urn = self._urn
        if urn is None:
            urn = self._urn = _URN_FORMAT % self.urn_number
        return urn

    @actor_urn.setter
    def actor_urn(self, urn: str) -> None:
        self._urn = urn

    def is_alive(self) -> bool:
        # pykka's reads ``actor_stopped`` through two interpreted calls; a session asks before
        # every batch it sends
        return not self.stopped_flag._set

    def tell(self, message: Any) -> None:
        self.tell_from(message, None)

    def tell_from(self, message: Any, current: Any) -> None:
        """:meth:`tell`, by a teller that knows the greenlet it runs on: ``current`` (the hub, a
        dispatcher greenlet, or a running handler's :attr:`_Mailbox.runner`; None: not known).
        A tell asks ``getcurrent`` otherwise (about 120 instructions, three times a request)."""
        if self.stopped_flag._set:
            raise ActorDeadError(f"{self} not found")
        mailbox = self.mailbox
        # _Mailbox.ran_inline's rules (and takes_inline's), written out: calls less per tell on the request path
        kind = type(message)
        if mailbox.idle and mailbox.inline and (kind is mailbox.hot or kind is mailbox.hot2 or kind not in _NOT_INLINE):
            hub_runs = mailbox.hub_runs
            # inside a hub run the teller is the hub (a run never switches): no ``getcurrent``
            # call for the tell a session's batch makes to its queue
            if not hub_runs.depth:
                if current is None:
                    current = mailbox.hub if hub_runs.callbacks else _getcurrent()
                if current is not mailbox.hub:
                    mailbox._run_inline(message, current)
                    return
            actor = mailbox.actor
            assert actor is not None  # an idle mailbox has its actor: a typed, direct call
            if actor.may_run_on_hub():
                hub_runs.run(mailbox, message)
                return
        mailbox.enqueue(message)  # bare: see _Letter


def tell(receiver: Any, message: Any) -> None:
    """``receiver.tell(message)``, for code that tells whoever it was handed (a ``reply_to``):
    one of this runtime's refs (nearly always) by a direct call in the compiled build, anything
    else (a gather, a future, a test's stand-in) by name."""
    if type(receiver) is not GeventRef:
        receiver.tell(message)
        return
    ref: GeventRef = receiver  # typed: the compiled build calls its method directly
    ref.tell(message)


def runs_off_hub(receiver: Any, message: Any) -> bool:
    """Whether a greenlet's tell of ``message`` would run ``receiver``'s handler inline where a
    tell from the hub may not: an idle inline actor that may not run on the hub now (journal file
    work may be due). :meth:`GeventRef.tell`'s rules, asked without telling: the dispatcher's
    burst on the hub hands such a tell to a dispatcher greenlet, which runs it inline."""
    if type(receiver) is not GeventRef:
        return False  # a future or a join: its tell runs nothing that may wait
    ref: GeventRef = receiver  # typed: the compiled build reads its fields natively
    mailbox = ref.mailbox
    if ref.stopped_flag._set or not mailbox.idle or not mailbox.inline or not mailbox.takes_inline(type(message)):
        return False  # not run inline by any tell: queued (and its greenlet woken) alike
    actor = mailbox.actor
    return actor is None or not actor.may_run_on_hub()


def tell_quietly(receiver: Any, message: Any, current: Any = None) -> None:
    """:func:`tell` for a teller that carries on whatever becomes of the message: a receiver that
    has stopped is passed over (the message has no one to reach), any other failure is logged.
    ``current``: the teller's greenlet, if it knows it (:meth:`GeventRef.tell_from`)."""
    try:
        if type(receiver) is GeventRef:
            ref: GeventRef = receiver  # typed: the compiled build calls its method directly
            ref.tell_from(message, current)
        else:
            receiver.tell(message)
    except ActorDeadError:
        pass
    except Exception:
        log.exception("tell failed", receiver=str(receiver))


@mypyc_attr(allow_interpreted_subclasses=True)
class GeventActor(pykka.Actor):
    """A pykka actor whose loop is a greenlet and whose inbox is a :class:`_Mailbox`.

    Subclasses implement ``on_receive`` as usual. Handlers run one at a time; a handler that
    needs an answer from another actor sends a message carrying a ``reply_to`` and returns,
    and the answer arrives later as a message.
    """

    inline_dispatch: ClassVar[bool] = False
    """Whether a sender may run this actor's handlers on its own greenlet when the actor is
    idle. Set it only for actors whose handlers never block the hub-free caller for long."""

    greenlet_on_demand: ClassVar[bool] = False
    """Whether the actor's greenlet is spawned only when something must run there (an ask,
    pykka's messages, one marked :func:`on_own_greenlet`, its stop), not at start: until then
    an inline actor is run by its senders. pykka's ``on_start`` runs on that greenlet, so only
    for an inline actor whose ``on_start`` need not come before its first message (a session:
    one per connection, most of which never need a greenlet of their own)."""

    hot_messages: ClassVar[tuple[type, ...]] = ()
    """At most two message types the actor gets on every request, none of pykka's nor marked
    :func:`on_own_greenlet`: a tell of one is known to run inline by its type's identity, with
    no look-up (:meth:`_Mailbox.takes_inline`)."""

    def may_run_on_hub(self) -> bool:
        """Whether a tell made on the hub (a socket callback) may run this idle inline actor's
        handlers right there: only if none of them can suspend now (the hub has nowhere to
        switch to). The default is no: the tell wakes the actor's own greenlet."""
        return False

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        # pykka's __init__ sets these four (the other internal ADR 0001 keeps), with a
        # threading.Event, a uuid4 and pykka's ActorRef: 16 µs per actor against 3 (one actor
        # per connection)
        self.urn_number = next(_URN_NUMBERS)
        """Makes ``actor_urn``, formatted only when read: most actors (a connection's) never are."""
        # pykka's fields are properties over this class's own attributes (below): compiled code
        # reads these natively, and no instance dict is made for pykka's (800 instructions and
        # a dict per connection)
        self.mailbox: _Mailbox = self._create_actor_inbox()
        self.stopped_flag = _StoppedFlag()
        self.ref = GeventRef(self)
        """``actor_ref`` as a plain attribute: pykka's is an interpreted property, and a session
        reads it for every batch it sends."""
        self.listed = True
        """Whether pykka's ``ActorRegistry`` lists it (:meth:`start_unlisted`)."""

    @property
    def actor_inbox(self) -> Any:
        return self.mailbox

    @actor_inbox.setter
    def actor_inbox(self, mailbox: Any) -> None:
        self.mailbox = mailbox

    @property
    def actor_stopped(self) -> Any:
        return self.stopped_flag

    @actor_stopped.setter
    def actor_stopped(self, flag: Any) -> None:
        self.stopped_flag = flag

    @property
    def _actor_ref(self) -> Any:
        """What pykka's ``actor_ref`` property returns."""
        return self.ref

    @_actor_ref.setter
    def _actor_ref(self, ref: Any) -> None:
        self.ref = ref

    @property
    def actor_urn(self) -> str:
        """pykka's ``actor_urn``: its ref's (one rule, in :class:`GeventRef`), so the two never
        differ, also after either is set."""
        return self.ref.actor_urn

    @actor_urn.setter
    def actor_urn(self, urn: str) -> None:
        self.ref.actor_urn = urn

    @classmethod
    def start_unlisted(cls, *args: Any, **kwargs: Any) -> GeventRef:
        """pykka's ``start`` without listing the actor in pykka's ``ActorRegistry``, for an actor
        made once per connection (a session). The registry is a list: taking an actor out of
        it scans the list (two scans, past about one entry per open connection) and formats
        two debug lines, so a connection's stop cost grew with the connections open. Nothing
        looks a session up there, and the shutdown ends sessions itself (its drain) rather than
        through the registry's ``stop_all``."""
        actor = cls(*args, **kwargs)
        actor.listed = False
        actor._start_actor_loop()
        return actor.ref

    def stop(self) -> None:
        # pykka's ``Actor.stop`` (its stop message told to the actor's ref), compiled: pykka's is
        # an interpreted call and its ``actor_ref`` an interpreted property, and a session stops
        # itself this way at the end of every connection
        self.ref.tell(_STOP_MESSAGE)

    def _stop(self) -> None:
        # pykka's ``_stop`` (flag set, then ``on_stop``, whose failure is the actor's), less the
        # registry for an actor it does not list (start_unlisted)
        if self.listed:
            super()._stop()
            return
        self.stopped_flag.set()
        try:
            self.on_stop()
        except Exception:  # noqa: BLE001 - pykka's own handling: logged, the actor stopped
            self._handle_failure(*sys.exc_info())

    @staticmethod
    def _create_actor_inbox() -> Any:
        return _Mailbox()

    @staticmethod
    def _create_future() -> GeventFuture[Any]:
        return GeventFuture()

    def _start_actor_loop(self) -> None:
        mailbox = self.mailbox
        mailbox.actor = self
        mailbox.inline = self.inline_dispatch
        hot = self.hot_messages
        if hot:
            mailbox.hot = hot[0]
            mailbox.hot2 = hot[-1]
        if self.greenlet_on_demand:
            mailbox.idle = True  # senders run it inline until something needs its greenlet
        else:
            mailbox.wake()

    def on_receive(self, message: Any) -> Any:
        # declared on this compiled class, so that the mailbox calls a compiled subclass's handler
        # through mypyc's method table rather than a lookup up pykka's classes and a generic call
        return super().on_receive(message)

    def on_start(self) -> None:
        # pykka's no-op, compiled: pykka's loop calls it at the start of every actor's loop (a
        # session's runs at its stop), and an interpreted method is a frame more
        pass

    def on_inbox_empty(self) -> None:
        """Called before the actor waits for its next message (hook)."""

    def on_dead_letter(self, message: Any) -> None:
        """Handle a ``tell`` that was still in the inbox when the actor stopped.

        The default drops it; override to answer the sender (it is called on the actor's
        greenlet, after ``on_stop``).
        """

    def _raise_from_inline(self, exc: BaseException) -> None:
        """The target of :func:`_failure_letter`: raises, in pykka's loop, what a handler
        raised inline (or what was thrown into the parked greenlet)."""
        raise exc
