"""The queue collection: the server-level actor that knows every queue by name.

It validates names, creates a queue actor on a name's first reference (and a fanout child's
registration with its master), deletes queues, and runs the operations that span queues
(stats, flush_all, expiry sweeps, shutdown) by gathering the answers of every queue actor
without blocking.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import gevent
import structlog
from pykka import ActorDeadError

from ..config import ServerConfig
from ..journal import MemoryJournal, NotRegularFile
from ..messages import (
    FLUSH,
    IGNORE,
    Add,
    AliasAdd,
    BatchDone,
    CloseQueue,
    Delete,
    DeleteQueue,
    ForAll,
    ForAllKind,
    Gather,
    GetStats,
    JournalFailure,
    Load,
    QueueBatch,
    QueueStats,
    Reconfigure,
    Resolve,
    Resolved,
    SetChildren,
    SetConfig,
    Sweep,
)
from ..queue import QueueCore, fanout_master, is_fanout_child, is_queue_name
from ..runtime import GeventActor
from ..stats import ServerStats
from ._queue import QueueActor

__all__ = ["QueueCollection", "QueueOpener", "memory_opener"]

log = structlog.get_logger("kestrel_actors.collection")

QueueOpener = Callable[[str, Any], QueueCore]
"""``opener(name, queue_config)`` builds a queue's core, replaying its journal if it has one.
An opener may also have ``open_many([(name, queue_config), ...])``, answering each name's core
or the exception opening it raised: start-up opens the queues found on disk with it at once
(``journal.FileOpener``: one replay job for them all)."""


def memory_opener(name: str, config: Any) -> QueueCore:
    return QueueCore(name, config, MemoryJournal())


class QueueCollection(GeventActor):
    """Owns the name → queue actor map. One per server."""

    inline_dispatch = True
    """A session's lookup runs on the session's greenlet when the collection is idle (every
    new connection makes one): no two greenlet switches for a dictionary lookup. Opening a
    queue may read its journal, which suspends that greenlet, never the hub."""

    def __init__(self, config: ServerConfig, stats: ServerStats, opener: QueueOpener = memory_opener):
        super().__init__()
        self.config = config
        self.stats = stats
        self.opener = opener
        self.queues: dict[str, Any] = {}
        self.children: dict[str, dict[str, Any]] = {}
        self.alias_counts: dict[str, list[int]] = {}
        self.alias_created: dict[str, int] = {}
        """When each alias was first configured (at start-up or by a reload), as Kestrel's
        ``AliasedQueue.createTime``."""
        self._note_aliases()
        self.shutting_down = False
        self._opened: dict[str, QueueCore | Exception] = {}
        """Start-up only: the cores ``opener.open_many`` made, until each queue's actor starts."""

    def on_receive(self, message: Any) -> Any:
        kind = type(message)
        if kind is Resolve:
            message.reply_to.tell(self._resolve(message.name, message.create))
        elif kind is Delete:
            self._delete(message.name, message.reply_to)
        elif kind is ForAll:
            self._for_all(message)
        elif kind is AliasAdd:
            self._alias_add(message)
        elif kind is Load:
            self.load(message.names)
        elif kind is Reconfigure:
            self._reconfigure(message.config)
            message.reply_to.tell(True)
        else:
            return super().on_receive(message)
        return None

    # -- names ----------------------------------------------------------------------------

    def load(self, names: list[str]) -> None:
        """Create the queues found on disk, and the fanout children the config names.

        Both happen before the listeners start: a child named in the config must receive
        copies of the very first SET to its master (Kestrel users were caught out otherwise).
        """
        legal = []
        for name in names:
            if is_queue_name(name):
                legal.append(name)
            else:
                log.warning("skipping journal with an illegal queue name", queue=name)
        # Everything made here lives as long as its queue: the cyclic collector's passes over
        # it, growing with every queue made, were a sixth of a 5,000-queue start-up.
        collecting = gc.isenabled()
        gc.disable()
        try:
            open_many = getattr(self.opener, "open_many", None)
            if open_many is not None:
                self._opened = open_many([(name, self.config.queue_config(name)) for name in legal])
            for name in legal:
                try:
                    self._queue(name)
                except NotRegularFile as exc:
                    # its archives stay untouched on disk; a stray in the journal's place must
                    # not stop the server (a crash loop under a supervisor)
                    log.error("cannot open a queue: its journal's path is not a regular file", queue=name,
                              error=str(exc))
        finally:
            self._opened = {}
            if collecting:
                gc.enable()
        self._create_configured_children()

    def _note_aliases(self) -> None:
        now = int(time.time())
        for name in self.config.aliases:
            self.alias_created.setdefault(name, now)

    def _create_configured_children(self) -> None:
        for name in self.config.queues:
            if is_fanout_child(name) and is_queue_name(name):
                self._queue(name)

    def _reconfigure(self, config: ServerConfig) -> None:
        """``reload``: new queue settings and aliases apply to live queues at once (behaviour §5.13)."""
        self.config = config
        self._note_aliases()
        for name, ref in self.queues.items():
            try:
                ref.tell(SetConfig(config.queue_config(name)))
            except ActorDeadError:
                pass
        self._create_configured_children()

    def _resolve(self, name: str, create: bool) -> Resolved:
        alias = self.config.aliases.get(name)
        if alias is not None:
            return Resolved(name, alias=alias)
        if name not in self.queues:
            if not create or self.shutting_down:
                return Resolved(name)
            if not is_queue_name(name):
                return Resolved(name, valid=False)
        try:
            return Resolved(name, self._queue(name))  # replayed anew if its actor had failed
        except OSError as exc:  # its journal cannot be opened or created (a full disk)
            log.error("cannot open queue", queue=name, error=str(exc))
            return Resolved(name, error=f"cannot open queue: {exc.strerror or exc}")

    def _queue(self, name: str) -> Any:
        """The queue's actor, created (and its journal replayed) if there is none.

        An actor that stopped on a failure has closed its journal: the queue is replayed anew,
        or every client of it would be handed the dead actor again and again.
        """
        ref = self.queues.get(name)
        if ref is not None:
            if ref.is_alive():
                return ref
            log.error("queue actor had failed; reopening the queue from its journal", queue=name)
        queue_config = self.config.queue_config(name)
        expire_target = None
        if queue_config.expire_to_queue and is_queue_name(queue_config.expire_to_queue):
            expire_target = self._queue(queue_config.expire_to_queue)
        core = self._opened.pop(name, None)
        if core is None:
            core = self.opener(name, queue_config)
        elif isinstance(core, Exception):
            raise core
        ref = QueueActor.start(name, queue_config, core.journal, self.stats, core, expire_target)
        self.queues[name] = ref  # its actor opened its metrics (ServerStats.open_queue)
        self.stats.queue_creates += 1
        master = fanout_master(name)
        if master is not None:
            self.children.setdefault(master, {})[name] = ref
            self._tell_children(master)
        elif name in self.children:
            self._tell_children(name)
        log.debug("queue created", queue=name)
        return ref

    def _tell_children(self, master: str) -> None:
        ref = self.queues.get(master)
        if ref is not None:
            ref.tell(SetChildren(self.children.get(master, {})))

    # -- operations -----------------------------------------------------------------------

    def _delete(self, name: str, reply_to: Any) -> None:
        ref = self.queues.pop(name, None)
        master = fanout_master(name)
        if master is not None:
            self.children.setdefault(master, {}).pop(name, None)
            self._tell_children(master)
        if ref is None:
            reply_to.tell(True)
            return
        self.stats.forget_queue(name)
        self.stats.queue_deletes += 1
        try:
            ref.tell(DeleteQueue(reply_to))
        except ActorDeadError:
            reply_to.tell(True)

    def _after_sweep(self, answers: list[Any]) -> list[int]:
        """Delete the queues that expired (behaviour §5.12); answer the expired-item counts."""
        counts = []
        for answer in answers:
            if answer is None:
                continue
            name = answer.name
            counts.append(answer.expired)
            if answer.queue_expired and name in self.queues:
                log.info("queue expired", queue=name)
                self.stats.queue_expires += 1
                self._delete(name, IGNORE)
        return counts

    def _alias_add(self, message: AliasAdd) -> None:
        counts = self.alias_counts.setdefault(message.name, [0, 0])
        counts[0] += 1
        counts[1] += len(message.data)
        refs, failures = [], []
        for name in self._destinations(message.name, set()):
            try:
                refs.append(self._queue(name))
            except OSError as exc:  # not acknowledged: as if its journal had failed the add
                log.error("cannot open queue", queue=name, error=str(exc))
                failures.append(BatchDone([JournalFailure(exc)]))
        reply_to = message.reply_to
        gather = Gather(len(refs) + len(failures), lambda done: reply_to.tell([d.results[0] for d in done]))
        for failure in failures:
            gather.tell(failure)
        op = Add(message.data, message.expiry)
        gather.send(refs, lambda g: QueueBatch([op], None, g))

    def _destinations(self, alias: str, seen: set[str]) -> list[str]:
        """The queues an alias writes to; an alias may name another alias (cycles cut)."""
        seen.add(alias)
        names: list[str] = []
        for name in self.config.aliases.get(alias, ()):
            if name in self.config.aliases:
                if name not in seen:
                    names.extend(self._destinations(name, seen))
            elif is_queue_name(name):
                names.append(name)
        return names

    def alias_stats(self, names: tuple[str, ...] | None) -> list[QueueStats]:
        chosen = self.config.aliases if names is None else [n for n in names if n in self.config.aliases]
        result = []
        for name in chosen:
            put_items, put_bytes = self.alias_counts.get(name, (0, 0))
            lines = [
                ("put_items", put_items),
                ("put_bytes", put_bytes),
                ("children", ",".join(self.config.aliases[name])),
            ]
            result.append(QueueStats(name, lines, None, self.alias_created.get(name)))
        return result

    def _for_all(self, message: ForAll) -> None:
        kind = message.kind
        reply_to = message.reply_to
        if kind is ForAllKind.CONFIG:
            configs = [(name, self.config.queue_config(name)) for name in self.queues]
            reply_to.tell(configs + [(name, dests) for name, dests in self.config.aliases.items()])
            return
        if kind is ForAllKind.STATS and message.names is not None:
            refs = [self.queues.get(name) for name in message.names]
        else:
            refs = list(self.queues.values())
        if kind is ForAllKind.CLOSE:
            self.shutting_down = True
            self.queues.clear()
        live = [ref for ref in refs if ref is not None]
        if kind is ForAllKind.STATS:
            aliases = self.alias_stats(message.names)
            _InWaves(live, GetStats,
                     lambda answers: reply_to.tell([a for a in answers if a is not None] + aliases))
        elif kind is ForAllKind.SWEEP:
            _InWaves(live, Sweep, lambda answers: reply_to.tell(self._after_sweep(answers)))
        elif kind is ForAllKind.CLOSE:
            graceful = message.graceful
            Gather(len(live), reply_to.tell).send(live, lambda g: CloseQueue(g, graceful))
        elif kind is ForAllKind.FLUSH:
            Gather(len(live), reply_to.tell).send(live, lambda g: QueueBatch([FLUSH], None, g))
        else:
            raise ValueError(f"unknown collection operation {kind!r}")


WAVE = 100
"""Queues asked at once by a stats gathering or an expiry sweep."""


class _InWaves:
    """Send ``make_message(gather)`` to :data:`WAVE` refs at a time, then ``done(every
    answer)``. The next wave leaves from a greenlet of its own once the hub has nothing else
    to do: an idle queue answers inline, on the sender's greenlet (ADR 0002), so asked all
    at once 5,000 queues held the hub, and every memcache request, for their 5,000 runs,
    every second (the expiry sweep) and on every scrape."""

    def __init__(self, refs: list[Any], make_message: Callable[[Any], Any],
                 done: Callable[[list[Any]], None]) -> None:
        self.refs = refs
        self.make_message = make_message
        self.done = done
        self.answers: list[Any] = []
        self.sent = 0
        self._send()

    def _send(self) -> None:
        wave = self.refs[self.sent:self.sent + WAVE]
        self.sent += len(wave)
        Gather(len(wave), self._answered).send(wave, self.make_message)

    def _answered(self, answers: list[Any]) -> None:
        self.answers.extend(answers)
        if self.sent < len(self.refs):
            gevent.spawn(self._send_when_idle)
        else:
            self.done(self.answers)

    def _send_when_idle(self) -> None:
        # gevent.sleep(0) would not do: the hub runs 50 callbacks before it looks at the
        # sockets again, and each wave is one
        gevent.idle()
        self._send()
