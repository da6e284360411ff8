"""The command line as a newcomer meets it (issue 54): the load tests run on the serving install,
their summary speaks ops/s and milliseconds, every error is one line ``kestrel-actors COMMAND:
…`` in words, ``-h`` is help everywhere, exit codes say what happened, tables fit 80 columns,
and ``put`` spreads a long input over a pool."""

from __future__ import annotations

import configparser
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kestrel_actors.client import Client

from ..helpers import free_port, unique

ROOT = Path(__file__).resolve().parent.parent.parent
KESTREL = [sys.executable, "-m", "kestrel_actors.cli"]


def run(*args: str, stdin: bytes | str | None = None, columns: int | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([*KESTREL, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _load_extra_modules() -> list[str]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    requirements = setup["options.extras_require"]["load"].split()
    return [re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("-", "_")
            for requirement in requirements if not requirement.startswith("#")]


# kestrel-actors as it runs where only the serving install is (`make run`): the packages of the
# `load` extra cannot be imported
_WITHOUT_LOAD_EXTRA = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # import raises ModuleNotFoundError, find_spec answers None
sys.argv = ["kestrel-actors", *sys.argv[2:]]
from kestrel_actors.cli import main
main()
"""


def test_load_runs_on_the_serving_install_and_plot_names_its_extra(server, tmp_path):
    blocked = ",".join(_load_extra_modules())
    args = ["load", "put-many", "-n", "40", "-c", "2", "-b", "16", "-H", "127.0.0.1",
            "-p", str(server.port), "--progress"]
    done = subprocess.run([sys.executable, "-c", _WITHOUT_LOAD_EXTRA, blocked, *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["items"] == 40
    plot = subprocess.run([sys.executable, "-c", _WITHOUT_LOAD_EXTRA, blocked, *args,
                           "--plot", str(tmp_path / "run.png")], capture_output=True, text=True, timeout=120)
    assert plot.returncode == 2, plot.stderr
    assert plot.stderr.splitlines() == [
        "kestrel-actors load put-many: --plot needs matplotlib, the load extra: pip install '.[load]'"]


def test_load_summary_in_ops_and_ms_and_files(server, tmp_path):
    json_out, csv_out = tmp_path / "run.json", tmp_path / "run.csv"
    done = run("load", "put-many", "-n", "60", "-c", "3", "-b", "16", "-p", str(server.port), "--no-progress",
               "--json-out", str(json_out), "--csv", str(csv_out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    summary = next(line for line in lines if line.startswith("Summary:"))
    latency = next(line for line in lines if line.startswith("Latency (ms):"))
    assert "60 items" in summary and "ops/s" in summary
    assert re.fullmatch(r"Latency \(ms\): avg [\d.]+  p50 [\d.]+  p95 [\d.]+  p99 [\d.]+  max [\d.]+", latency)
    record = json.loads(lines[-1])
    assert json.loads(json_out.read_text()) == record
    with open(csv_out, newline="") as file:
        [row] = list(csv.DictReader(file))
    assert list(row) == ["scenario", "ok", "items", "seconds", "ops_per_sec", "avg_ms", "p50_ms", "p95_ms",
                         "p99_ms", "max_ms", "lost", "duplicated"]
    assert row["scenario"] == "put-many" and row["items"] == "60" and row["ok"] == "True"
    assert float(row["p50_ms"]) <= float(row["p95_ms"]) <= float(row["p99_ms"]) <= float(row["max_ms"])


def test_dash_h_is_help_under_load_too():
    for args in (["load", "-h"], ["load", "put-many", "-h"], ["put", "-h"], ["stats", "-h"]):
        shown = run(*args)
        assert shown.returncode == 0 and shown.stdout.startswith("Usage:"), (args, shown.stderr)


def _one_error_line(result: subprocess.CompletedProcess[str], command: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"kestrel-actors {command}: "), lines[0]
    assert not re.search(r"Error\(|Errno|Error:|Traceback", lines[0]), lines[0]
    return lines[0]


def test_every_error_is_one_line_naming_its_command_in_words():
    closed = free_port()
    got = run("get", "jobs", "-s", f"127.0.0.1:{closed}")
    assert got.returncode == 3
    assert _one_error_line(got, "get").endswith(f"cannot connect to 127.0.0.1:{closed}: connection refused")
    stats = run("stats", "--port", str(closed))
    assert stats.returncode == 3
    assert _one_error_line(stats, "stats").endswith("connection refused")
    pooled = run("stats", "-s", f"127.0.0.1:{closed}")
    assert pooled.returncode == 3
    assert _one_error_line(pooled, "stats").endswith("connection refused")


def test_a_bad_queue_name_is_refused_with_the_rule():
    for name in ("a/b", "has space", "x.y"):
        refused = run("put", name, stdin="x\n")
        assert refused.returncode == 2
        line = _one_error_line(refused, "put")
        assert "a queue name is 1 to 200 bytes, without spaces, control characters, '/', '.' or '~'" in line


def test_declined_flush_and_broken_pipe_have_their_own_exit_codes(module_server):
    queue = unique("first_hour")
    with Client(module_server.address) as client:
        assert client.put_many(queue, [b"a", b"b", b"c"]) == 3
        for answer in ("n\n", ""):  # no, and no answer at all
            declined = run("flush", queue, "-s", module_server.address, stdin=answer)
            assert declined.returncode == 5, declined.stderr  # not "1 nothing there"
            assert declined.stderr.strip().splitlines()[-1].startswith("kestrel-actors flush: not confirmed")
        assert client.peek(queue) == b"a"
        reader = subprocess.Popen([*KESTREL, "get", queue, "-n", "3", "-s", module_server.address],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        reader.stdout.close()
        assert reader.wait(60) == 141  # as a shell reports a writer SIGPIPE ended, not 1
        assert client.peek(queue) == b"a"  # the item it could not write is back at the head


def _table_cells(output: str) -> list[str]:
    return [cell.strip() for line in output.splitlines() for cell in re.split(r"[┃│]", line)[1:-1]]


def test_stats_fits_80_columns_and_shows_everything_at_160(make_server):
    server = make_server(admin_port=True)
    with Client(server.address) as client:
        client.put("first_hour_stats_queue", b"item")
    narrow = run("stats", "--port", str(server.admin_port), columns=80)
    assert narrow.returncode == 0, narrow.stderr
    assert "…" not in narrow.stdout and max(map(len, narrow.stdout.splitlines())) <= 80, narrow.stdout
    assert {"Queue", "Items", "Oldest", "first_hour_stats_queue"} <= set(_table_cells(narrow.stdout))
    wide = run("stats", "--port", str(server.admin_port), columns=160)
    assert "…" not in wide.stdout and "not shown" not in wide.stdout
    assert {"Queue", "Items", "Bytes", "Oldest", "Age", "In/s", "Out/s", "Open", "Waiters",
            "Journal"} <= set(_table_cells(wide.stdout)), wide.stdout

    pool = ["-s", server.address, "-s", f"127.0.0.1:{free_port()}"]
    narrow = run("stats", *pool, columns=80)
    assert narrow.returncode == 0, narrow.stderr
    assert "…" not in narrow.stdout and max(map(len, narrow.stdout.splitlines())) <= 80, narrow.stdout
    assert {"server", "items", "read set", "write set", server.address} <= set(_table_cells(narrow.stdout))
    wide = run("stats", *pool, columns=160)
    assert "…" not in wide.stdout and "not shown" not in wide.stdout
    assert {"server", "uptime", "items", "conns", "total items", "gets", "sets", "zk", "read set",
            "write set"} <= set(_table_cells(wide.stdout)), wide.stdout


@pytest.mark.slow
def test_put_spreads_a_long_input_over_the_pool(make_server):
    servers = [make_server() for _ in range(3)]
    pool = [arg for server in servers for arg in ("-s", server.address)]
    put = run("put", "spread", *pool, stdin="".join(f"{n}\n" for n in range(1, 1001)))
    assert put.returncode == 0, put.stderr
    counts = []
    for server in servers:
        with Client(server.address) as client:
            counts.append(client.queue_stats("spread")["items"])
    assert sum(counts) == 1000
    assert min(counts) >= 200, counts  # every server took its share, not one took all
