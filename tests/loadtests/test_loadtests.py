"""The load-test harness (``kestrel_actors.loadtests``): every scenario once, small, against a real server.

Each scenario runs as a subprocess exactly as a user would run it (``python -m kestrel_actors.loadtests`` or
``kestrel-actors load``) and must exit 0 with a JSON line whose figures add up. The harness
must also *fail* when the server misbehaves, so some tests plant an out-of-order or foreign
item in the queue (with -F, no flush) and require exit code 1, and the checkers are fed bad
data directly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from kestrel_actors.loadtests.figures import Figures, Recorder, bucket_of, bucket_value
from kestrel_actors.loadtests.items import make_item, packing_item
from kestrel_actors.loadtests.report import EXIT_FAILED, Outcome, tally

from ..helpers import DEFAULT_PORTS, REPO, ServerProcess, default_ports_held


def run_load(server, *args: str, via: str = "module", timeout: float = 60,
             port: int | None = None) -> tuple[int, dict, str]:
    """Run a scenario against ``server`` (``-p port``: the memcache port unless given);
    return (exit code, final JSON record, stdout)."""
    if via == "module":
        command = [sys.executable, "-m", "kestrel_actors.loadtests"]
    else:
        command = [sys.executable, "-m", "kestrel_actors.cli", "load"]
    port = server.port if port is None else port
    command += [args[0], "-p", str(port), "--no-progress", "--timeout", "50", *args[1:]]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr: {proc.stderr}"
    record = json.loads(lines[-1])
    return proc.returncode, record, proc.stdout + proc.stderr


LOOPS = pytest.mark.parametrize("loop", ["lean", "greenlets"])
"""put-many, get-many and mixed run on the one epoll loop (``kestrel_actors.loadtests.fleet``)
unless ``--greenlets``: both ways must pass the same checks."""


def loop_args(loop: str) -> tuple[str, ...]:
    return ("--greenlets",) if loop == "greenlets" else ()


def assert_clean(code: int, record: dict, output: str, items: int) -> None:
    assert code == 0, output
    assert record["ok"] is True
    assert record["items"] == items
    assert record["lost"] == 0 and record["duplicated"] == 0
    assert record["seconds"] > 0 and record["rate"] > 0
    assert set(record["latency_usec"]) == {"p50", "p90", "p99", "p999"}
    assert 0 < record["latency_usec"]["p50"] <= record["latency_usec"]["p999"]


@LOOPS
def test_put_many_with_gets(server, loop):
    code, record, out = run_load(server, "put-many", "-c", "8", "-n", "400", "-r", "4", "-Q", "2",
                                 "-g", *loop_args(loop))
    assert_clean(code, record, out, 400)
    assert (f"Put 400 items of 1024 bytes in bursts of 4 to 127.0.0.1:{server.port} in 2 queues named spam "
            "using 8 clients.") in out
    assert "Distribution in usec: min=" in out
    assert record["get"]["items"] == 400 and record["get"]["misses"] == 0


THREADS_AT_EXIT = """
import os, runpy, sys
sys.argv[0] = "kestrel_actors.loadtests"
try:
    runpy.run_module("kestrel_actors.loadtests", run_name="__main__")
finally:
    print("threads at exit:", len(os.listdir("/proc/self/task")), file=sys.stderr)
"""


def test_the_load_generator_exits_with_no_thread_but_its_own(server):
    """Python 3.11 crashes (SIGSEGV) when a process exits before a thread it started has first
    run: the training's put-many -c 10 -r 32 died so on a loaded machine, with the ten threads
    gevent had started to resolve 127.0.0.1 for its ten clients. The generator starts none."""
    proc = subprocess.run([sys.executable, "-c", THREADS_AT_EXIT, "put-many", "-c", "10", "-r", "32", "-n", "640",
                           "-p", str(server.port), "--no-progress", "--timeout", "50"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1] == "threads at exit: 1", proc.stderr


@pytest.mark.slow
def test_put_many_via_kestrel_actors_load_in_two_processes(server, tmp_path):
    plot = tmp_path / "put.png"
    code, record, out = run_load(server, "put-many", "-c", "6", "-n", "600", "--procs", "2",
                                 "--plot", str(plot), via="cli")
    assert_clean(code, record, out, 600)
    assert record["procs"] == 2
    assert plot.stat().st_size > 10_000


@LOOPS
def test_get_many(server, loop):
    code, record, out = run_load(server, "get-many", "-c", "20", "-n", "1000", "-q", "gm", *loop_args(loop))
    assert_clean(code, record, out, 1000)
    assert "Got 1000 items" in out
    assert record["fill"]["items"] == 1000


@LOOPS
def test_mixed(server, loop):
    """Every client alternates a SET and a GET; each item is received once, in the run or the drain."""
    code, record, out = run_load(server, "mixed", "-c", "10", "-n", "500", "-q", "mx", *loop_args(loop))
    assert code == 0, out
    assert record["ok"] is True and record["items"] == 1000  # 500 SETs and 500 GETs
    assert record["lost"] == 0 and record["duplicated"] == 0
    assert "GETs:" in out


@LOOPS
def test_mixed_detects_an_item_it_did_not_put(server, loop):
    client = server.client()
    assert client.set("mf", b"not a stamped item") == b"STORED"
    client.close()
    code, record, out = run_load(server, "mixed", "-c", "2", "-n", "20", "-q", "mf", "-F", *loop_args(loop))
    assert code == EXIT_FAILED, out
    assert record["ok"] is False


@pytest.mark.slow
def test_many_clients_transactional_with_kills(server):
    code, record, out = run_load(server, "many-clients", "-c", "30", "-n", "300", "-s", "0",
                                 "-k", "10", "-q", "mc")
    assert_clean(code, record, out, 300)
    assert record["transactional"] is True
    assert record["kills"] > 0
    assert "Received 300 items in" in out


@pytest.mark.slow
def test_flood_prefill_several_producers_and_consumers(server):
    code, record, out = run_load(server, "flood", "-n", "600", "-P", "50", "-R", "2", "-C", "3",
                                 "-B", "-q", "fl", "--procs", "2")
    assert code == 0, out
    assert record["items"] >= 600 and record["lost"] == 0 and record["duplicated"] == 0
    assert "flood: producers=2 each sending 300 items (in chunks of 1) of 1kB to fl" in out
    assert "Consumer(s) spun" in out


def test_flood_rollup_uses_monitor_and_confirm(make_server):
    server = make_server("--max-open-transactions", "8")
    code, record, out = run_load(server, "flood", "-n", "400", "-r", "8", "-q", "flr")
    assert code == 0, out
    assert record["items"] >= 400 and record["lost"] == 0


def test_packing(server):
    code, record, out = run_load(server, "packing", "-n", "200", "-c", "2", "-t", "0", "-q", "pk")
    assert_clean(code, record, out, 600)
    assert out.count("Read 200 items in") == 3 and "cycle: 2" in out


def test_leaky_reader(server):
    code, record, out = run_load(server, "leaky-reader", "-n", "500", "-t", "3", "-d", "0.1",
                                 "-q", "lk")
    assert_clean(code, record, out, 500)
    assert record["dropped"] > 0
    assert "Completed all reads" in out


@pytest.fixture
def thrift_server(tmp_path):
    server = ServerProcess(tmp_path / "data", thrift_port=True).start()
    yield server
    server.stop()


def test_leaky_reader_over_thrift_loses_nothing(thrift_server):
    # dropped items are neither confirmed nor aborted: only the auto-abort timer brings them back
    code, record, out = run_load(thrift_server, "leaky-reader", "--thrift", "--thrift-port",
                                 str(thrift_server.thrift_port), "-n", "300", "-t", "3", "-d", "0.1",
                                 "-a", "300", "-q", "lkt")
    assert_clean(code, record, out, 300)
    assert record["protocol"] == "thrift"
    assert record["dropped"] > 0
    assert "Completed all reads" in out
    with thrift_server.thrift_client() as client:
        info = client.peek("lkt")
        assert info.items == 0 and info.open_transactions == 0


def test_put_many_and_flood_over_thrift(thrift_server):
    port = str(thrift_server.thrift_port)
    code, record, out = run_load(thrift_server, "put-many", "--thrift", "--thrift-port", port,
                                 "-c", "4", "-n", "200", "-r", "5", "-g", "-q", "pmt")
    assert_clean(code, record, out, 200)
    assert record["protocol"] == "thrift" and record["get"]["items"] == 200
    assert f"to 127.0.0.1:{port} in 1 queues" in out
    code, record, out = run_load(thrift_server, "flood", "--thrift", "--thrift-port", port,
                                 "-n", "300", "-R", "2", "-C", "2", "-r", "4", "-B", "-q", "flt")
    assert code == 0, out
    assert record["protocol"] == "thrift"
    assert record["items"] >= 300 and record["lost"] == 0 and record["duplicated"] == 0


def test_thrift_load_tests_speak_only_thrift_with_p_as_the_thrift_port(thrift_server):
    # Kestrel's tools: --thrift with -p naming the thrift port. Were any flush, prefill or check
    # sent as memcache to that port, the server would close on it and the run would fail.
    port = thrift_server.thrift_port
    code, record, out = run_load(thrift_server, "leaky-reader", "--thrift", "-n", "100", "-d", "0.1",
                                 "-a", "300", port=port)
    assert_clean(code, record, out, 100)
    assert "through spam-thrift" in out and "Completed all reads" in out  # Kestrel's default queue
    code, record, out = run_load(thrift_server, "put-many", "--thrift", "-c", "2", "-n", "50", "-g",
                                 "-q", "pmp", port=port)
    assert_clean(code, record, out, 50)
    assert f"to 127.0.0.1:{port} in 1 queues" in out
    code, record, out = run_load(thrift_server, "flood", "--thrift", "-P", "20", "-n", "50", "-q", "flp",
                                 port=port)
    assert code == 0, out
    assert record["lost"] == 0 and record["duplicated"] == 0
    stats = thrift_server.client().stats()
    assert stats["queue_spam-thrift_items"] == "0" and stats["queue_spam-thrift_open_transactions"] == "0"
    assert stats["queue_flp_total_items"] == "70"  # the prefill went in over thrift too
    assert stats["queue_pmp_items"] == "0"


# -- --resp: the same load tests against Redis's lists (issue 56) -------------------------

def _redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        pytest.skip("redis-server is not installed (make redis installs Debian's)")
    return path


class RedisServer:
    """A redis-server on a free loopback port, without persistence, its data in ``data``."""

    def __init__(self, data) -> None:
        from ..helpers import free_port, wait_for

        self.port = free_port()
        self.proc = subprocess.Popen([_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--daemonize", "no", "--save", "", "--appendonly", "no",
                                      "--dir", str(data)], stdout=subprocess.DEVNULL)
        assert wait_for(lambda: _accepts(self.port), timeout=20), "redis-server did not listen"

    def call(self, *words: bytes) -> bytes:
        """One command (RESP written out here, not by the code under test); its first reply line."""
        request = b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(request)
            reply = b""
            while not reply.endswith(b"\r\n"):
                reply += sock.recv(4096)
        return reply.split(b"\r\n")[0]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@LOOPS
def test_resp_mode_puts_and_gets_through_a_redis_list(redis, loop):
    """``--resp``: put-many (pipelined, with -g), get-many and mixed speak RESP to a real
    redis-server, on the lean loop and on greenlets, and every item comes back once."""
    code, record, out = run_load(redis, "put-many", "--resp", "-c", "4", "-n", "200", "-r", "4", "-g",
                                 "-q", "rpm", *loop_args(loop))
    assert_clean(code, record, out, 200)
    assert record["protocol"] == "resp" and record["get"]["items"] == 200
    code, record, out = run_load(redis, "get-many", "--resp", "-c", "5", "-n", "300", "-r", "8", "-q", "rgm",
                                 *loop_args(loop))
    assert_clean(code, record, out, 300)
    assert record["fill"]["items"] == 300 and "Got 300 items" in out
    code, record, out = run_load(redis, "get-many", "--resp", "-c", "1", "-n", "50", "-q", "rg1")
    assert_clean(code, record, out, 50)
    code, record, out = run_load(redis, "mixed", "--resp", "-c", "5", "-n", "200", "-q", "rmx", *loop_args(loop))
    assert code == 0, out
    assert record["items"] == 400 and record["lost"] == 0 and record["duplicated"] == 0
    for queue in (b"rpm", b"rgm", b"rg1", b"rmx"):
        assert redis.call(b"LLEN", queue) == b":0"


def test_resp_mode_floods_in_order(redis):
    """flood --resp: producers RPUSH, consumers LPOP (BLPOP with -B); FIFO order is checked."""
    code, record, out = run_load(redis, "flood", "--resp", "-n", "300", "-P", "20", "-R", "2", "-C", "2",
                                 "-q", "rfl")
    assert code == 0, out
    assert record["protocol"] == "resp"
    assert record["items"] >= 300 and record["lost"] == 0 and record["duplicated"] == 0
    code, record, out = run_load(redis, "flood", "--resp", "-n", "200", "-B", "-q", "rfb")
    assert code == 0, out
    assert record["lost"] == 0 and record["duplicated"] == 0
    assert redis.call(b"LLEN", b"rfb") == b":0"  # (rfl keeps what is left of its backlog, as Kestrel's does)


@LOOPS
def test_resp_mode_detects_wrong_replies(redis, loop):
    """A foreign item in the list, a key that is no list (``-WRONGTYPE``), items out of order:
    each fails the run (exit 1), as the memcache checks do."""
    bad = bytearray(make_item(3, 1024))
    bad[500] ^= 1
    assert redis.call(b"RPUSH", b"rgf", bytes(bad)) == b":1"
    code, record, out = run_load(redis, "get-many", "--resp", "-c", "2", "-n", "20", "-q", "rgf", "-F",
                                 *loop_args(loop))
    assert code == EXIT_FAILED, out
    assert any("not an item this run put" in f for f in record["failures"])
    assert redis.call(b"SET", b"rwt", b"a string") == b"+OK"
    code, record, out = run_load(redis, "put-many", "--resp", "-c", "2", "-n", "10", "-q", "rwt", "-F",
                                 *loop_args(loop))
    assert code == EXIT_FAILED, out
    assert any("WRONGTYPE" in f for f in record["failures"]), record
    assert redis.call(b"RPUSH", b"rfo", make_item(5, 1024), make_item(2, 1024)) == b":2"
    code, record, out = run_load(redis, "flood", "--resp", "-n", "10", "-q", "rfo", "-F")
    assert code == EXIT_FAILED, out
    assert any("order violation: item 2 after item 5" in f for f in record["failures"]), record


def test_resp_replies_are_cut_and_checked_whole():
    """The sans-I/O scanner: a reply is complete only with all its bytes; integer replies of
    pipelined pushes are counted; an error among them is a wrong reply."""
    from kestrel_actors.client import UnexpectedReply
    from kestrel_actors.loadtests.resp import check_lengths, pop_item, reply_end

    hit = b"$5\r\nhello\r\n"
    assert reply_end(hit) == len(hit) and reply_end(hit[:-1]) == -1 and reply_end(b"$-1\r\n") == 5
    blpop = b"*2\r\n$1\r\nq\r\n" + hit
    assert reply_end(blpop + b":1\r\n") == len(blpop) and reply_end(blpop[:-3]) == -1
    assert pop_item(b"$-1\r\n") is None and pop_item(b"*-1\r\n") is None and pop_item(hit) == hit
    with pytest.raises(UnexpectedReply, match="WRONGTYPE"):
        pop_item(b"-WRONGTYPE Operation against a key\r\n")
    assert check_lengths(b":1\r\n:2\r\n", 2) and not check_lengths(b":1\r\n:", 2)
    for wrong in (b":1\r\n-ERR x\r\n", b":1\r\n:2\r\n:3\r\n", b":1\r\n:\r\n", b"+OK\r\n:1\r\n"):
        with pytest.raises(UnexpectedReply):
            check_lengths(wrong, 2)


# -- the harness must detect a misbehaving server ----------------------------------------

def test_packing_detects_an_out_of_order_item(server):
    """A stray item 1 at the head of the queue (and -F, no flush) is an order violation."""
    client = server.client()
    assert client.set("po", packing_item(1, 1024)) == b"STORED"
    client.close()
    code, record, out = run_load(server, "packing", "-n", "5", "-c", "0", "-q", "po", "-F")
    assert code == EXIT_FAILED, out
    assert record["ok"] is False
    assert any("order violation: expected item 0" in f for f in record["failures"])


@LOOPS
def test_get_many_detects_foreign_bytes(server, loop):
    """An item whose bytes differ from what the run put (one flipped byte) fails the run."""
    bad = bytearray(make_item(3, 1024))
    bad[500] ^= 1
    client = server.client()
    assert client.set("gf", bytes(bad)) == b"STORED"
    client.close()
    code, record, out = run_load(server, "get-many", "-c", "2", "-n", "20", "-q", "gf", "-F", *loop_args(loop))
    assert code == EXIT_FAILED, out
    assert any("not an item this run put" in f for f in record["failures"])


def test_order_checker_rejects_reordering():
    from kestrel_actors.client import UnexpectedReply
    from kestrel_actors.loadtests.scenarios._stamped import OrderChecker

    checker = OrderChecker([0, 10, 20])  # backlog 0-9, producer A 10-19, producer B 20-29
    for item in (0, 1, 10, 20, 11, 21):
        checker.check(item)
    with pytest.raises(UnexpectedReply, match="after item 11"):
        checker.check(11)
    late = OrderChecker([0, 10])
    late.check(10)
    with pytest.raises(UnexpectedReply, match="backlog item 2"):
        late.check(2)


def test_hit_checker_rejects_corruption_and_foreign_ids():
    from kestrel_actors.client import UnexpectedReply, value_reply
    from kestrel_actors.loadtests.scenarios._stamped import HitChecker

    check = HitChecker("q", 64, limit=10)
    assert check.item(value_reply("q", make_item(7, 64))) == 7
    with pytest.raises(UnexpectedReply, match="outside"):
        check.item(value_reply("q", make_item(12, 64)))
    with pytest.raises(UnexpectedReply, match="not an item"):
        check.item(value_reply("q", make_item(7, 64)[:-1] + b"!"))
    with pytest.raises(UnexpectedReply, match="not an item"):
        check.item(value_reply("other", make_item(7, 64)))


def test_tally_and_verdict_count_lost_and_duplicated_items():
    missing, duplicated = tally(bytes([1, 0, 2, 1, 0, 3]))
    assert missing == [1, 4] and duplicated == 3
    outcome = Outcome("x", Figures("get"), lost=len(missing))
    assert outcome.exit_code == EXIT_FAILED and outcome.as_json()["ok"] is False
    assert Outcome("x", Figures("get")).exit_code == 0


def test_histogram_percentiles_are_within_a_fraction_of_a_percent():
    for usec in (0, 1, 999, 1023, 1024, 1500, 65_537, 10**7):
        value = bucket_value(bucket_of(usec))
        assert value <= usec and usec - value <= usec / 256 + 1
    rec = Recorder("get", epoch=0)
    for usec in range(1, 10_001):
        rec.hist[bucket_of(usec)] += 1
    figures = rec.figures(go_ns=1)
    assert abs(figures.percentile(0.5) - 5000) <= 20
    assert abs(figures.percentile(0.99) - 9900) <= 40


# -- make bench ----------------------------------------------------------------------------

def test_bench_splice_keeps_the_text_around_the_markers():
    from kestrel_actors.loadtests.bench import END, START, splice

    text = f"# Title\n\nintro\n\n{START}\nold table\n{END}\n\nafterword\n"
    result = splice(text, "new table")
    assert result == f"# Title\n\nintro\n\n{START}\nnew table\n{END}\n\nafterword\n"
    appended = splice("# Mine\n", "t")
    assert appended.startswith("# Mine\n") and appended.endswith(f"{START}\nt\n{END}\n")
    assert START in splice("", "t") and "make bench" in splice("", "t")


@pytest.mark.slow
def test_bench_quick_run_writes_the_table(tmp_path):
    """``python -m kestrel_actors.loadtests.bench`` starts its own server and fills in the markdown table."""
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nkeep me\n")
    proc = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.bench", "--quick", "--runs", "1",
                           "--only", "flood", "--only", "durable", "--write", str(doc)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = doc.read_text()
    assert "keep me" in text and "<!-- bench:start -->" in text and "<!-- bench:end -->" in text
    assert "| flood, 1 producer + 1 consumer |" in text and "items/s" in text
    durable = next(line for line in text.splitlines() if line.startswith("| durable put-many"))
    # measured against the floor server's group commit, interleaved (ADR 0018): its rate and a ratio
    assert "| floor: " in durable and "| ≥ 0.9× floor |" in durable, durable
    assert "floor run 1:" in proc.stdout
    # each run says where it ran (ADR 0024: a closed-loop row's two modes on this VM)
    assert "on the load generator's vCPU" in proc.stdout


@pytest.mark.slow
def test_bench_quick_run_has_redis_rows(tmp_path):
    """Issue 56: with redis-server on PATH the bench runs the same load test with ``--resp``
    against a fresh Redis per run, interleaved with ours, and each row gets a Redis sub-row with
    its rate, CPU, the ratio and the Redis goal (the durable row against ``appendfsync always``)."""
    _redis_server()
    doc = tmp_path / "benchmarks.md"
    proc = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.bench", "--quick", "--runs", "1",
                           "--only", "get-many, 10 clients", "--only", "durable", "--write", str(doc)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Redis run 1:" in proc.stdout
    lines = doc.read_text().splitlines()
    plain = next(i for i, line in enumerate(lines) if line.startswith("| get-many, 10 clients x 32"))
    assert lines[plain + 1].startswith("| ↳ Redis (no persistence) |"), lines[plain + 1]
    assert "| Redis: " in lines[plain + 1] and "| ≥ 0.8× Redis |" in lines[plain + 1]
    assert "--resp` |" in lines[plain + 1]
    durable = next(i for i, line in enumerate(lines) if line.startswith("| durable put-many"))
    assert lines[durable + 1].startswith("| ↳ Redis (appendfsync always) |"), lines[durable + 1]
    assert "| ≥ 1.0× Redis |" in lines[durable + 1]
    proc = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.bench", "--quick", "--runs", "1",
                           "--only", "get-many, 10 clients", "--no-redis"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Redis run" not in proc.stdout and "↳ Redis" not in proc.stdout


def test_bench_redis_row_is_judged_by_its_ratio_to_redis():
    """The Redis goals (issue 56) are ratios of medians, shown in the sub-row under ours."""
    from kestrel_actors.loadtests.bench import BENCHMARKS, Row, Side, render

    goals = {bench.name: bench.redis_goal for bench in BENCHMARKS if bench.redis_goal is not None}
    assert goals == {"put-many, 1 client, one SET in flight": 0.9,
                     "get-many, 10 clients x 32 GETs per write": 0.8,
                     "durable put-many (fsync every write), 100 clients": 1.0}
    assert not any(bench.redis for bench in BENCHMARKS if bench.args[0] == "many-clients")
    one = next(bench for bench in BENCHMARKS if bench.name.startswith("put-many, 1 client"))
    record = {"rate": 90.0, "lost": 0, "duplicated": 0, "latency_usec": {"p50": 1, "p99": 2}}
    row = Row(one, "cmd", ours=Side(records=[record], server_cpu=[50.0], server_sys=[12.0]),
              redis=Side(records=[{**record, "rate": 100.0}], server_cpu=[40.0], server_sys=[30.0]))
    assert row.redis_ratio() == 0.9 and row.redis_met is True
    table = render([row], 1, redis="/usr/bin/redis-server")
    sub = table.splitlines()[table.splitlines().index(next(line for line in table.splitlines()
                                                         if line.startswith("| put-many, 1 client"))) + 1]
    assert sub.startswith("| ↳ Redis (no persistence) |")
    assert "| Redis: 100 | 40 (30) | 0.90 | ≥ 0.9× Redis | yes |" in sub and "`cmd --resp`" in sub
    # and Redis writing its append-only file before each reply (ADR 0023): reported, no goal
    assert "--appendfsync" in one.redis_also and one.redis_also[one.redis_also.index("--appendfsync") + 1] == "no"
    row.redis_also = Side(records=[{**record, "rate": 120.0}], server_cpu=[45.0], server_sys=[35.0])
    lines = render([row], 1, redis="/usr/bin/redis-server").splitlines()
    ours = lines.index(next(line for line in lines if line.startswith("| put-many, 1 client")))
    assert lines[ours + 1].startswith("| ↳ Redis (no persistence) |")
    assert lines[ours + 2].startswith("| ↳ Redis (appendfsync no) |"), lines[ours + 2]
    assert "| Redis: 120 | 45 (35) | 0.75 | — | — |" in lines[ours + 2]
    assert row.redis_met is True  # the goal stays the one against Redis without persistence
    slower = Row(one, "cmd", ours=Side(records=[{**record, "rate": 89.0}]),
                 redis=Side(records=[{**record, "rate": 100.0}]))
    assert slower.redis_met is False and "| 0.89 | ≥ 0.9× Redis | no |" in render([slower], 1, redis="redis-server")


def test_path_bench_drives_the_real_actors_and_reports_each_scenario():
    """``python -m kestrel_actors.loadtests.path_bench``: every scenario runs on a server in process (its GETs
    are checked to return the filled items) and prints a CPU time per request."""
    proc = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.path_bench", "--rounds", "1",
                           "--requests", "400"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines() if "µs/request" in line]
    assert names == ["set", "get", "blocking", "churn"]


def test_loop_bench_reports_loop_operations_of_each_scenario():
    """``python -m kestrel_actors.loadtests.loop_bench``: a real server in process, one client; a line
    of loop operations per request for each scenario (issue 24)."""
    proc = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.loop_bench", "--requests", "100",
                           "--no-strace"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "per request:" in line]
    assert [line.split()[0] for line in lines] == ["set", "get", "set-always", "connect"]
    assert all("iterations" in line and "switches" in line for line in lines)


@pytest.mark.slow
def test_ab_bench_alternates_two_trees_and_reports_each():
    proc = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.ab_bench", "--rounds", "2", "flood -n 500",
                           str(REPO), f"{REPO}/"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [line for line in proc.stdout.splitlines() if "µs per request" in line and "median" not in line]
    summaries = [line for line in proc.stdout.splitlines() if "median" in line]
    assert len(runs) == 4 and len(summaries) == 2


def test_ab_bench_runs_a_tree_on_the_interpreter_it_names(tmp_path):
    """``DIR@PYTHON``: that tree's server runs on PYTHON. A stand-in interpreter that records its
    arguments and then runs this one shows it was the one started."""
    log = tmp_path / "started"
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {sys.executable} "$@"\n')
    stand_in.chmod(0o755)
    proc = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.ab_bench", "--rounds", "1", "flood -n 200",
                           str(REPO), f"{REPO}/@{stand_in}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log.read_text().count("kestrel_actors.cli serve") == 1  # the other tree's server ran on this one
    assert f"{REPO}/@{stand_in}: median" in proc.stdout


def test_ab_bench_runs_a_peer_binary_and_says_where_the_pair_ran(tmp_path):
    """``peer:BINARY``: that binary, on darner's command line (a stand-in that records it and
    serves with ours); every run and summary says how often server and load generator shared a
    vCPU (ADR 0024: the two modes of a closed-loop row)."""
    log = tmp_path / "started"
    peer = tmp_path / "peer"
    peer.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                    f'exec {sys.executable} -m kestrel_actors.cli serve --host 127.0.0.1 --port "$2" --data-dir "$4" '
                    '--text-port 0 --thrift-port 0 --admin-port 0\n')
    peer.chmod(0o755)
    with default_ports_held(), contextlib.ExitStack() as taken:
        for port in DEFAULT_PORTS[1:]:  # another server's text, thrift and admin ports
            listener = taken.enter_context(socket.socket())
            listener.bind(("127.0.0.1", port))
            listener.listen()
        proc = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.ab_bench", "--rounds", "1",
                               "flood -n 300", str(REPO), f"peer:{peer}"], cwd=REPO, capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    arguments = log.read_text().split()
    assert arguments[0] == "-p" and arguments[2] == "-d" and len(arguments) == 4
    runs = [line for line in proc.stdout.splitlines() if "µs per request" in line and "median" not in line]
    assert [line.split(":")[0] for line in runs if line.startswith("peer:")] == ["peer"]
    shares = [float(line.rsplit("same vCPU ", 1)[1]) for line in runs]
    assert len(shares) == 2 and all(0.0 <= share <= 1.0 for share in shares)
    assert sum("same vCPU median" in line for line in proc.stdout.splitlines()) == 2


def test_placement_tells_one_cpu_from_two():
    """The same-vCPU share of two processes pinned to one CPU is 1, to two CPUs 0."""
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    from kestrel_actors.loadtests.bench import Placement

    first, second = sorted(os.sched_getaffinity(0))[:2]
    spin = [sys.executable, "-c", "import time\nend = time.monotonic() + 0.6\nwhile time.monotonic() < end: pass"]
    shares = []
    for cpus in ((first, first), (first, second)):
        procs = [subprocess.Popen(spin, preexec_fn=functools.partial(os.sched_setaffinity, 0, {cpu})) for cpu in cpus]
        time.sleep(0.15)
        placement = Placement(procs[0].pid, procs[1].pid, every=0.01)
        time.sleep(0.3)
        shares.append(placement.stop())
        for proc in procs:
            proc.wait()
    assert shares == [1.0, 0.0]


def test_process_counters_tell_waits_and_calls_apart():
    """A process that writes 200 times and sleeps 20 times: at least that many write calls and
    asked-for context switches since the first reading, and CPU split into user and system."""
    from kestrel_actors.loadtests.bench import ProcessCounters

    work = ("import os, sys, time\nsys.stdin.readline()\nfd = os.open(os.devnull, os.O_WRONLY)\n"
            "for _ in range(200): os.write(fd, b'x')\nfor _ in range(20): time.sleep(0.002)\n"
            "print(flush=True)\nsys.stdin.readline()\n")
    proc = subprocess.Popen([sys.executable, "-c", work], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        before = ProcessCounters.of(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        proc.stdout.readline()  # the writes and sleeps are done
        done = ProcessCounters.of(proc.pid).since(before)
    finally:
        proc.stdin.close()
        proc.wait()
    assert done.writes >= 200 and done.voluntary >= 20
    assert done.user >= 0 and done.system >= 0 and done.involuntary >= 0
    figures = done.per_item(200)
    assert figures["write_calls"] >= 1.0 and figures["voluntary_switches"] >= 0.1


def test_bench_row_meets_its_goal_by_the_ratio_to_the_peer():
    """With a peer the goal is the ratio of medians; without one, the absolute target. Every CPU
    figure carries its system part in brackets (issue 24: the VM's regime shows there)."""
    from kestrel_actors.loadtests.bench import Benchmark, Row, Side, render

    bench = Benchmark("b", ("flood",), "items/s", goal=1.0, target=10.0)
    ours = Side(records=[{"rate": 90.0, "lost": 0, "duplicated": 0,
                          "latency_usec": {"p50": 1, "p99": 2}}], server_cpu=[50.0], server_sys=[12.0])
    slower = Row(bench, "cmd", ours=ours, peer=Side(records=[{"rate": 100.0}], server_cpu=[40.0],
                                                    server_sys=[30.0]))
    assert slower.ratio() == 0.9 and slower.met is False
    faster = Row(bench, "cmd", ours=ours, peer=Side(records=[{"rate": 80.0}]))
    assert faster.met is True
    alone = Row(bench, "cmd", ours=ours)
    assert alone.ratio() is None and alone.met is True  # 90 >= the target of 10
    table = render([slower], 1, peer="/bin/peer")
    assert "| 0.90 | ≥ 1.0× | no |" in table and "| 50 (12) | 100 | 40 (30) |" in table
    just_short = Row(bench, "cmd", ours=ours, peer=Side(records=[{"rate": 90.4}]))
    assert just_short.met is False  # 0.9956x: the table must not print it as the goal's 1.00
    assert "| 0.99 | ≥ 1.0× | no |" in render([just_short], 1, peer="/bin/peer")
    exact = Row(bench, "cmd", ours=Side(records=[{**ours.records[0], "rate": 29.0}]),
                peer=Side(records=[{"rate": 100.0}]))
    assert "| 0.29 | ≥ 1.0× | no |" in render([exact], 1, peer="/bin/peer")  # 0.28999... is still 0.29


def test_bench_durable_row_is_judged_by_its_ratio_to_the_floor():
    """ADR 0018: the durable row has no absolute target; it must reach 0.9x the floor server's
    rate, and the table names the floor in the peer's column."""
    from kestrel_actors.loadtests.bench import BENCHMARKS, Row, Side, render

    durable = next(bench for bench in BENCHMARKS if bench.name.startswith("durable"))
    assert durable.floor and not durable.peer and durable.goal == 0.9 and durable.target is None
    ours = Side(records=[{"rate": 20_000.0, "lost": 0, "duplicated": 0, "latency_usec": {"p50": 1, "p99": 2}}],
                server_cpu=[30.0], server_sys=[15.0])
    below = Row(durable, "cmd", ours=ours, peer=Side(records=[{"rate": 25_000.0}], server_cpu=[28.0],
                                                     server_sys=[16.0]))
    assert below.ratio() == 0.8 and below.met is False
    level = Row(durable, "cmd", ours=ours, peer=Side(records=[{"rate": 21_000.0}]))
    assert level.met is True  # 0.95x, though far below 35,000 SET/s
    table = render([below], 1)
    assert "| floor: 25,000 | 28 (16) | 0.80 | ≥ 0.9× floor | no |" in table


def test_floor_server_stores_what_put_many_sends(tmp_path):
    """The issue-12 floor (kestrel_actors/loadtests/floor_server.py) answers put-many as a server would, and
    its journal file holds every item: what docs/benchmarks.md measures against is real work."""
    from ..helpers import free_port, wait_for

    port = free_port()
    journal = tmp_path / "floor.journal"
    proc = subprocess.Popen([sys.executable, "-m", "kestrel_actors.loadtests.floor_server", str(port), str(journal)],
                            cwd=REPO)
    try:
        assert wait_for(lambda: _accepts(port), timeout=20)
        result = subprocess.run(
            [sys.executable, "-m", "kestrel_actors.loadtests", "put-many", "-c", "1", "-n", "200", "-b", "100", "-F",
             "-p", str(port), "--no-progress"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        record = json.loads(result.stdout.strip().splitlines()[-1])
        assert record["items"] == 200
        assert journal.stat().st_size == 200 * (5 + 100)  # one record (tag, length, item) per SET
    finally:
        proc.kill()
        proc.wait()


def test_floor_server_with_sync_journal_always_commits_in_groups(tmp_path):
    """The durable row's floor (ADR 0018): every item reaches its journal, and ten clients' SETs
    share fdatasyncs (it reports its rounds and records on SIGTERM)."""
    from ..helpers import free_port, wait_for

    port = free_port()
    journal = tmp_path / "floor.journal"
    proc = subprocess.Popen([sys.executable, "-m", "kestrel_actors.loadtests.floor_server", str(port), str(journal),
                             "--sync-journal", "always"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: _accepts(port), timeout=20)
        result = subprocess.run(
            [sys.executable, "-m", "kestrel_actors.loadtests", "put-many", "-c", "10", "-n", "400", "-b", "100",
             "-p", str(port), "--no-progress"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1])["items"] == 400
        assert journal.stat().st_size == 400 * (5 + 100)
        proc.terminate()
        out, _err = proc.communicate(timeout=20)
        rounds, records = map(int, out.split())
        assert records == 400 and 1 <= rounds < records, out
    finally:
        proc.kill()
        proc.wait()


def _accepts(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_floor_server_serves_reads_and_blocking_readers(tmp_path):
    """ADR 0020: the floor also serves GETs from one in-memory queue, and a ``get q/t=MS`` on an
    empty one waits for the next SET or its timeout, so get-many, flood and many-clients run
    against it beside kestrel-actors and darner, with no item lost or duplicated."""
    from ..helpers import free_port, wait_for

    port = free_port()
    journal = tmp_path / "floor.journal"
    proc = subprocess.Popen([sys.executable, "-m", "kestrel_actors.loadtests.floor_server", str(port), str(journal)],
                            cwd=REPO)
    try:
        assert wait_for(lambda: _accepts(port), timeout=20)
        for scenario in (["get-many", "-c", "2", "-n", "200", "-b", "100"], ["flood", "-n", "200", "-B"],
                         ["many-clients", "-c", "20", "-n", "200", "-s", "0"]):
            result = subprocess.run(
                [sys.executable, "-m", "kestrel_actors.loadtests", *scenario, "-p", str(port), "--no-progress"],
                cwd=REPO, capture_output=True, text=True, timeout=120,
            )
            assert result.returncode == 0, result.stdout + result.stderr
            record = json.loads(result.stdout.strip().splitlines()[-1])
            assert record["items"] == 200 and record["lost"] == 0 and record["duplicated"] == 0, record
        # every GET that took an item appended its one-byte REMOVE record after the SETs' records
        assert journal.read_bytes().count(b"\x04") >= 600
    finally:
        proc.kill()
        proc.wait()


def test_source_calls_bench_reports_the_planners_cpu_per_item():
    """``source_calls_bench`` (ADR 0022) starts its own server and drives the source's planner
    calls over a few small batches: it must keep running and report its figures."""
    proc = subprocess.run([sys.executable, "-m", "kestrel_actors.loadtests.source_calls_bench",
                           "--items", "9000", "--item-bytes", "100", "--batch", "2000",
                           "--partition", "500", "--runs", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    [run] = figures["runs"]
    assert figures["scenario"] == "source-calls" and run["batches"] == 5
    assert run["measured_items"] == 3000 and run["planner_cpu_us"] > 0 <= run["server_cpu_us"]
    # the first batches (new pages, ADR 0022 point 3) apart, and the planner's counters
    assert run["first_batches_cpu_us"] > 0 and figures["first_batches_cpu_us_median"] > 0
    assert run["planner"]["user_us"] >= 0 <= run["planner"]["system_us"]
    assert run["planner"]["minor_faults"] >= 0


def test_planner_watch_finds_the_planner_process_and_splits_its_cpu_by_thread():
    """``spark_source_bench``'s :class:`PlannerWatch` finds the query's planner process (a
    ``python_streaming_source_runner`` started after the watch began) and splits its CPU into
    the main thread's and that of threads which ended before the stop (the read-ahead's)."""
    from kestrel_actors.loadtests.spark_source_bench import CpuWatch, PlannerWatch

    work = ("import sys, threading, time\n"
            "def spin(seconds):\n    end = time.process_time() + seconds\n"
            "    while time.process_time() < end: pass\n"
            "sys.stdin.readline()\nahead = threading.Thread(target=spin, args=(0.4,))\n"
            "ahead.start()\nahead.join()\nspin(0.2)\nprint(flush=True)\nsys.stdin.readline()\n")
    cpu = CpuWatch()
    cpu.start()
    proc = subprocess.Popen([sys.executable, "-c", work, "python_streaming_source_runner"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        watch = PlannerWatch()
        for _ in range(100):  # until the process is listed
            cpu.sample()
            watch.sample(cpu)
            if watch.pid is not None:
                break
            time.sleep(0.05)
        assert watch.pid == proc.pid
        proc.stdin.write("go\n")
        proc.stdin.flush()
        proc.stdout.readline()
        cpu.stop()
        figures = watch.stop(cpu, 1000)  # µs per row of 1,000 rows
    finally:
        proc.stdin.close()
        proc.wait()
    threads = figures["threads_us"]
    assert threads["ended"] >= 300 and threads["main"] >= 150, figures
    assert figures["user_us"] + figures["system_us"] >= 450


def test_spark_source_bench_compiles_the_package_as_an_install_does(tmp_path):
    """Spark's Python processes import ``kestrel_actors`` from the tree; with
    ``PYTHONDONTWRITEBYTECODE`` and no ``.pyc`` each of them compiled it again (ADR 0022)."""
    import importlib.util

    import kestrel_actors
    from kestrel_actors.loadtests.spark_source_bench import compile_package

    source = os.path.join(os.path.dirname(kestrel_actors.__file__), "spark_bridge", "_source.py")
    cached = importlib.util.cache_from_source(source)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(cached)
    compile_package()
    assert os.path.getmtime(cached) >= os.path.getmtime(source)
