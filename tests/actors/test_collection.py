"""The queue collection on the actor runtime, in process: lookups of a queue whose actor failed."""

from __future__ import annotations

import gevent

from kestrel_actors.actors import QueueBatch, QueueCollection, ServerStats
from kestrel_actors.runtime import ReplyFuture
from kestrel_actors.actors._collection import memory_opener
from kestrel_actors.messages import Resolve
from kestrel_actors.messages import Add, Remove
from kestrel_actors.config import ServerConfig


def resolve(collection, name: str):
    reply = ReplyFuture()
    collection.tell(Resolve(name, True, reply))
    return reply.get(timeout=2).ref


def run(ref, *ops):
    reply = ReplyFuture()
    ref.tell(QueueBatch(list(ops), None, reply))
    return reply.get(timeout=2).results


def test_a_queue_whose_actor_failed_is_reopened_on_the_next_lookup(tmp_path):
    collection = QueueCollection.start(ServerConfig(data_dir=str(tmp_path)), ServerStats(), memory_opener)
    try:
        first = resolve(collection, "jobs")
        assert run(first, Add(b"a", 0)) == [True]
        held = ReplyFuture()
        first.tell(QueueBatch([object()], None, held))  # an operation the queue does not know: it fails
        gevent.sleep(0.05)
        assert not first.is_alive()
        assert held.get(timeout=1).results == [None]  # answered as closed, not left hanging
        second = resolve(collection, "jobs")
        assert second is not first and second.is_alive()
        assert run(second, Add(b"b", 0), Remove(None))[0] is True
    finally:
        collection.stop()
