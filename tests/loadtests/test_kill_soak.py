"""The kill soak (``python -m kestrel_actors.loadtests.kill_soak``, issue 53): a short run
against a real server, and its checker fed a loss and a confirmed item delivered again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kestrel_actors.loadtests.kill_soak import PLAIN_QUEUE, Ledger, summarize

from ..helpers import REPO, free_port


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~40 s alone; a 2-core box shared 5 ways takes several times that
def test_short_kill_soak_loses_nothing_and_delivers_no_confirmed_item_again(tmp_path):
    """4 SIGKILLs and 1 SIGTERM under the soak's mixed load (memcache and thrift producers,
    ``/open``+``/close``, blocking reads, ``monitor``+``confirm``, thrift get+confirm, plain
    gets, a fanout master and two children): every acknowledged item of a reliably read
    queue is confirmed once or still there, none comes back after its confirm was answered."""
    command = [sys.executable, "-m", "kestrel_actors.loadtests.kill_soak", "--kills", "4", "--terms", "1",
               "--seconds-between", "2", "--settle-seconds", "2", "--port", str(free_port()),
               "--thrift-port", str(free_port()), "--data-dir", str(tmp_path / "soak"), "--seed", "7",
               "--json"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=580)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr: {proc.stderr}"
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    result = json.loads(lines[-1])
    assert result["kills"] == 4 and result["terms"] == 1
    assert result["term_exit_codes"] == [0, 0]  # the scheduled SIGTERM and the final stop
    for queue in result["queues"]:
        assert queue["confirmed_again"] == 0, queue
        if queue["kind"] == "plain":
            assert queue["lost"] <= queue["unanswered_takes"], queue
        else:
            assert queue["lost"] == 0, queue
        # enough traffic through every queue for the counts to mean something
        assert queue["confirmed"] > 20 and queue["acknowledged"] > 20, queue
    assert {"open/close", "open/close t=500", "monitor+confirm", "thrift get+confirm", "plain get",
            "thrift plain get"} <= set(result["by_reader"])


def test_checker_counts_a_loss_and_a_confirmed_item_delivered_again():
    """The verdict is not vacuous: an acknowledged item neither confirmed nor left is lost, an
    item seen after its confirm's answer is confirmed again, an unconfirmed one seen twice is a
    redelivery, and a confirm that was never answered may have been done (not lost)."""
    ledger = Ledger()
    ledger.acked(("rel",), [b"kept", b"lost", b"twice", b"redelivered", b"unanswered"])
    ledger.delivered("rel", [b"twice"], 1.0)
    ledger.confirmed("rel", [b"twice"], 2.0, "open/close")
    ledger.delivered("rel", [b"twice"], 3.0)  # after its confirm was answered
    ledger.delivered("rel", [b"redelivered"], 1.0)
    ledger.delivered("rel", [b"redelivered"], 4.0)
    ledger.confirmed("rel", [b"redelivered"], 5.0, "open/close")
    ledger.delivered("rel", [b"unanswered"], 1.0)
    with pytest.raises(ConnectionResetError), ledger.confirming("rel", [b"unanswered"]):
        raise ConnectionResetError  # sent, never answered
    ledger.queues["rel"].left.append(b"kept")
    ledger.acked((PLAIN_QUEUE,), [b"taken"])
    ledger.take_unanswered(PLAIN_QUEUE, 1)
    rows = {row.queue: row for row in summarize(ledger)}
    assert (rows["rel"].lost, rows["rel"].confirmed_again, rows["rel"].redelivered_unconfirmed) == (1, 1, 1)
    assert (rows["rel"].confirm_unanswered, rows["rel"].unanswered_confirms_done) == (1, 1)
    assert (rows[PLAIN_QUEUE].lost, rows[PLAIN_QUEUE].unanswered_takes) == (1, 1)
