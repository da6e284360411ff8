"""Run a scenario's clients on gevent, in this process or split over ``--procs N``.

A scenario describes a run as a ``Plan``: a list of ``ClientSpec`` (which role function to
run, with which arguments), the recorder whose item count drives the progress bar, and
optionally the number of item ids to track. ``run`` then:

1. deals the clients round-robin to N processes (``spawn`` start method, so nothing of the
   parent's gevent hub is inherited; with N = 1 everything stays in this process);
2. in each process connects every client first, then waits for a common start signal, so
   connection set-up is not timed and all processes start together;
3. runs every client in its own greenlet, or all of the process's clients on one greenlet
   when every role has a lean form (:mod:`.fleet`: one epoll loop, about half the CPU per
   request; ``--greenlets`` opts out); a watchdog stops them all at the first failure,
   when another process failed, or at ``--timeout``, and stops a client whose reply is
   more than ``--io-timeout`` late (so no socket needs a per-request timer);
4. collects each process's ``Figures`` and merges them by recorder name.

Shared state between processes is lock-free: one progress slot per process (the sum is the
run's progress) and a byte per tracked item id (how often it was received), which is how
lost and duplicated items are counted across processes.
"""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent
import gevent.pool

from kestrel_actors.client import ConnectFailed, Connection

from .admin import monitor_queue
from .figures import Figures, Recorder
from .fleet import drive, lean_form_of
from .harness import CONNECT_ATTEMPTS, is_failure, is_harness_error
from .output import Bar

__all__ = ["ClientContext", "ClientSpec", "Options", "Plan", "RunResult", "Shared", "run"]


@dataclass(frozen=True)
class Options:
    """Options common to every scenario (picklable: sent to worker processes)."""

    host: str = "127.0.0.1"
    port: int = 22133
    procs: int = 1
    timeout: float = 600.0
    io_timeout: float = 30.0
    progress: bool = False
    monitor: str | None = None  # queue whose stats are printed every second (-M)
    thrift_port: int | None = None
    """``--thrift``: the run speaks only thrift, on this port (set-up and checks too), as
    Kestrel's thrift load tools do; the memcache port is not used."""
    resp: bool = False
    """``--resp``: the run speaks Redis's protocol to a Redis list (:mod:`.resp`), set-up and
    checks too, on the port ``-p`` names."""
    greenlets: bool = False
    """``--greenlets``: every client on a greenlet of its own, even where its role has a lean
    form (:mod:`.fleet`): the generator as it was, to compare with."""


@dataclass(frozen=True)
class ClientSpec:
    """One client connection: ``role`` is ``"module:function"``, called with a ClientContext."""

    role: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    clients: list[ClientSpec]
    progress: str          # recorder name whose items drive the bar and ``Shared.total``
    target: int            # expected progress total
    label: str = ""
    track_ids: int = 0     # ids 0..track_ids-1 are counted in Shared.seen


class Shared:
    """Lock-free cross-process state: progress slots, per-id counts, start and abort flags."""

    def __init__(self, procs: int, track_ids: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.progress = ctx.RawArray("q", procs)
        self.seen = ctx.RawArray("B", track_ids) if track_ids else None
        self.go = ctx.RawValue("q", 0)
        self.abort = ctx.RawValue("i", 0)
        self._views()

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("progress", "seen", "go", "abort")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views()

    def _views(self) -> None:
        # memoryviews index shared memory at C speed (ctypes arrays are 4x slower to sum)
        self.progress_view = memoryview(self.progress).cast("B").cast("q")
        self.seen_view = memoryview(self.seen).cast("B") if self.seen is not None else None

    def total(self) -> int:
        """Items recorded so far by the progress recorder, over all processes."""
        return sum(self.progress_view)

    def mark(self, item: int) -> bool:
        """Count one receipt of ``item``; True the first time (races only matter for dups)."""
        seen = self.seen_view
        assert seen is not None  # only a plan that tracks ids marks them
        count = seen[item]
        if count < 255:
            seen[item] = count + 1
        return count == 0


class ClientContext:
    """What a role function gets: its connection, arguments, recorders and shared state."""

    def __init__(self, spec: ClientSpec, options: Options, shared: Shared,
                 recorders: dict[str, Recorder], make: Callable[[str], Recorder]) -> None:
        self.spec = spec
        self.args = spec.kwargs
        self.options = options
        self.shared = shared
        self.conn = Connection(options.host, options.port, options.io_timeout, watched=True,
                               use_gevent=True)
        self._recorders = recorders
        self._make = make

    def recorder(self, name: str) -> Recorder:
        rec = self._recorders.get(name)
        if rec is None:
            rec = self._recorders[name] = self._make(name)
        return rec

    def role(self) -> Callable[[ClientContext], None]:
        module, _, name = self.spec.role.partition(":")
        return getattr(importlib.import_module(module), name)


@dataclass
class _ProcResult:
    figures: dict[str, Figures]
    failures: list[str]
    errors: list[str]
    retries: int
    end_ns: int
    cpu_seconds: float = 0.0


@dataclass
class RunResult:
    """Merged results of one run."""

    figures: dict[str, Figures]
    failures: list[str]        # correctness failures (exit 1)
    errors: list[str]          # harness errors: timeouts, no connection (exit 3)
    seen: bytes | None
    retries: int
    wall_seconds: float
    client_cpu: float = 0.0    # CPU seconds the client processes used while running

    def get(self, name: str) -> Figures:
        return self.figures.get(name) or Figures(name=name)


def _run_share(specs: list[ClientSpec], options: Options, shared: Shared, slot: int, epoch: int,
               progress: str, ready: Callable[[], bool]) -> _ProcResult:
    """Connect, wait for the start signal, run the clients; the body of every worker process."""
    recorders: dict[str, Recorder] = {}

    def make(name: str) -> Recorder:
        return Recorder(name, epoch, shared.progress_view if name == progress else None, slot)

    contexts = [ClientContext(spec, options, shared, recorders, make) for spec in specs]
    failures: list[str] = []
    errors: list[str] = []
    pool = gevent.pool.Pool(64)
    try:
        if options.thrift_port is None:  # thrift roles open their own thrift connection
            for ctx in contexts:
                pool.spawn(ctx.conn.connect, CONNECT_ATTEMPTS)
        pool.join(raise_error=True)
    except ConnectFailed as exc:
        errors.append(str(exc))
    if errors or not ready():
        shared.abort.value = 1
        return _ProcResult({}, failures, errors or ["start signal never came"], 0, 0)

    go_ns = shared.go.value
    deadline = go_ns + int(options.timeout * 1e9)
    cpu_start = time.process_time()

    def body(first: ClientContext, run_clients: Callable[[], None], ours: list[ClientContext]) -> None:
        try:
            run_clients()
        except gevent.GreenletExit:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure of a client is counted, none ends the run
            role = first.spec.role.split(':')[1]
            if is_failure(exc):
                failures.append(f"{role}: {exc}")
            elif is_harness_error(exc):
                errors.append(f"{role}: {exc}")
            else:  # a bug in a scenario is reported, not swallowed
                errors.append(f"{role}: {type(exc).__name__}: {exc}")
            shared.abort.value = 1
        finally:
            for ctx in ours:
                ctx.conn.close()

    greenlets = _spawn_clients(contexts, options, body)
    io_limit = int(options.io_timeout * 1e9)
    while not all(g.dead for g in greenlets):
        now = time.monotonic_ns()
        if shared.abort.value or now > deadline:
            if not shared.abort.value:
                errors.append(f"run exceeded --timeout {options.timeout:g}s")
                shared.abort.value = 1
            gevent.killall(greenlets, timeout=5)
            break
        stopping = set()  # the lean loop's one greenlet stands for many clients: stop it once
        for greenlet, ctx in zip(greenlets, contexts, strict=True):  # the --io-timeout watchdog
            since = ctx.conn.waiting_since
            if since and now - since > io_limit and not greenlet.dead and greenlet not in stopping:
                stopping.add(greenlet)
                greenlet.kill(ctx.conn.stalled(), block=False)
        gevent.joinall(greenlets, timeout=0.1)
    end_ns = time.monotonic_ns()
    figures = {name: rec.figures(go_ns) for name, rec in recorders.items()}
    for fig in figures.values():
        fig.end_ns = end_ns
    retries = sum(ctx.conn.retries for ctx in contexts)
    return _ProcResult(figures, failures, errors, retries, end_ns, time.process_time() - cpu_start)


def _spawn_clients(contexts: list[ClientContext], options: Options,
                   body: Callable[[ClientContext, Callable[[], None], list[ClientContext]], None],
                   ) -> list[gevent.Greenlet]:
    """One greenlet per client, running its role; or, when two or more clients' roles all have
    a lean form (and the run did not ask for ``--greenlets``), one greenlet driving them all
    (:func:`.fleet.drive`). One greenlet per context either way, for the watchdog (a late reply
    stops the lean loop, and with it the run, as it stops a client's greenlet)."""
    makes = [lean_form_of(ctx.role()) for ctx in contexts]
    lean = [make for make in makes if make is not None]
    # one client alone keeps its greenlet: the loop would add an epoll_wait per request there,
    # and the one-client rows stay as they were measured before the loop
    if (options.greenlets or len(contexts) < 2 or len(lean) < len(contexts)
            or any(ctx.conn.raw is None for ctx in contexts)):
        return [gevent.spawn(body, ctx, functools.partial(ctx.role(), ctx), [ctx]) for ctx in contexts]
    fleet = gevent.spawn(body, contexts[0], functools.partial(drive, contexts, lean), contexts)
    return [fleet] * len(contexts)


def _child(specs, options, shared, slot, epoch, progress, pipe) -> None:
    """Worker process entry point: report "ready", wait for ``go``, run, send results."""

    def ready() -> bool:
        pipe.send(("ready", None))
        limit = time.monotonic() + 120
        while not shared.go.value:
            if shared.abort.value or time.monotonic() > limit:
                return False
            gevent.sleep(0.001)
        return True

    try:
        result = _run_share(specs, options, shared, slot, epoch, progress, ready)
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent
        result = _ProcResult({}, [], [f"worker {slot} crashed: {type(exc).__name__}: {exc}"], 0, 0)
    pipe.send(("done", result))
    pipe.close()


def run(plan: Plan, options: Options, epoch: int) -> RunResult:
    """Run ``plan`` to completion (bounded by ``options.timeout``) and merge the figures."""
    procs = max(1, min(options.procs, len(plan.clients)))
    shared = Shared(procs, plan.track_ids)
    shares = [plan.clients[i::procs] for i in range(procs)]
    bar = Bar(options.progress, plan.target, plan.label or plan.progress, shared.total)
    monitor = gevent.spawn(monitor_queue, options) if options.monitor else None
    try:
        if procs == 1:
            def ready() -> bool:
                shared.go.value = time.monotonic_ns()
                return True
            poller = gevent.spawn(bar.poll)
            results = [_run_share(shares[0], options, shared, 0, epoch, plan.progress, ready)]
            poller.kill()
        else:
            results = _run_processes(shares, options, shared, epoch, plan, bar)
    finally:
        if monitor is not None:
            monitor.kill()
        bar.close()
    figures: dict[str, Figures] = {}
    for result in results:
        for name, fig in result.figures.items():
            if name in figures:
                figures[name].merge(fig)
            else:
                figures[name] = fig
    go_ns = shared.go.value
    ends = [r.end_ns for r in results if r.end_ns]
    return RunResult(
        figures=figures,
        failures=[f for r in results for f in r.failures],
        errors=[e for r in results for e in r.errors],
        seen=bytes(shared.seen) if shared.seen is not None else None,
        retries=sum(r.retries for r in results),
        wall_seconds=(max(ends) - go_ns) / 1e9 if ends and go_ns else 0.0,
        client_cpu=sum(r.cpu_seconds for r in results),
    )


def _run_processes(shares, options, shared, epoch, plan, bar) -> list[_ProcResult]:
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for slot, specs in enumerate(shares):
        parent_end, child_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, daemon=True, name=f"loadtests-{slot}",
                           args=(specs, options, shared, slot, epoch, plan.progress, child_end))
        proc.start()
        child_end.close()
        pipes.append(parent_end)
        procs.append(proc)
    results: dict[int, _ProcResult] = {}
    ready = 0
    limit = time.monotonic() + options.timeout + 180
    try:
        while len(results) < len(procs) and time.monotonic() < limit:
            for slot, pipe in enumerate(pipes):
                if slot in results:
                    continue
                try:
                    while pipe.poll():
                        kind, payload = pipe.recv()
                        if kind == "ready":
                            ready += 1
                        else:
                            results[slot] = payload
                            break
                except EOFError:
                    died = f"worker {slot} died (exit code {procs[slot].exitcode})"
                    results[slot] = _ProcResult({}, [], [died], 0, 0)
                    shared.abort.value = 1
            if ready == len(procs) and not shared.go.value:
                shared.go.value = time.monotonic_ns()
            bar.update()
            gevent.sleep(0.05)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    for slot in range(len(procs)):
        if slot not in results:
            results[slot] = _ProcResult({}, [], [f"worker {slot} sent no result"], 0, 0)
    return [results[slot] for slot in range(len(procs))]
