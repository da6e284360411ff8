"""The queue collection on the actor runtime, in process: lookups (created or not, illegal
names, aliases), a queue whose actor failed, deletes, fanout children, reconfiguration."""

from __future__ import annotations

import gevent

from kestrel_actors.actors import QueueBatch, QueueCollection, ServerStats
from kestrel_actors.actors._collection import memory_opener
from kestrel_actors.config import ServerConfig
from kestrel_actors.messages import Add, Remove
from kestrel_actors.runtime import ReplyFuture

from ..helpers import PATIENCE
from ..helpers import resolve_queue as resolve
from ..helpers import run_batch as run


def test_a_queue_whose_actor_failed_is_reopened_on_the_next_lookup(tmp_path):
    collection = QueueCollection.start(ServerConfig(data_dir=str(tmp_path)), ServerStats(), memory_opener)
    try:
        first = resolve(collection, "jobs")
        assert run(first, Add(b"a", 0)) == [True]
        held = ReplyFuture()
        first.tell(QueueBatch([object()], None, held))  # an operation the queue does not know: it fails
        gevent.sleep(0.05)
        assert not first.is_alive()
        assert held.get(timeout=PATIENCE).results == [None]  # answered as closed, not left hanging
        second = resolve(collection, "jobs")
        assert second is not first and second.is_alive()
        assert run(second, Add(b"b", 0), Remove(None))[0] is True
    finally:
        collection.stop()


def ask_collection(collection, message_type, *args):
    reply = ReplyFuture()
    collection.tell(message_type(*args, reply))
    return reply.get(timeout=PATIENCE)


def test_a_lookup_without_create_does_not_make_the_queue(world):
    from kestrel_actors.messages import Resolve

    assert ask_collection(world.collection, Resolve, "absent", False).ref is None
    assert ask_collection(world.collection, Resolve, "absent", False).ref is None
    assert ask_collection(world.collection, Resolve, "absent", True).ref is not None


def test_an_illegal_name_is_refused_not_created(world):
    from kestrel_actors.messages import Resolve

    resolved = ask_collection(world.collection, Resolve, "no/slash", True)
    assert resolved.valid is False and resolved.ref is None


def test_an_alias_resolves_to_its_targets(tmp_path):
    from kestrel_actors.messages import Resolve

    from ..helpers import World

    world = World(tmp_path, aliases={"both": ("left", "right")})
    try:
        assert ask_collection(world.collection, Resolve, "both", True).alias == ("left", "right")
        client = world.connect()
        assert client.send(b"set both 0 0 2\r\nhi\r\n") == b"STORED\r\n"
        assert client.send(b"get left\r\nget right\r\n") == (
            b"VALUE left 0 2\r\nhi\r\nEND\r\nVALUE right 0 2\r\nhi\r\nEND\r\n")
    finally:
        world.collection.stop()


def test_delete_stops_the_queue_and_forgets_it(world):
    from kestrel_actors.messages import Delete, Resolve

    first = resolve(world.collection, "gone")
    run(first, Add(b"x", 0))
    ask_collection(world.collection, Delete, "gone")
    gevent.sleep(0.02)
    assert not first.is_alive()
    assert ask_collection(world.collection, Resolve, "gone", False).ref is None
    second = resolve(world.collection, "gone")
    assert run(second, Remove(None)) == [None]  # a new, empty queue


def test_deleting_a_fanout_child_stops_its_copies(world):
    client = world.connect()
    client.send(b"get feed\r\nget feed+a\r\nget feed+b\r\n")
    assert client.send(b"delete feed+a\r\n") == b"DELETED\r\n"
    assert client.send(b"set feed 0 0 1\r\nx\r\n") == b"STORED\r\n"
    assert client.send(b"get feed+b\r\n") == b"VALUE feed+b 0 1\r\nx\r\nEND\r\n"
    assert client.send(b"get feed+a\r\n") == b"END\r\n"  # made anew by this get, empty


def test_reconfigure_applies_new_queue_settings_to_live_queues(world):
    from kestrel_actors.config import QueueConfig
    from kestrel_actors.messages import Reconfigure

    ref = resolve(world.collection, "jobs")
    assert run(ref, Add(b"long", 0)) == [True]
    config = ServerConfig(data_dir=world.config.data_dir, queues={"jobs": QueueConfig(max_item_size=2)})
    assert ask_collection(world.collection, Reconfigure, config) is True
    assert run(ref, Add(b"long", 0), Add(b"ok", 0)) == [False, True]


def test_the_directory_sessions_read_lists_live_queues_but_no_alias(tmp_path):
    from kestrel_actors.messages import Delete

    from ..helpers import World

    world = World(tmp_path, aliases={"both": ("left", "right")})
    try:
        ref = resolve(world.collection, "kept")
        resolve(world.collection, "gone")
        resolve(world.collection, "both")
        assert world.queues == {"kept": ref, "gone": world.queues["gone"]}
        ask_collection(world.collection, Delete, "gone")
        assert world.queues == {"kept": ref}
    finally:
        world.collection.stop()
