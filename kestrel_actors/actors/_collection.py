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
from typing import Any, NamedTuple

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
or the exception opening it raised, and ``plan(requests)``, splitting the requests into the
batches to open in turn (smallest journals first): start-up opens the queues found on disk
with them in the background (``journal.FileOpener``: one replay job per batch)."""


class _Loaded(NamedTuple):
    """The background loader's answer for one batch: each queue's core or the exception
    opening it raised; ``last`` when no batch is left."""

    opened: dict[str, QueueCore | Exception]
    last: bool


def memory_opener(name: str, config: Any) -> QueueCore:
    return QueueCore(name, config, MemoryJournal())


class QueueCollection(GeventActor):
    """Owns the name → queue actor map. One per server."""

    inline_dispatch = True
    """A session's lookup runs on the session's greenlet when the collection is idle (every
    new connection makes one): no two greenlet switches for a dictionary lookup. Opening a
    queue may read its journal, which suspends that greenlet, never the hub."""

    def __init__(self, config: ServerConfig, stats: ServerStats, opener: QueueOpener = memory_opener,
                 directory: dict[str, Any] | None = None):
        super().__init__()
        self.config = config
        self.stats = stats
        self.opener = opener
        self.queues: dict[str, Any] = {}
        self.directory: dict[str, Any] = {} if directory is None else directory
        """What sessions read without asking (``SessionContext.queues``, ADR 0005): each queue a
        ``Resolve`` would answer with its ref at once, so not an alias's name nor one waiting
        for a queue still loading. Written only here; a session that finds a stopped ref in it
        asks as before (its actor failed: this collection reopens it)."""
        self.children: dict[str, dict[str, Any]] = {}
        self.alias_counts: dict[str, list[int]] = {}
        self.alias_created: dict[str, int] = {}
        """When each alias was first configured (at start-up or by a reload), as Kestrel's
        ``AliasedQueue.createTime``."""
        self._note_aliases()
        self.shutting_down = False
        self._opened: dict[str, QueueCore | Exception] = {}
        """Start-up only: the cores ``opener.open_many`` made, until each queue's actor starts."""
        self.loading: set[str] = set()
        """Queues found on disk whose journals are still being replayed (behaviour §7.1)."""
        self._loading_children: dict[str, int] = {}
        """Master → its fanout children still loading: the master waits for them, so that
        every child gets a copy of the master's first SET."""
        self._held: list[Any] = []
        """Messages that name a queue still loading, handled again as each batch is loaded."""
        self._collecting = False
        self._when_loaded: Callable[[], None] | None = None

    def on_receive(self, message: Any) -> Any:
        kind = type(message)
        if self.loading and self._must_wait(kind, message):
            self._held.append(message)
            return None
        if kind is Resolve:
            message.reply_to.tell(self._resolve(message.name, message.create))
        elif kind is Delete:
            self._delete(message.name, message.reply_to)
        elif kind is ForAll:
            self._for_all(message)
        elif kind is AliasAdd:
            self._alias_add(message)
        elif kind is Load:
            self._when_loaded = message.loaded
            self.load(message.names)
        elif kind is _Loaded:
            self._loaded(message)
        elif kind is Reconfigure:
            self._reconfigure(message.config)
            message.reply_to.tell(True)
        else:
            return super().on_receive(message)
        return None

    # -- names ----------------------------------------------------------------------------

    def load(self, names: list[str]) -> None:
        """Start loading the queues found on disk; create the fanout children the config names.

        The journals are replayed in the background, in batches, smallest first, and each
        queue's actor starts as soon as its batch is replayed: the server listens at once, and
        a request naming a queue still loading waits for it (behaviour §7.1) while every other
        queue is served. A fanout master also waits for its children still loading, and the
        children the config names (not on disk) exist before anything is served: a child must
        receive copies of the very first SET to its master (Kestrel users were caught out
        otherwise).
        """
        legal = []
        for name in names:
            if is_queue_name(name):
                legal.append(name)
            else:
                log.warning("skipping journal with an illegal queue name", queue=name)
        background = []
        if hasattr(self.opener, "open_many"):  # else each queue is opened as it is created
            requests = [(name, self.config.queue_config(name)) for name in legal]
            background = [(name, config) for name, config in requests if config.keep_journal]
        for name, _config in background:
            self.loading.add(name)
            master = fanout_master(name)
            if master is not None:
                self._loading_children[master] = self._loading_children.get(master, 0) + 1
        # Everything made here lives as long as its queue: the cyclic collector's passes over
        # it, growing with every queue made, were a sixth of a 5,000-queue start-up.
        self._collecting = gc.isenabled()
        gc.disable()
        for name in legal:
            if name not in self.loading:
                self._create_loaded(name)
        self._create_configured_children()
        if background:
            gevent.spawn(self._load_in_background, background)
        else:
            self._finish_loading()

    def _load_in_background(self, requests: list[tuple[str, Any]]) -> None:
        """Replay ``requests`` batch by batch (on the threadpool: ``open_many``), telling the
        collection each batch's cores. Runs on a greenlet of its own, never the collection's."""
        plan = getattr(self.opener, "plan", None)
        batches = plan(requests) if plan is not None else [requests]
        for index, batch in enumerate(batches):
            try:
                opened = self.opener.open_many(batch)  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - each queue of the batch reports it
                opened = {name: exc for name, _config in batch}
            self.ref.tell(_Loaded(opened, index == len(batches) - 1))

    def _loaded(self, message: _Loaded) -> None:
        self._opened.update(message.opened)
        # a queue whose ``expire_to_queue`` is still loading waits for it (its actor is
        # started with its target's); the last batch starts every queue left
        waiting = [name for name in self._opened if name in self.loading]
        progress = True
        while waiting and progress:
            progress = False
            for name in list(waiting):
                if not message.last and self._target_loading(name):
                    continue
                waiting.remove(name)
                self._done_loading(name)
                self._create_loaded(name)
                progress = True
        if message.last:
            self._finish_loading()
        else:
            self._list_queues()  # a master whose last child loading has loaded
        held, self._held = self._held, []
        for waiting_message in held:
            self.on_receive(waiting_message)

    def _target_loading(self, name: str) -> bool:
        target = self.config.queue_config(name).expire_to_queue
        return bool(target) and target != name and target in self.loading and target not in self._opened

    def _done_loading(self, name: str) -> None:
        self.loading.discard(name)
        master = fanout_master(name)
        if master is not None and master in self._loading_children:
            self._loading_children[master] -= 1
            if not self._loading_children[master]:
                del self._loading_children[master]

    def _create_loaded(self, name: str) -> None:
        try:
            self._queue(name)
        except NotRegularFile as exc:
            # its archives stay untouched on disk; a stray in the journal's place must
            # not stop the server (a crash loop under a supervisor)
            log.error("cannot open a queue: its journal's path is not a regular file", queue=name,
                      error=str(exc))
        except Exception as exc:  # noqa: BLE001 - the other queues are served all the same
            log.error("cannot load a queue found on disk; it is opened again when next named", queue=name,
                      error=str(exc))
        finally:
            self._opened.pop(name, None)

    def _list_queues(self) -> None:
        """Make :attr:`directory` anew (after a reload's new aliases, or a load's batch)."""
        directory = self.directory
        directory.clear()
        aliases = self.config.aliases
        for name, ref in self.queues.items():
            if name not in aliases and not self._is_loading(name):
                directory[name] = ref

    def _finish_loading(self) -> None:
        self.loading.clear()
        self._loading_children.clear()
        self._list_queues()
        self._opened = {}
        if self._collecting:
            gc.enable()
        self._collecting = False
        log.info("queues loaded", queues=len(self.queues))
        if self._when_loaded is not None:
            self._when_loaded()
            self._when_loaded = None

    def _must_wait(self, kind: type, message: Any) -> bool:
        """Whether ``message`` names a queue still loading (and must wait until it is loaded)."""
        if kind is Resolve:
            return message.name not in self.config.aliases and self._is_loading(message.name)
        if kind is Delete:
            return message.name in self.loading
        if kind is AliasAdd:
            return any(self._is_loading(name) for name in self._destinations(message.name, set()))
        if kind is ForAll:
            # flush_all and shutdown apply to every queue, the ones still loading too
            return message.kind in (ForAllKind.FLUSH, ForAllKind.CLOSE)
        return False

    def _is_loading(self, name: str) -> bool:
        return name in self.loading or name in self._loading_children

    def _note_aliases(self) -> None:
        now = int(time.time())
        for name in self.config.aliases:
            self.alias_created.setdefault(name, now)

    def _create_configured_children(self) -> None:
        for name in self.config.queues:
            if is_fanout_child(name) and is_queue_name(name) and name not in self.loading:
                self._queue(name)

    def _reconfigure(self, config: ServerConfig) -> None:
        """``reload``: new queue settings and aliases apply to live queues at once (behaviour §5.13)."""
        self.config = config
        self._note_aliases()
        self._list_queues()
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
        if name not in self.config.aliases and not self._is_loading(name):
            self.directory[name] = ref
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
        self.directory.pop(name, None)
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

    def _loading_stats(self, names: tuple[str, ...] | None) -> list[QueueStats]:
        chosen = sorted(self.loading) if names is None else [name for name in names if name in self.loading]
        return [QueueStats(name, [("loading", 1)], None, loading=True) for name in chosen]

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
            aliases = self.alias_stats(message.names) + self._loading_stats(message.names)
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
