"""Server status (behaviour §7.2): blocking, grace period, persistence. Pure, fake clock."""

from __future__ import annotations

import itertools

import pytest

from kestrel_actors.config import ServerConfig
from kestrel_actors.status import (
    DEFAULT_STATUS_FILE,
    ForbiddenStatusError,
    ServerStatus,
    Status,
    UnknownStatusError,
    default_status_file,
    session_refusals,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def make(tmp_path, clock, grace=0.0, default=Status.UP) -> ServerStatus:
    return ServerStatus(tmp_path / "run" / "status", default, grace, clock)


# -- the statuses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "reads", "writes", "graceful"),
    [
        (Status.UP, False, False, False),
        (Status.WRITE_AVOID, False, False, False),
        (Status.READ_ONLY, False, True, True),
        (Status.QUIESCENT, True, True, True),
        (Status.DOWN, True, True, False),
    ],
)
def test_what_each_status_blocks(status, reads, writes, graceful):
    assert status.blocks_reads is reads
    assert status.blocks_writes is writes
    assert status.graceful_shutdown is graceful


def test_strictness_order():
    order = [Status.UP, Status.WRITE_AVOID, Status.READ_ONLY, Status.QUIESCENT, Status.DOWN]
    for looser, stricter in itertools.pairwise(order):
        assert stricter.stricter_than(looser) and not looser.stricter_than(stricter)
    assert not Status.UP.stricter_than(Status.UP)


def test_names():
    assert [s.reply_name for s in Status] == ["UP", "WRITEAVOID", "READONLY", "QUIESCENT", "DOWN"]
    assert Status.parse("readonly") is Status.READ_ONLY
    assert Status.parse("WriteAvoid\n") is Status.WRITE_AVOID
    assert Status.parse("DOWN") is Status.DOWN
    assert Status.parse("bogus") is None


# -- changes --------------------------------------------------------------------------------


def test_default_is_up_and_changes_apply_at_once_without_grace(tmp_path, clock):
    status = make(tmp_path, clock)
    assert status.status is Status.UP and not status.blocks_writes()
    assert status.set("readonly") is Status.READ_ONLY
    assert status.blocks_writes() and not status.blocks_reads()
    status.set(Status.QUIESCENT)
    assert status.blocks_reads()
    status.set("up")
    assert not status.blocks_reads() and not status.blocks_writes()


def test_unknown_and_forbidden(tmp_path, clock):
    status = make(tmp_path, clock)
    with pytest.raises(UnknownStatusError, match=r"^Unknown status\.$"):
        status.set("bogus")
    with pytest.raises(ForbiddenStatusError, match=r"^Status forbidden\.$"):
        status.set("down")
    with pytest.raises(ForbiddenStatusError):
        status.set(Status.DOWN)
    assert status.status is Status.UP
    assert not (tmp_path / "run" / "status").exists()


def test_stricter_change_is_reported_at_once_and_enforced_after_grace(tmp_path, clock):
    status = make(tmp_path, clock, grace=30.0)
    assert status.set("quiescent") is Status.QUIESCENT
    assert status.status is Status.QUIESCENT
    assert status.enforced() is Status.UP and status.pending()
    assert not status.blocks_reads() and not status.blocks_writes()
    clock.now += 29.9
    assert not status.blocks_reads()
    clock.now += 0.1
    assert status.blocks_reads() and status.blocks_writes() and not status.pending()


def test_while_pending_non_loosening_changes_are_rejected_silently(tmp_path, clock):
    status = make(tmp_path, clock, grace=10.0)
    status.set("readonly")
    assert status.set("quiescent") is Status.READ_ONLY  # stricter: rejected
    assert status.set("readonly") is Status.READ_ONLY  # same: rejected, timer unchanged
    assert status.status is Status.READ_ONLY and status.pending()
    clock.now += 10
    assert status.enforced() is Status.READ_ONLY


def test_loosening_while_pending_applies_at_once_and_cancels(tmp_path, clock):
    status = make(tmp_path, clock, grace=10.0)
    status.set("quiescent")
    clock.now += 5
    assert status.set("readonly") is Status.READ_ONLY
    # Kestrel enforces the loosened status at once, even though it is stricter than Up
    assert status.enforced() is Status.READ_ONLY and not status.pending()
    clock.now += 100
    assert status.enforced() is Status.READ_ONLY


def test_after_the_grace_period_a_new_change_is_accepted(tmp_path, clock):
    status = make(tmp_path, clock, grace=10.0)
    status.set("readonly")
    clock.now += 11
    assert status.set("quiescent") is Status.QUIESCENT  # the earlier change settled first
    assert status.enforced() is Status.READ_ONLY and status.pending()


def test_same_status_without_pending_is_accepted_and_persisted(tmp_path, clock):
    status = make(tmp_path, clock)
    assert status.set("up") is Status.UP
    assert (tmp_path / "run" / "status").read_text() == "Up\n"


def test_loosening_has_no_grace(tmp_path, clock):
    status = make(tmp_path, clock, grace=10.0, default=Status.QUIESCENT)
    status.set("up")
    assert status.enforced() is Status.UP


def test_shutdown_enters_down_immediately_and_is_not_persisted(tmp_path, clock):
    status = make(tmp_path, clock, grace=10.0)
    status.set("readonly")
    status.shutdown()
    assert status.status is Status.DOWN and status.enforced() is Status.DOWN
    assert status.blocks_reads() and not status.graceful_shutdown()
    assert (tmp_path / "run" / "status").read_text() == "ReadOnly\n"


# -- persistence ----------------------------------------------------------------------------


def test_every_accepted_change_is_written_with_parent_dirs(tmp_path, clock):
    status = make(tmp_path, clock)
    path = tmp_path / "run" / "status"
    for name, stored in [("readonly", "ReadOnly\n"), ("writeavoid", "WriteAvoid\n"),
                         ("QUIESCENT", "Quiescent\n"), ("up", "Up\n")]:
        status.set(name)
        assert path.read_text() == stored


def test_rejected_change_is_not_written(tmp_path, clock):
    status = make(tmp_path, clock, grace=10.0)
    status.set("readonly")
    status.set("quiescent")
    assert (tmp_path / "run" / "status").read_text() == "ReadOnly\n"


def test_load_restores_the_stored_status_case_insensitively(tmp_path, clock):
    path = tmp_path / "run" / "status"
    path.parent.mkdir()
    path.write_text("readONLY\n")
    status = make(tmp_path, clock, grace=30.0)
    assert status.load() is Status.READ_ONLY
    # restored statuses are enforced at once, without a grace period, and not rewritten
    assert status.blocks_writes() and not status.pending()
    assert path.read_text() == "readONLY\n"


def test_round_trip_across_a_restart(tmp_path, clock):
    make(tmp_path, clock).set("quiescent")
    restarted = make(tmp_path, clock)
    assert restarted.status is Status.UP
    restarted.load()
    assert restarted.status is Status.QUIESCENT and restarted.blocks_reads()


@pytest.mark.parametrize("content", [None, "", "bogus\n", b"\xff\xfe"])
def test_missing_or_bad_file_keeps_the_default(tmp_path, clock, content):
    path = tmp_path / "run" / "status"
    if content is not None:
        path.parent.mkdir()
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    status = make(tmp_path, clock, default=Status.READ_ONLY)
    assert status.load() is Status.READ_ONLY
    assert status.enforced() is Status.READ_ONLY


def test_unreadable_file_keeps_the_default(tmp_path, clock):
    (tmp_path / "run" / "status").mkdir(parents=True)  # a directory cannot be read as a file
    status = make(tmp_path, clock, default=Status.WRITE_AVOID)
    assert status.load() is Status.WRITE_AVOID


def test_stored_down_is_honoured_like_kestrel(tmp_path, clock):
    path = tmp_path / "run" / "status"
    path.parent.mkdir()
    path.write_text("Down\n")
    status = make(tmp_path, clock)
    assert status.load() is Status.DOWN
    assert status.set("up") is Status.UP


def test_write_failure_keeps_the_change(tmp_path, clock):
    blocker = tmp_path / "file"
    blocker.write_text("")
    status = ServerStatus(blocker / "sub" / "status", Status.UP, 0.0, clock)
    assert status.set("readonly") is Status.READ_ONLY
    assert status.blocks_writes()


def test_no_file_at_all(clock):
    status = ServerStatus(None, "quiescent", 0.0, clock)
    assert status.load() is Status.QUIESCENT
    assert status.set("up") is Status.UP


# -- construction from config ---------------------------------------------------------------


def test_from_plain_server_config_uses_kestrel_defaults(tmp_path, clock):
    status = ServerStatus.from_config(ServerConfig(data_dir=str(tmp_path)), clock)
    assert status.path == tmp_path / DEFAULT_STATUS_FILE == default_status_file(tmp_path)
    assert status.status is Status.UP and status.grace_period == 0.0


def test_from_file_config(tmp_path, clock):
    config = ServerConfig(
        data_dir=str(tmp_path), status_file=str(tmp_path / "s"), default_status="ReadOnly",
        status_change_grace_period=5.0,
    )
    status = ServerStatus.from_config(config, clock)
    assert status.path == tmp_path / "s"
    assert status.status is Status.READ_ONLY and status.grace_period == 5.0


def test_default_status_file_is_a_subdirectory_of_the_data_dir(tmp_path):
    path = default_status_file(tmp_path)
    # queue discovery takes regular files directly in data_dir; this one is in a directory
    assert path.parent != tmp_path and path.parent.parent == tmp_path


# -- connection limits ----------------------------------------------------------------------


def test_session_refusals():
    assert session_refusals(5, None, None) == (False, False)
    assert session_refusals(5, 5, 4) == (False, True)
    assert session_refusals(6, 5, 10) == (True, False)
