"""The results the messages room defines for a queue's operations: what a closed queue and a miss
answer, and how a journal failure is found among a batch's results (behaviour §5, §6)."""

from __future__ import annotations

import errno

from kestrel_actors.messages import (
    Add,
    Confirm,
    FlushExpired,
    JournalFailure,
    Open,
    OpenMany,
    Peek,
    Remove,
    RemoveMany,
    closed_result,
    failed_result,
    first_failure,
    missed_result,
)


def test_a_closed_queue_answers_each_operation_as_an_empty_one_would():
    assert closed_result(Add(b"x", 0)) is False
    assert closed_result(OpenMany(10, None)) == [] and closed_result(RemoveMany(10, None)) == []
    assert closed_result(Confirm((1, 2))) == 0 and closed_result(FlushExpired()) == 0
    assert closed_result(Remove(None)) is None and closed_result(Open(None)) is None


def test_a_miss_is_no_item_or_an_empty_list():
    assert missed_result(Remove(None)) is None and missed_result(Peek(None)) is None
    assert missed_result(OpenMany(3, None)) == [] and missed_result(RemoveMany(3, None)) == []


def test_a_journal_failure_is_falsy_and_says_why():
    failure = JournalFailure(OSError(errno.ENOSPC, "No space left on device"))
    assert not failure
    assert failure.message == "journal write failed: No space left on device"


def test_the_first_failure_among_add_results():
    failure = JournalFailure(OSError(errno.EIO, "Input/output error"))
    assert first_failure([True, False, failure, True]) is failure
    assert first_failure([True, False]) is None


def test_a_failed_result_is_one_of_an_operation_that_takes_items_in_the_range():
    failure = JournalFailure(OSError(errno.EIO, "Input/output error"))
    ops = [Add(b"a", 0), Confirm((1,)), Remove(None)]
    assert failed_result(ops, [failure, 1, None], 0, 3) is None  # an add says its own
    assert failed_result(ops, [True, failure, None], 0, 3) is failure
    assert failed_result(ops, [True, failure, None], 2, 3) is None  # outside the range
    assert failed_result(ops, [True], 0, 3) is None  # results cut short: no index past them
