"""A pytest plugin for pykka's own test suite: runs it against kestrel-actors' gevent runtime.

pykka's ``tests/conftest.py`` parametrises a session fixture ``runtime`` over the runtimes it
ships (only threading since pykka 3). This plugin gives every test that uses ``runtime`` a
``parametrize`` mark of its own, which pytest lets take precedence over the fixture's params:
the suite then runs against :class:`~kestrel_actors.runtime.GeventActor` (a tell queued for
the actor's greenlet), an actor class with ``inline_dispatch = True`` (a tell to an idle
actor runs on the sender's greenlet) and one with ``greenlet_on_demand`` as well (as the
server's sessions), with gevent's events, futures and sleep.

Loaded by ``tests/runtime/test_pykka_suite.py`` as ``-p kestrel_pykka_runtime``, with pykka's
sdist as the rootdir (so ``tests`` is pykka's package there, not ours).
"""

from __future__ import annotations

import gevent
import gevent.event
import pytest

from kestrel_actors.runtime import GeventActor, GeventFuture


class InlineGeventActor(GeventActor):
    """The runtime as the server's queue and session actors use it: tells run inline."""

    inline_dispatch = True


class OnDemandGeventActor(InlineGeventActor):
    """As the server's session actors: inline, and a greenlet only when one is needed."""

    greenlet_on_demand = True


RUNTIME_CLASSES = {
    "gevent": GeventActor,
    "gevent-inline": InlineGeventActor,
    "gevent-on-demand": OnDemandGeventActor,
}


def _runtimes() -> list[object]:
    from tests.types import Runtime  # pykka's, importable once its rootdir is on the path

    return [
        pytest.param(
            Runtime(
                name=name,
                actor_class=actor_class,
                event_class=gevent.event.Event,
                future_class=GeventFuture,
                sleep_func=gevent.sleep,
            ),
            id=name,
        )
        for name, actor_class in RUNTIME_CLASSES.items()
    ]


ON_START_AT_START = frozenset({
    "test_on_start_is_called_before_first_message_is_processed",
    "test_on_start_is_called_after_the_actor_is_registered",
    "test_on_start_can_stop_actor_before_receive_loop_is_started",
    "test_on_start_failure_causes_actor_to_stop",
    "test_on_stop_failure_causes_actor_to_stop",  # its on_start stops the actor
    "test_exception_in_on_start_is_logged",
    "test_exception_in_on_stop_is_logged",  # likewise
})
"""pykka's tests that need ``on_start`` to run at start, unprompted: with
``greenlet_on_demand`` it runs when the actor first needs its greenlet (documented there)."""


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "runtime" in metafunc.fixturenames:
        metafunc.definition.add_marker(
            pytest.mark.parametrize("runtime", _runtimes(), indirect=True, scope="session")
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="greenlet_on_demand: on_start runs when the greenlet is first needed")
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (callspec is not None and callspec.id.endswith("gevent-on-demand")
                and item.originalname in ON_START_AT_START):  # type: ignore[attr-defined]
            item.add_marker(skip)
