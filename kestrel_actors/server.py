"""The server: the queue collection, the gevent listeners, and the server's life cycle.

Connections are accepted on the hub and handed to ``session.Connections``, which wires a
transport (a hub I/O watcher feeding the protocol decoder) to a session actor; everything else
happens in actors. Sessions reach the server only through their ``SessionContext``.
"""

from __future__ import annotations

import errno
import gc
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import structlog
from gevent.server import StreamServer
from pykka import ActorRegistry

from . import KESTREL_VERSION
from ._compiled import compiled_state, profile_guided
from .actors import QueueCollection, QueueOpener, ServerStats, memory_opener
from .config import ServerConfig
from .journal import DataDirLocked, lock_data_dir
from .messages import IGNORE, ForAll, ForAllKind, Load, Reconfigure, ReloadFailed
from .protocol import MemcacheDecoder, TextDecoder
from .protocol.thrift import ThriftDecoder
from .runtime import ReplyFuture
from .service import ServiceNotifier
from .session import (
    CLIENT_SOCKET_OPTIONS,
    Acceptor,
    Connections,
    MemcacheHandler,
    Reload,
    SessionContext,
    Shutdown,
    TextHandler,
    ThriftHandler,
    accept_burst,
)
from .status import ServerStatus

__all__ = ["Server", "StartupError"]

log = structlog.get_logger("kestrel_actors.server")


_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)
ACCEPT_PAUSE = 0.1
"""Seconds the listener stops accepting when not even its spare descriptor helps."""
REFUSAL_BURST_GAP = 1.0
"""Refusals closer together than this many seconds are one burst, logged once."""
DRAIN_SECONDS = 5.0
"""At shutdown, how long connections may take to answer their requests in flight before the
queues close (Kestrel drains for 30 s, but evicts blocking reads at once, as we do)."""


class _Listener(StreamServer):
    """Accepts on the hub and hands each socket to ``handle``, which sets the connection up
    and returns at once; the connection's transport owns and closes the socket.

    gevent's default spawns a greenlet per connection that would only wait for the close, and
    wraps each socket in a gevent socket whose I/O the transport never uses (its own watchers
    do) but whose making and closing cost a fifth of a short connection's CPU time.

    Out of file descriptors, ``accept`` fails and the client would wait in the backlog while
    the listener, level-triggered, fails again on every loop. So the listener holds one spare
    descriptor: out of descriptors, it frees the spare, accepts the client, closes it at once
    (the client sees the connection closed, not a hang) and takes the spare again. One
    warning is logged per burst of refusals (a burst ends after ``REFUSAL_BURST_GAP``
    seconds without one).
    """

    max_accept = 64
    """Clients set up per loop iteration (gevent's default is 100): a newcomer's session costs
    about a quarter of a millisecond (pure Python), so a burst of them does not hold up the
    connected clients for long (ADR 0011). A newcomer whose first read is heavy (a long
    pipeline) is not counted: it is only looked at, and set up when its turn comes, one per
    iteration (``session._transport``); the listener accepts up to ``HEAVY_PER_ITERATION`` of
    them in one go, so a fresh client is not left behind a burst of them in the kernel's
    accept backlog."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._spare: int | None = _reserve_fd()
        self._last_refusal = float("-inf")
        self._options_copied: bool | None = None
        """Whether the kernel copied the listening socket's options to the first socket it
        accepted (``None``: none accepted yet). If not, each accepted socket gets them itself."""

    def init_socket(self) -> None:
        super().init_socket()
        # every client socket's options, set once here: Linux copies them to each socket the
        # listener accepts (checked on the first), three system calls less per connection
        for level, option, value in CLIENT_SOCKET_OPTIONS:
            self.socket.setsockopt(level, option, value)

    def _do_read(self) -> None:
        """gevent's accept loop (the listening socket's watcher calls it), compiled
        (``session.accept_burst``: gevent's made five interpreted calls per client); what it
        does on a failure is gevent's. Each client goes to ``handle(sock, address, waiting)``,
        ``waiting`` the bytes of its first read that wait already (asked once:
        ``Connections.accept`` need not ask the kernel again, and reads a light request at once);
        heavy newcomers do not count against ``max_accept``."""
        listening = self.socket
        try:
            # gevent's handle (private, so not in its stubs)
            accept_burst(listening, self._handle, self.max_accept, HEAVY_PER_ITERATION,  # type: ignore[attr-defined]
                         None if self._options_copied else self._give_options)
        except OSError as exc:
            if exc.errno not in _OUT_OF_FDS:
                self._accept_failed()
                return
            self._refuse(listening, exc)
        except BaseException:  # noqa: BLE001 - gevent's loop catches all, and says so
            self._accept_failed()
            return
        self.delay = self.min_delay

    def _accept_failed(self) -> None:
        """gevent's handling of a failed accept or set-up (``BaseServer._do_read``): reported to
        the hub, then the listener closes (a fatal error) or pauses, longer each time."""
        self.loop.handle_error(self, *sys.exc_info())
        exc = sys.exc_info()[1]
        assert exc is not None  # called from an except clause
        if self.is_fatal_error(exc):
            self.close()
            sys.stderr.write(f"ERROR: {self} failed with {str(exc) or repr(exc)}\n")
            return
        if self.delay >= 0:
            self.stop_accepting()
            self._timer = self.loop.timer(self.delay)
            # gevent's own (private, so not in its stubs)
            resume: Callable[[], None] = self._start_accepting_if_started  # type: ignore[attr-defined]
            self._timer.start(resume)
            self.delay = min(self.max_delay, self.delay * 2)

    def _give_options(self, sock: Any) -> bool:
        """For the first socket accepted, whether the kernel copied the listening socket's
        options to it; then, for each socket accepted if it did not, set them. ``False``: the
        socket is closed, its client gone already."""
        try:
            if self._options_copied is None:
                self._options_copied = all(sock.getsockopt(level, option) == value
                                           for level, option, value in CLIENT_SOCKET_OPTIONS)
                if self._options_copied:
                    return True
                log.info("accepted sockets do not inherit the listener's options; set on each")
            for level, option, value in CLIENT_SOCKET_OPTIONS:
                sock.setsockopt(level, option, value)
        except OSError:
            sock.close()
            return False
        return True

    def _refuse(self, listening: Any, exc: OSError) -> None:
        """Accept one waiting client with the spare descriptor and close it."""
        now = time.monotonic()
        if now - self._last_refusal > REFUSAL_BURST_GAP:
            log.warning("connections refused: out of file descriptors", error=exc.strerror,
                        limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self._last_refusal = now
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        try:
            fd, _address = listening._accept()
        except OSError:
            fd = None
        if fd is not None:
            os.close(fd)
        self._spare = _reserve_fd()
        if fd is None or self._spare is None:
            # no descriptor came free even so: stop accepting for a moment rather than
            # spin on the backlog
            self.stop_accepting()
            self._timer = self.loop.timer(ACCEPT_PAUSE)
            # gevent's own (private, so not in its stubs)
            resume: Callable[[], None] = self._start_accepting_if_started  # type: ignore[attr-defined]
            self._timer.start(resume)
        return None

    def do_close(self, sock: Any, *args: Any) -> None:
        pass  # the transport closes it (or ``handle`` did, refusing it)

    def close(self) -> None:
        super().close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None


HEAVY_PER_ITERATION = 1024
"""Heavy newcomers (``_Listener.max_accept``) the listener takes from the accept backlog in one
loop iteration at most: about 10 µs each."""


def _no_sessions_yet(_session: Any) -> None:
    """``SessionContext.closed`` until the server's ``Connections`` exist (no session before)."""


def _reserve_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open file limit", soft=soft, hard=hard, error=str(exc))
    return soft

class StartupError(Exception):
    """The server cannot start (unusable data directory, port in use, bad journal)."""


class Server:
    """One kestrel-actors server: a queue collection and its listeners."""

    version = KESTREL_VERSION

    def __init__(
        self,
        config: ServerConfig,
        opener: QueueOpener | None = None,
        discover: Callable[[], list[str]] | None = None,
        data_dir_lock: int | None = None,
    ) -> None:
        """``data_dir_lock``: the descriptor of the data directory's lock if the caller has
        taken it already (``serve`` does, before it imports the server); else it is taken here."""
        self.config = config
        self.stats = ServerStats()
        self.status = ServerStatus.from_config(config)
        self._stopped = gevent.event.Event()
        self._loaded = gevent.event.Event()
        """Set once every queue found on disk is loaded (the listeners open before)."""
        self._listeners: list[StreamServer] = []
        self._sweeper: Any = None
        self._admin: Any = None
        self.membership: Any = None
        """The ZooKeeper server-set memberships (``cluster.ZooKeeperMembership``), when configured."""
        if config.zookeeper is not None:
            from .cluster import ZooKeeperMembership

            self.membership = ZooKeeperMembership(config.zookeeper, self.status,
                                                  config.status_change_grace_period)
        self.service = ServiceNotifier.from_environment()
        """systemd's notifications (``Type=notify``): nothing is sent without ``$NOTIFY_SOCKET``."""
        self._shutting_down = False
        self._quiescing = False
        self._check_data_dir()
        self._data_dir_lock = self._lock_data_dir() if data_dir_lock is None else data_dir_lock
        self._discover = discover or list
        queues: dict[str, Any] = {}  # the collection lists its queues here for the sessions
        self.collection = QueueCollection.start(config, self.stats, opener or memory_opener, queues)
        self.context = SessionContext(
            stats=self.stats, status=self.status, collection=self.collection, config=config,
            version=self.version, control=_Control(self), closed=_no_sessions_yet,
            membership=self.membership, queues=queues,
        )
        self.connections = Connections(self.context)
        # its compiled method itself, called as each session finishes (an interpreted lambda
        # around it was one more frame per connection)
        self.context.closed = self.connections.closed

    # -- life cycle -----------------------------------------------------------------------

    def _check_data_dir(self) -> None:
        path = Path(self.config.data_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"cannot create data directory {path}: {exc}") from exc
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise StartupError(f"data directory {path} is not a writable directory")

    def _lock_data_dir(self) -> int:
        """Lock the data directory for this process's whole life (the kernel frees the lock on
        any exit, so nothing here ever unlocks it); returns the lock's descriptor."""
        path = self.config.data_dir
        try:
            return lock_data_dir(path)
        except DataDirLocked as exc:
            raise StartupError(str(exc)) from exc
        except OSError as exc:
            raise StartupError(f"cannot lock data directory {path}: {exc}") from exc

    def load(self, names: list[str]) -> None:
        """Start loading the queues found on disk (they are replayed in the background), then
        read the saved status (behaviour §7.1). Any failure here is a :class:`StartupError`."""
        try:
            self.collection.ask(Load(names, loaded=self._loaded.set))
            self.status.load()
        except Exception as exc:
            log.exception("exception during startup")
            raise StartupError(f"cannot load the queues in {self.config.data_dir}: {exc}") from exc

    def start(self) -> None:
        """Start loading the queues on disk, then listen at once (behaviour §7.1: a request
        naming a queue still loading waits for it; the others are served meanwhile)."""
        self.load(self._discover())
        if self._shutting_down:
            return  # a signal during the replay: the queues close, no listener opens
        self.open_file_limit = raise_open_file_limit()
        try:
            listener, text, thrift = self._open_ports()
        except StartupError:
            # a port that cannot be had must not leave the others taking connections that the
            # process's exit then resets
            for opened in self._listeners:
                opened.close()
            self._listeners.clear()
            raise
        if self.membership is not None:
            self._join_server_sets(listener, thrift, text)
        frequency = self.config.expiration_timer_frequency
        if frequency:
            self._sweeper = gevent.spawn(self._sweep_forever, frequency)
        log.info("listening", protocol="memcache", host=self.config.host, port=listener.server_port,
                 data_dir=str(self.config.data_dir), open_file_limit=self.open_file_limit,
                 compiled=compiled_state(), profile_guided=profile_guided())
        # every port takes connections; systemd hears READY once every journal is replayed too
        gevent.spawn(self._ready_when_loaded)

    def _ready_when_loaded(self) -> None:
        self._loaded.wait()
        if not self._shutting_down:
            self.service.ready()

    def _open_ports(self) -> tuple[StreamServer, StreamServer | None, StreamServer | None]:
        """Listen on every configured port (memcache, text, thrift, admin); the listeners
        opened so far stay in ``_listeners`` when one fails."""
        if self.config.admin_port:
            # its tenth of a second of imports before the first port opens, not while the
            # others take connections that a failure to bind the admin port would reset
            from . import admin  # noqa: F401
        config = self.config
        listener = self._listen(config.host, config.port, Acceptor(
            self.connections, MemcacheDecoder, (config.max_line_bytes, config.max_item_bytes), MemcacheHandler))
        self._listeners.append(listener)
        text = thrift = None
        if self.config.text_port:
            text = self._listen(config.host, config.text_port, Acceptor(
                self.connections, TextDecoder, (config.max_line_bytes,), TextHandler))
            self._listeners.append(text)
            log.info("listening", protocol="text", host=self.config.host, port=text.server_port)
        if self.config.thrift_port:
            # a thrift frame holds one call: the largest item plus room for the message around it
            thrift = self._listen(config.host, config.thrift_port, Acceptor(
                self.connections, ThriftDecoder, (config.max_item_bytes + 64 * 1024,), ThriftHandler))
            self._listeners.append(thrift)
            log.info("listening", protocol="thrift", host=self.config.host, port=thrift.server_port)
        if self.config.admin_port:
            self._start_admin(self.config.admin_host, self.config.admin_port)
        return listener, text, thrift

    def _join_server_sets(self, *listeners: StreamServer | None) -> None:
        """Join ZooKeeper's read and write sets; the endpoints in Kestrel's order (memcache,
        thrift, text: the first is the main one)."""
        names = ("memcache", "thrift", "text")
        endpoints = {name: (self.config.host, listener.server_port)
                     for name, listener in zip(names, listeners, strict=False) if listener is not None}
        self.membership.start(endpoints)

    def _start_admin(self, host: str, port: int) -> None:
        from .admin import AdminService

        self._admin = AdminService(self)
        try:
            bound = self._admin.start(host, port, self.config.admin_token)
        except OSError as exc:
            raise StartupError(f"cannot listen on {host}:{port}: {exc}") from exc
        log.info("listening", protocol="admin http", host=host, port=bound,
                 token_required=self.config.admin_token is not None)

    def _listen(self, host: str, port: int, handle: Callable[[Any, Any, int], None]) -> StreamServer:
        listener = _Listener((host, port), handle, backlog=1024, spawn=None)
        try:
            listener.start()
        except OSError as exc:
            raise StartupError(f"cannot listen on {host}:{port}: {exc}") from exc
        return listener

    @property
    def port(self) -> int:
        port = self._listeners[0].server_port
        assert port is not None  # a TCP listener's address is (host, port)
        return port

    def serve_forever(self) -> None:
        """Start, and return once the server has shut down (``shutdown`` or a signal).

        SIGHUP reloads the config file, as ``reload`` does (from the start: a SIGHUP during a
        long replay must not kill the process); its outcome is logged.
        """
        # before the first client can connect: a SIGTERM then is an orderly shutdown, never
        # the default action's kill (a test signalled just after the port opened hit that)
        gevent.signal_handler(signal.SIGHUP, self._reload_on_signal)
        gevent.signal_handler(signal.SIGTERM, self.shutdown)
        gevent.signal_handler(signal.SIGINT, self.shutdown)
        self.start()
        _tune_gc()
        self._stopped.wait()

    def shutdown(self) -> None:
        """Begin an orderly shutdown 100 ms from now, as Kestrel does (behaviour §7.4)."""
        if not self._shutting_down:
            self._shutting_down = True
            if not self._quiescing:  # a quiesce said so already
                self.service.stopping()
            gevent.spawn_later(0.1, self._stop)

    def quiesce(self) -> None:
        """ostrich's quiesce: stop accepting clients at once, and shut down when the last one
        has gone (waiting at most 30 s, Kestrel's drain)."""
        if self._shutting_down or self._quiescing:
            return
        self._quiescing = True
        self.service.stopping()
        log.info("quiescing: no new connections; shutting down when the last client leaves")
        for listener in self._listeners:
            listener.close()
        gevent.spawn(self._shutdown_when_idle, 30.0)

    def _shutdown_when_idle(self, limit: float) -> None:
        waited = 0.0
        while self.stats.curr_connections > 0 and waited < limit:
            gevent.sleep(0.1)
            waited += 0.1
        self.shutdown()

    def _stop(self) -> None:
        log.info("shutting down")
        for listener in self._listeners:
            listener.close()
        if self._admin is not None:
            self._admin.close()
        if self._sweeper is not None:
            self._sweeper.kill()
        graceful = self.status.graceful_shutdown()
        self.status.shutdown()
        if self.membership is not None:
            self.membership.close()
        # no client may be answered once a queue closes: a confirm a closed queue "did" is
        # not on disk, and would be delivered again after the restart
        self.connections.drain(DRAIN_SECONDS)
        closed: ReplyFuture[list[Any]] = ReplyFuture()  # every queue's answer, once all have closed
        self.collection.tell(ForAll(ForAllKind.CLOSE, closed, graceful=graceful))
        try:
            closed.get(timeout=30)
        except Exception:  # noqa: BLE001 - a stuck queue must not keep the process alive
            log.error("queues did not close in time")
        ActorRegistry.stop_all(block=False)
        self.service.close()
        log.info("goodbye")
        self._stopped.set()

    def _sweep_forever(self, frequency: float) -> None:
        while True:
            gevent.sleep(frequency)
            self.collection.tell(ForAll(ForAllKind.SWEEP, IGNORE))

    # -- what sessions ask of the server ----------------------------------------------------

    def _reload_on_signal(self) -> None:
        log.info("SIGHUP: reloading the configuration")
        self.reload(IGNORE)

    def reload(self, reply_to: Any) -> None:
        """Re-read the config file; only queue settings and aliases change (behaviour §2.3, §5.13).

        ``reply_to`` is told once every queue has been sent its new settings; or, if the file
        cannot be used, :class:`ReloadFailed` with the reason, logged on one line, while the
        running configuration stays. Without a config file there is nothing to re-read.

        The service manager is told ``RELOADING=1`` now and ``READY=1`` when ``reply_to`` is
        answered, whatever the outcome: a failed reload leaves the server running as before.
        """
        self.service.reloading()
        reply_to = _ReadyAfter(reply_to, self.service)
        path = self.config.config_file
        if path:
            from .config import ConfigError, load_config

            try:
                new = load_config(path)
            except (ConfigError, OSError) as exc:
                problems = exc.problems if isinstance(exc, ConfigError) else [exc]
                reason = " ".join("; ".join(map(str, problems)).split())  # one line, whatever the file held
                log.error("reload failed; keeping the running configuration", path=path, error=reason)
                reply_to.tell(ReloadFailed(reason))
                return
            self.config = self.context.config = self.config.replace(
                queue_defaults=new.queue_defaults, queues=new.queues, aliases=new.aliases
            )
            self.collection.tell(Reconfigure(self.config, reply_to))
            log.info("configuration reloaded", path=path)
            return
        log.info("reload: the server was started without a config file; nothing to re-read")
        reply_to.tell(True)


class _ReadyAfter:
    """A reload's ``reply_to`` that first tells the service manager ``READY=1`` again."""

    __slots__ = ("_reply_to", "_service")

    def __init__(self, reply_to: Any, service: ServiceNotifier) -> None:
        self._reply_to = reply_to
        self._service = service

    def tell(self, message: Any) -> None:
        self._service.ready()
        self._reply_to.tell(message)


class _Control:
    """The server as sessions see it: it takes :class:`Shutdown` and :class:`Reload` by ``tell``."""

    __slots__ = ("_server",)

    def __init__(self, server: Server) -> None:
        self._server = server

    def tell(self, message: Any) -> None:
        if type(message) is Shutdown:
            self._server.shutdown()
        elif type(message) is Reload:
            self._server.reload(message.reply_to)
        else:
            raise TypeError(f"the server takes no {type(message).__name__}")


GC_THRESHOLDS = (20_000, 20, 20)
"""The cyclic collector's generation thresholds while serving (CPython's are 700, 10, 10)."""


def _tune_gc() -> None:
    """Fewer cyclic-GC passes on the request path (issue 12: about 2% of the CPU per request).

    A request allocates a hundred or so short-lived objects (commands, operations, replies),
    none of them in reference cycles; with CPython's default a young-generation pass ran every
    few requests. What exists once the server has started (modules, configuration, listeners)
    lives as long as the process: ``gc.freeze`` moves it out of every later pass.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
