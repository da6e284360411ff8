"""A gevent runtime for pykka: actors are greenlets, a dispatcher makes the hub's tells (ADR 0001, 0002)."""

from ._actor import (
    CountedDeque,
    GeventActor,
    GeventFuture,
    GeventRef,
    ReplyFuture,
    hub_runs,
    of_this_hub,
    on_own_greenlet,
    tell,
    tell_quietly,
)
from ._dispatcher import Dispatcher

__all__ = [
    "CountedDeque", "Dispatcher", "GeventActor", "GeventFuture", "GeventRef", "ReplyFuture", "hub_runs", "of_this_hub",
    "on_own_greenlet", "tell", "tell_quietly",
]
