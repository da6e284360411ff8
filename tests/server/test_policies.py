"""Queue policies against a real server (behaviour §5.6–5.13, behaviour §1, §10 items 6, 7, 12).

Item expiry, limits, fanout, aliases, queue expiry, open-read timeouts, ``reload`` and
``dump_config``, start-up config errors, ``client_timeout`` and
``connection_limit_refuse_writes``. Every test talks to a ``kestrel-actors serve`` process
over a socket; queue settings come from a TOML file passed with ``--config``.

Most tests share ``policy_server`` (one config, background sweeps off so that expiry counts
are exact) and use queue names no other test uses. Tests that need other server settings or
global counters start their own server.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..helpers import Client, ServerProcess, free_port, wait_for

POLICY_CONFIG = """\
[queues.maxi]
max_items = 2

[queues.maxs]
max_size = 510

[queues.maxis]
max_item_size = 10

[queues.disc]
max_items = 2
discard_old_when_full = true

[queues.aged]
max_age = "2s"

[queues.src]
expire_to_queue = "dst"

[queues.fo]
fanout_only = true

[queues.fobig]
fanout_only = true
max_item_size = 4

[queues."cfg+b"]

[queues.ott]
open_transaction_timeout = "300ms"

[queues.alfull]
max_items = 1

[aliases]
both = ["al1", "al2"]
part = ["alok", "alfull"]
chain = ["both", "al3"]
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def stats_of(server: ServerProcess) -> dict[str, str]:
    client = server.client()
    try:
        return client.stats()
    finally:
        client.close()


def get_all(client: Client, queue: str) -> list[bytes]:
    items = []
    while (item := client.get(queue)) is not None:
        items.append(item)
    return items


def read_until_end(client: Client) -> list[bytes]:
    lines = []
    while (line := client.read_line()) != b"END":
        lines.append(line)
    return lines


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("policies")
    config = write(base / "kestrel.toml", POLICY_CONFIG)
    server = ServerProcess(base / "data", ("--config", str(config), "--expiration-timer-frequency", "0"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def c(policy_server):
    client = policy_server.client()
    yield client
    client.close()


# -- item expiry (behaviour §2.4, §5.6, §10.6) ------------------------------------------------------------


EXPIRY = 2
"""Seconds an expiring item lives in these tests: the requests a test makes before it must
have expired (a few round trips) take far less even on a loaded machine."""


def sleep_past(epoch: float) -> None:
    """Sleep until the server's clock (the epoch, as ``time.time()``) is past ``epoch``."""
    time.sleep(max(0.0, epoch + 0.2 - time.time()))


def test_relative_and_absolute_expiry(c):
    """A relative (< 1e6 s) and an absolute epoch (>= 1e6) expiry both work; 0 is never."""
    assert c.set("exrel", b"a", EXPIRY) == b"STORED"
    stored = time.time()  # the server counts "a"'s seconds from before it answered
    assert c.get("exrel/peek") == b"a"  # not expired yet
    assert c.set("exrel", b"b", 0) == b"STORED"
    expires = int(time.time()) + 1
    assert c.set("exabs", b"a", expires) == b"STORED"
    assert c.set("exabs", b"b", 0) == b"STORED"
    # far in the future: an absolute time taken as relative would also survive, so the
    # exabs queue above is what tells the two readings apart
    assert c.set("exfar", b"f", int(time.time()) + 3600) == b"STORED"
    sleep_past(max(stored + EXPIRY, expires))
    assert c.get("exrel") == b"b"
    assert c.get("exabs") == b"b"
    assert c.get("exfar") == b"f"
    stats = c.stats()
    assert stats["queue_exrel_expired_items"] == "1"
    assert stats["queue_exabs_expired_items"] == "1"
    assert stats["queue_exfar_expired_items"] == "0"


@pytest.mark.parametrize("exptime", [-1, -100, 1_000_000, "past"])
def test_already_expired_item_is_stored_but_never_delivered(c, exptime):
    queue = f"expast{str(exptime).replace('-', 'm')}"
    if exptime == "past":
        exptime = int(time.time()) - 10
    assert c.set(queue, b"dead", exptime) == b"STORED"
    assert c.get(queue + "/peek") is None
    assert c.get(queue) is None
    assert c.get(queue + "/open") is None
    stats = c.stats()
    assert stats[f"queue_{queue}_expired_items"] == "1"
    assert stats[f"queue_{queue}_items"] == "0"


def test_flush_expired_replies_the_decimal_count(c):
    # every SET sweeps the head first (behaviour §5.6), so the items must expire after they are added
    for _ in range(3):
        assert c.set("exflush", b"x", EXPIRY) == b"STORED"
        stored = time.time()
    assert c.set("exflush", b"live", 0) == b"STORED"
    assert c.set("exflush", b"y", -1) == b"STORED"  # behind a live item: stays until the head
    sleep_past(stored + EXPIRY)
    assert c.call(b"flush_expired exflush") == b"3"
    assert c.call(b"flush_expired exflush") == b"0"
    stats = c.stats()
    assert stats["queue_exflush_items"] == "2"
    assert stats["queue_exflush_expired_items"] == "3"
    assert c.get("exflush") == b"live"
    assert c.call(b"flush_expired exflush") == b"1"


def test_a_set_sweeps_expired_items_at_the_head_first(c):
    assert c.set("exonset", b"a", -1) == b"STORED"
    assert c.set("exonset", b"b", -1) == b"STORED"  # sweeps "a"
    assert c.stats()["queue_exonset_expired_items"] == "1"
    assert c.call(b"flush_expired exonset") == b"1"


def test_flush_expired_on_a_missing_queue_is_zero_and_creates_nothing(c):
    assert c.call(b"flush_expired exnosuch") == b"0"
    assert "queue_exnosuch_items" not in c.stats()


def test_flush_all_expired_replies_the_decimal_total(make_server):
    server = make_server("--expiration-timer-frequency", "0")
    client = server.client()
    for queue, expiring, live in (("fa1", 2, 0), ("fa2", 1, 1), ("fa3", 0, 2)):
        for _ in range(expiring):
            assert client.set(queue, b"old", EXPIRY) == b"STORED"
            stored = time.time()
        for _ in range(live):
            assert client.set(queue, b"new", 0) == b"STORED"
    sleep_past(stored + EXPIRY)
    assert client.call(b"flush_all_expired") == b"3"
    assert client.call(b"flush_all_expired") == b"0"
    stats = client.stats()
    assert [stats[f"queue_fa{n}_items"] for n in (1, 2, 3)] == ["0", "1", "2"]
    assert [stats[f"queue_fa{n}_expired_items"] for n in (1, 2, 3)] == ["2", "1", "0"]


def test_max_age_caps_the_expiry(c):
    """``max_age = 2s``: an item with no expiry, or a later one, is gone after two seconds."""
    assert c.set("aged", b"never", 0) == b"STORED"
    assert c.get("aged/peek") == b"never"  # not expired yet
    assert c.set("aged", b"hour", 3600) == b"STORED"
    stored = time.time()
    assert c.set("agedctl", b"kept", 0) == b"STORED"  # default config: no cap
    sleep_past(stored + EXPIRY)
    assert c.get("aged") is None
    assert c.get("agedctl") == b"kept"
    assert c.stats()["queue_aged_expired_items"] == "2"


def test_expired_items_move_to_expire_to_queue(c):
    """Expired items are re-added to ``expire_to_queue`` with no expiry (behaviour §5.6)."""
    total_before = int(c.stats()["total_items"])
    assert c.set("src", b"one", -1) == b"STORED"
    assert "queue_dst_items" in c.stats()  # the target is created with the source (behaviour §5.2)
    assert c.set("src", b"two", -1) == b"STORED"  # this SET's sweep moves "one"
    assert c.call(b"flush_expired src") == b"1"  # and this moves "two"
    stats = c.stats()
    assert stats["queue_src_expired_items"] == "2"
    assert stats["queue_src_items"] == "0"
    assert stats["queue_dst_items"] == "2"
    assert stats["queue_dst_total_items"] == "2"
    assert int(stats["total_items"]) == total_before + 2  # the moves are not counted globally
    # the original expiry (already past) is not carried over: they are delivered
    assert get_all(c, "dst") == [b"one", b"two"]


def test_background_sweep_moves_expired_items_to_expire_to_queue(make_server, tmp_path):
    config = write(tmp_path / "sweep.toml", '[queues.bsrc]\nexpire_to_queue = "bdst"\n')
    server = make_server("--config", str(config), "--expiration-timer-frequency", "0.1")
    client = server.client()
    assert client.set("bsrc", b"late", 1) == b"STORED"
    assert client.set("bsrc", b"gone", -1) == b"STORED"
    # nobody touches bsrc: only the background task can move them
    assert wait_for(lambda: client.stats()["queue_bdst_items"] == "2")
    stats = client.stats()
    assert stats["queue_bsrc_items"] == "0"
    assert stats["queue_bsrc_expired_items"] == "2"
    # "gone" sat behind the live "late" until that expired too: one sweep moved both, in order
    assert get_all(client, "bdst") == [b"late", b"gone"]


def test_background_sweep_removes_expired_items(make_server):
    server = make_server("--expiration-timer-frequency", "0.1")
    client = server.client()
    assert client.set("bgexp", b"x", -1) == b"STORED"
    assert wait_for(lambda: client.stats()["queue_bgexp_expired_items"] == "1")
    assert client.stats()["queue_bgexp_items"] == "0"


# -- limits (behaviour §5.7, §10.7) -----------------------------------------------------------------------


def test_max_items_refuses_when_full(c):
    assert c.set("maxi", b"1") == b"STORED"
    assert c.set("maxi", b"2") == b"STORED"
    assert c.set("maxi", b"3") == b"NOT_STORED"
    assert c.get("maxi") == b"1"
    assert c.set("maxi", b"4") == b"STORED"
    assert get_all(c, "maxi") == [b"2", b"4"]
    assert c.stats()["queue_maxi_discarded"] == "0"  # refusals are not discards


def test_max_size_is_checked_before_the_add_so_one_add_overshoots(c):
    block = b"z" * 256
    assert c.set("maxs", block) == b"STORED"
    assert c.set("maxs", block) == b"STORED"  # 256 < 510 before the add: total 512
    assert c.set("maxs", b"q") == b"NOT_STORED"
    stats = c.stats()
    assert stats["queue_maxs_bytes"] == "512"
    assert stats["queue_maxs_items"] == "2"


def test_max_item_size_refuses_only_larger_items(c):
    assert c.set("maxis", b"x" * 10) == b"STORED"
    assert c.set("maxis", b"x" * 11) == b"NOT_STORED"
    assert c.set("maxis", b"") == b"STORED"
    assert c.stats()["queue_maxis_items"] == "2"


def test_discard_old_when_full_drops_the_head(c):
    for data in (b"a", b"b", b"c", b"d"):
        assert c.set("disc", data) == b"STORED"
    stats = c.stats()
    assert stats["queue_disc_discarded"] == "2"
    assert stats["queue_disc_items"] == "2"
    assert get_all(c, "disc") == [b"c", b"d"]


# -- fanout (behaviour §5.9, §10.12) ----------------------------------------------------------------------


def test_child_referenced_before_a_set_receives_a_copy(c):
    assert c.set("fan", b"old") == b"STORED"
    assert c.get("fan+a") is None  # references (creates) the child
    assert c.set("fan", b"new") == b"STORED"
    assert get_all(c, "fan+a") == [b"new"]  # items already in the master are not copied
    assert get_all(c, "fan") == [b"old", b"new"]
    assert c.stats()["queue_fan_children"] == "fan+a"


def test_set_to_a_child_goes_only_to_that_child(c):
    assert c.get("fdir+a") is None
    assert c.get("fdir+b") is None
    assert c.set("fdir+a", b"only") == b"STORED"
    assert c.get("fdir") is None
    assert c.get("fdir+b") is None
    assert c.get("fdir+a") == b"only"


def test_every_child_gets_a_copy_and_children_stat_lists_them(c):
    assert c.get("fmany+x") is None
    assert c.get("fmany+y") is None
    assert c.set("fmany", b"m") == b"STORED"
    assert c.get("fmany+x") == b"m"
    assert c.get("fmany+y") == b"m"
    assert c.get("fmany") == b"m"
    assert sorted(c.stats()["queue_fmany_children"].split(",")) == ["fmany+x", "fmany+y"]


def test_deleted_child_stops_receiving_copies(c):
    assert c.get("fdel+a") is None
    assert c.set("fdel", b"1") == b"STORED"
    assert c.call(b"delete fdel+a") == b"DELETED"
    assert c.set("fdel", b"2") == b"STORED"
    stats = c.stats()
    assert "queue_fdel+a_items" not in stats  # not fed, so not re-created either
    assert stats["queue_fdel_children"] == ""  # the set stays, empty (behaviour §5.9)
    assert get_all(c, "fdel") == [b"1", b"2"]


def test_fanout_only_master_stores_nothing_but_children_get_copies(c):
    assert c.get("fo+c1") is None
    assert c.set("fo", b"copy") == b"STORED"
    assert c.get("fo") is None
    stats = c.stats()
    assert stats["queue_fo_items"] == "0"
    assert stats["queue_fo_total_items"] == "0"
    # the child inherits fanout_only, which has no effect on a child
    assert c.get("fo+c1") == b"copy"


def test_fanout_only_master_still_refuses_an_oversized_item(c):
    """Kestrel checks ``max_item_size`` before ``fanout_only`` (behaviour §2.4: NOT_STORED)."""
    assert c.set("fobig", b"1234") == b"STORED"
    assert c.set("fobig", b"12345") == b"NOT_STORED"


def test_child_named_in_the_config_gets_the_very_first_set(c):
    """``[queues."cfg+b"]``: the child exists from start-up, never referenced by a client."""
    assert "queue_cfg+b_items" in c.stats()
    assert c.set("cfg", b"first") == b"STORED"
    assert c.get("cfg+b") == b"first"
    assert c.get("cfg") == b"first"


def test_fanout_child_survives_a_restart(make_server):
    """A child is registered when it is loaded from disk at start-up (behaviour §5.9; needs the journal)."""
    server = make_server()
    client = server.client()
    assert client.get("rfan+a") is None
    client.close()
    server.restart()
    client = server.client()
    assert client.set("rfan", b"after") == b"STORED"
    assert client.stats().get("queue_rfan+a_items") == "1"
    assert client.get("rfan+a") == b"after"


# -- aliases (behaviour §5.10, §10.12) --------------------------------------------------------------------


def test_set_to_an_alias_reaches_every_destination(c):
    assert c.set("both", b"hello") == b"STORED"
    assert c.get("al1") == b"hello"
    assert c.get("al2") == b"hello"
    stats = c.stats()
    assert stats["queue_both_put_items"] == "1"
    assert stats["queue_both_put_bytes"] == "5"
    assert stats["queue_both_children"] == "al1,al2"
    assert "queue_both_items" not in stats  # an alias is not a queue


def test_get_on_an_alias_is_end_and_creates_nothing(c):
    assert c.get("part") is None
    assert c.get("part/open") is None
    assert c.get("part/peek") is None
    assert "queue_part_items" not in c.stats()


def test_alias_set_is_not_stored_if_any_destination_refuses(c):
    assert c.set("alfull", b"filler") == b"STORED"  # max_items = 1: now full
    assert c.set("part", b"p") == b"NOT_STORED"
    assert c.get("alok") == b"p"  # the other destination still got it
    assert c.get("alfull") == b"filler"


def test_alias_of_an_alias(c):
    assert c.set("chain", b"deep") == b"STORED"
    assert c.get("al3") == b"deep"
    stats = c.stats()
    assert stats["queue_chain_put_items"] == "1"
    assert stats["queue_chain_put_bytes"] == "4"
    assert stats["queue_chain_children"] == "both,al3"
    # through "both"
    found = {c.get("al1"), c.get("al2")}
    assert found == {b"deep"}


def test_monitor_on_an_alias_ends_at_once_and_the_session_goes_on(c):
    c.send(b"monitor both 1 1\r\n")
    assert c.read_line() == b"END"
    assert c.set("almon", b"after") == b"STORED"
    assert c.get("almon") == b"after"


def test_flush_and_delete_of_an_alias_do_nothing_to_it(c):
    assert c.call(b"flush both") == b"END"
    assert c.call(b"delete both") == b"DELETED"
    assert c.set("both", b"still") == b"STORED"
    assert c.get("al1") == b"still"
    assert c.get("al2") == b"still"


# -- queue expiry (behaviour §5.12) -----------------------------------------------------------------------


def test_max_queue_age_deletes_an_empty_queue(make_server, tmp_path):
    config = write(
        tmp_path / "qage.toml",
        '[queues.shortq]\nmax_queue_age = "300ms"\n\n[queues.fullq]\nmax_queue_age = "300ms"\n',
    )
    server = make_server("--config", str(config), "--expiration-timer-frequency", "0.1")
    client = server.client()
    assert client.get("shortq") is None  # created, empty
    assert client.set("fullq", b"keep") == b"STORED"
    assert client.get("plainq") is None  # no max_queue_age
    assert wait_for(lambda: "queue_shortq_items" not in client.stats())
    time.sleep(0.3)
    stats = client.stats()
    assert stats["queue_expires"] == "1"
    assert stats["queue_deletes"] == "1"
    assert stats["queue_fullq_items"] == "1"  # not empty: kept
    assert "queue_plainq_items" in stats
    assert client.get("fullq") == b"keep"


# -- open-read timeout (behaviour §5.3) -------------------------------------------------------------------


def test_open_transaction_timeout_redelivers_to_a_later_fetch(policy_server):
    holder = policy_server.client()
    other = policy_server.client()
    assert holder.set("ott", b"one") == b"STORED"
    assert holder.set("ott", b"two") == b"STORED"
    assert holder.get("ott/open") == b"one"
    assert other.stats()["queue_ott_open_transactions"] == "1"
    time.sleep(0.5)  # past the 300 ms timeout; the holder stays connected
    assert other.get("ott") == b"one"
    assert other.get("ott") == b"two"
    stats = other.stats()
    assert stats["queue_ott_open_transactions"] == "0"
    assert stats["queue_ott_canceled_transactions"] == "1"
    assert holder.call(b"version").startswith(b"VERSION ")  # still connected
    holder.close()
    other.close()


# -- reload and dump_config (behaviour §2.3, §5.13) -------------------------------------------------------


def dump_config(client: Client) -> dict[str, dict[str, str]]:
    """``dump_config`` parsed: ``{"queue 'name'": {setting: value}}``."""
    client.send(b"dump_config\r\n")
    blocks: dict[str, dict[str, str]] = {}
    current = None
    for line in read_until_end(client):
        text = line.decode()
        if match := re.fullmatch(r"(queue|alias) '([^']*)' \{", text):
            current = blocks.setdefault(f"{match[1]} '{match[2]}'", {})
        elif text == "}":
            current = None
        elif text.strip():
            assert current is not None, text
            key, _, value = text.strip().partition("=")
            assert text.startswith("  ")
            current[key] = value
    return blocks


RELOAD_V1 = '[queues.rl]\nmax_items = 1\n\n[aliases]\nrlal = ["rl"]\n'
RELOAD_V2 = (
    '[queues.rl]\nmax_items = 3\n\n[queues."rl+kid"]\n\n[queues.rlage]\nmax_age = "200ms"\n\n'
    '[aliases]\nrlal = ["rl"]\nrlnew = ["rl2"]\n'
)


def test_reload_applies_new_queue_settings_to_the_live_server(make_server, tmp_path):
    config = write(tmp_path / "reload.toml", RELOAD_V1)
    server = make_server("--config", str(config), "--expiration-timer-frequency", "0")
    client = server.client()
    assert client.set("rl", b"a") == b"STORED"
    assert client.set("rl", b"b") == b"NOT_STORED"
    assert client.set("rlage", b"old") == b"STORED"  # no max_age yet
    time.sleep(0.3)
    write(config, RELOAD_V2)
    assert client.call(b"reload") == b"Reloaded config."
    assert client.set("rl", b"b") == b"STORED"
    assert client.set("rl", b"c") == b"STORED"
    assert client.set("rl", b"d") == b"NOT_STORED"
    # a child the new file names exists at once and gets copies, even of the item its
    # full master refused (the copy is made first, behaviour §5.9)
    assert client.stats().get("queue_rl+kid_items") == "3"
    # max_age applies at the next sweep, to items added before the reload too (behaviour §5.6)
    assert client.get("rlage") is None
    assert client.stats()["queue_rlage_expired_items"] == "1"
    assert client.set("rlnew", b"via-new-alias") == b"STORED"  # reload adds aliases
    assert client.get("rl2") == b"via-new-alias"
    assert dump_config(client)["queue 'rl'"]["max_items"] == "3"


def test_reload_of_a_broken_file_keeps_the_old_config(make_server, tmp_path):
    config = write(tmp_path / "reload.toml", RELOAD_V1)
    server = make_server("--config", str(config), "--expiration-timer-frequency", "0")
    client = server.client()
    assert client.set("rl", b"a") == b"STORED"
    write(config, '[queues.rl]\nmax_items = 5\nmax_itemz = 7\n')
    reply = client.call(b"reload")  # the reason, on one line (issue 21.6)
    assert reply.startswith(b"SERVER_ERROR config not reloaded: ") and b"max_itemz" in reply, reply
    assert client.set("rl", b"b") == b"NOT_STORED"  # still max_items = 1
    write(config, "[queues.rl\nmax_items = 5\n")  # invalid TOML
    assert client.call(b"reload").startswith(b"SERVER_ERROR config not reloaded: ")
    assert client.set("rl", b"b") == b"NOT_STORED"
    assert client.get("rl") == b"a"
    assert client.set("rl", b"b") == b"STORED"  # and the server keeps working
    assert dump_config(client)["queue 'rl'"]["max_items"] == "1"
    assert "max_itemz" in server.log()


def test_dump_config_lists_each_queue_with_its_effective_settings(make_server, tmp_path):
    config = write(
        tmp_path / "dump.toml",
        '[queue_defaults]\nmax_size = 4096\n\n[queues.dq]\nmax_items = 5\nmax_age = "2s"\n\n'
        '[aliases]\ndal = ["dq", "dplain"]\n',
    )
    server = make_server("--config", str(config))
    client = server.client()
    assert client.get("dq") is None
    assert client.get("dplain") is None
    assert client.get("dq+kid") is None
    blocks = dump_config(client)
    assert {"queue 'dq'", "queue 'dplain'", "queue 'dq+kid'", "alias 'dal'"} <= set(blocks)
    dq = blocks["queue 'dq'"]
    assert dq["max_items"] == "5"
    assert dq["max_size"] == "4096"
    assert float(dq["max_age"]) == 2.0
    assert dq["discard_old_when_full"] == "false"
    plain = blocks["queue 'dplain'"]
    assert plain["max_items"] == str(2**31 - 1)
    assert plain["max_size"] == "4096"  # [queue_defaults]
    assert plain["max_age"] == "none"
    assert blocks["queue 'dq+kid'"]["max_items"] == "5"  # a child runs with its master's config
    assert blocks["alias 'dal'"] == {"destinations": "dq,dplain"}
    assert client.call(b"version").startswith(b"VERSION ")  # in sync after END


# -- bad config at start-up ---------------------------------------------------------------------


def test_unknown_key_at_start_up_exits_1_naming_the_key_and_line(tmp_path):
    bad = write(tmp_path / "bad.toml", "# a comment\n[queues.jobs]\nmax_items = 3\nmax_itemz = 5\n")
    proc = subprocess.run(
        [sys.executable, "-m", "kestrel_actors.cli", "serve", "--config", str(bad), "--admin-port", "0",
         "--port", str(free_port()), "--data-dir", str(tmp_path / "data")],
        capture_output=True, timeout=30,
    )
    assert proc.returncode == 1
    stderr = proc.stderr.decode()
    assert "bad.toml:4" in stderr
    assert "max_itemz" in stderr


# -- connections: client_timeout and connection limits (behaviour §1) -------------------------------------


def test_client_timeout_closes_an_idle_connection(make_server):
    # The timeout is long beside the gaps between requests, so a loaded machine holding the
    # test (or the server) back for a while does not leave the connection idle that long.
    timeout = 3.0
    server = make_server("--client-timeout", str(timeout))
    client = server.client()
    assert client.set("idle", b"held") == b"STORED"
    assert client.get("idle/open") == b"held"
    for _ in range(8):  # activity keeps it open well past the timeout
        time.sleep(0.5)
        last_sent = time.monotonic()  # the server's idle clock restarts after this
        assert client.call(b"version").startswith(b"VERSION ")
    assert client.is_closed()  # within the clients' patience
    # and not at once (the server checks idleness on its loop's clock)
    assert time.monotonic() - last_sent >= 0.75 * timeout
    # the open read went back to the queue when the connection closed
    other = server.client()
    assert wait_for(lambda: other.stats()["queue_idle_items"] == "1")
    assert other.get("idle") == b"held"


def test_client_timeout_answers_a_request_that_waited_unread_while_the_server_was_held_up(make_server):
    """The server is stopped (SIGSTOP) for longer than ``--client-timeout`` while a request
    waits unread in its socket: when it runs again, the idle check comes due in the same loop
    pass as the request, and the connection is not idle, since its client has sent a request.
    It is answered; once the connection really sends nothing for that long, it is closed."""
    timeout = 1.0
    server = make_server("--client-timeout", str(timeout))
    pid = server.proc.pid
    client = server.client()
    assert client.call(b"version").startswith(b"VERSION ")
    answered = time.monotonic()  # the server's idle clock started before it answered
    os.kill(pid, signal.SIGSTOP)
    try:
        assert wait_for(lambda: _process_state(pid) == "T")
        client.send(b"version\r\n")  # into the stopped server's socket buffer, unread
        # stopped past the timeout on the server's clock (a monotonic one runs on meanwhile)
        time.sleep(max(0.0, answered + 1.5 * timeout - time.monotonic()))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert client.read_line().startswith(b"VERSION ")
    assert client.is_closed()  # idle from here on: closed, within the clients' patience


def _process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` (``T``: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_connection_limit_refuse_writes(make_server, tmp_path):
    config = write(tmp_path / "limit.toml", "connection_limit_refuse_writes = 2\n")
    server = make_server("--config", str(config))
    # A session's limit is fixed when it opens, against the sessions the server counts then;
    # the start-up probes' hang-ups may still be on their way, so the count settles first.
    probe = server.client()
    assert wait_for(lambda: _connections(probe) == 1)
    probe.close()
    first = server.client()  # counted with at most the probe: 2
    assert wait_for(lambda: _connections(first) == 1)
    assert first.set("climit", b"1") == b"STORED"
    second = server.client()
    assert second.set("climit", b"2") == b"STORED"
    third = server.client()  # 3 sessions > 2: writes refused for its whole life
    assert third.get("climit") == b"1"  # reads are fine
    first.close()
    second.close()
    assert wait_for(lambda: _connections(third) == 1)
    assert third.set("climit", b"3") == b"SERVER_ERROR"
    assert third.is_closed()
    fourth = server.client()  # opened while 1 session exists (itself)
    assert fourth.set("climit", b"4") == b"STORED"
    assert get_all(fourth, "climit") == [b"2", b"4"]


def _connections(client: Client) -> int:
    return int(client.stats()["curr_connections"])
