"""What third-party memcache clients do against the server: the facts that docs/protocols.md's
"Third-party memcache clients" section states, measured here (pymemcache, python-memcached,
pylibmc, libmemcached's tools, node's memcached)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kestrel_actors.client import Client

from ..helpers import PATIENCE


def queue_items(server, queue: str) -> int:
    with Client(server.address) as client:
        return client.queue_stats(queue).get("items", 0)


# -- pymemcache --------------------------------------------------------------------------------


def test_pymemcache_plain_use(module_server):
    base = pytest.importorskip("pymemcache.client.base")
    client = base.Client((module_server.host, module_server.port), default_noreply=False, timeout=PATIENCE)
    try:
        assert client.set("pm", b"a") is True and client.set("pm", b"b") is True
        assert client.get("pm") == b"a"
        assert client.version() == b"2.4.7"
        assert client.stats()[b"queue_pm_items"] == 1
        assert client.get_many(["pm", "other"]) == {"pm": b"b"}  # only the first key is read
        assert client.delete("pm") is True
    finally:
        client.close()


def test_pymemcache_default_noreply_desynchronises(module_server):
    base = pytest.importorskip("pymemcache.client.base")
    client = base.Client((module_server.host, module_server.port), timeout=PATIENCE)  # noreply=True
    try:
        assert client.set("pm_noreply", b"x") is True  # sent without reading STORED
        with pytest.raises(Exception, match="STORED"):
            client.get("pm_noreply")  # reads the STORED left over
    finally:
        client.close()


def test_pymemcache_get_with_options_raises_after_the_item_was_removed(module_server):
    base = pytest.importorskip("pymemcache.client.base")
    client = base.Client((module_server.host, module_server.port), default_noreply=False, timeout=PATIENCE)
    try:
        assert client.set("pm_opt", b"lost")
        with pytest.raises(KeyError):
            client.get("pm_opt/t=100")  # the reply is VALUE pm_opt, keyed without the options
        assert queue_items(module_server, "pm_opt") == 0  # the server removed it: it is lost
        assert client.gets("pm_opt") == (None, None)
        assert client.flush_all() is False  # Kestrel answers "Flushed all queues."
    finally:
        client.close()


def test_pymemcache_timeout_must_exceed_the_wait(module_server):
    base = pytest.importorskip("pymemcache.client.base")
    short = base.Client((module_server.host, module_server.port), default_noreply=False, timeout=0.5)
    try:
        with pytest.raises(TimeoutError):
            short.get("pm_wait/t=1500")  # an empty queue answers END after 1.5 s: too late
    finally:
        short.close()
    assert base.Client((module_server.host, module_server.port)).timeout is None  # its default
    patient = base.Client((module_server.host, module_server.port), default_noreply=False, timeout=PATIENCE)
    try:
        start = time.monotonic()
        assert patient.get("pm_wait/t=1500") is None and time.monotonic() - start >= 1.4
    finally:
        patient.close()


# -- python-memcached --------------------------------------------------------------------------


def test_python_memcached_blocking_and_reliable_reads(module_server):
    memcache = pytest.importorskip("memcache")
    client = memcache.Client([module_server.address], socket_timeout=PATIENCE)
    assert client.set("pym", b"a") and client.set("pym", b"b")
    assert client.get("pym/open") == b"a"
    assert client.get("pym/close") is None
    assert client.get("pym/t=500") == b"b"
    assert client.get_stats()[0][1]["queue_pym_items"] == "0"
    client.disconnect_all()


def test_python_memcached_wait_longer_than_its_socket_timeout_marks_the_server_dead(module_server):
    memcache = pytest.importorskip("memcache")
    short = memcache.Client([module_server.address], socket_timeout=0.5)
    assert short.get("pym_wait/t=1500") is None  # gave up after 0.5 s ...
    assert not short.set("pym_wait", b"x")  # ... and now treats the server as dead
    long = memcache.Client([module_server.address], socket_timeout=PATIENCE)
    start = time.monotonic()
    assert long.get("pym_wait/t=1500") is None and time.monotonic() - start >= 1.4
    assert long.set("pym_wait", b"x")


# -- pylibmc -----------------------------------------------------------------------------------


def test_pylibmc_works_but_its_stats_drop_the_queue_keys(module_server):
    pylibmc = pytest.importorskip("pylibmc")
    client = pylibmc.Client([module_server.address])
    assert client.set("plm", b"a") and client.set("plm", b"b")
    assert client.get("plm/open") == b"a"
    assert client.get("plm/close") is None
    assert client.get("plm") == b"b"
    stats = client.get_stats()[0][1]
    assert stats["version"] in ("2.4.7", b"2.4.7")
    assert not any(str(name).startswith(("queue_", "b'queue_")) for name in stats)
    assert queue_items(module_server, "plm") == 0


def test_pylibmc_poll_timeout_must_exceed_the_wait(module_server):
    pylibmc = pytest.importorskip("pylibmc")
    short = pylibmc.Client([module_server.address], behaviors={"_poll_timeout": 500})
    assert short.get("plm_wait/t=1500") is None  # a miss after 0.5 s ...
    with pytest.raises(pylibmc.Error, match="DISABLED"):
        short.set("plm_wait", b"x")  # ... and the server is disabled for a while
    patient = pylibmc.Client([module_server.address], behaviors={"_poll_timeout": int(PATIENCE * 1000)})
    assert patient.get("plm_wait/t=1500") is None
    assert patient.set("plm_wait", b"x")


# -- libmemcached's command-line tools (Debian's libmemcached-tools, installed by make test) ------


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (make test installs libmemcached-tools)")
    return path


def test_memcstat(module_server):
    with Client(module_server.address) as client:
        assert client.put("mstat", b"x")
    proc = subprocess.run([tool("memcstat"), f"--servers={module_server.address}"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "version: 2.4.7" in proc.stdout and "curr_items:" in proc.stdout
    assert "queue_mstat_items: 1" in proc.stdout  # the per-queue stats are printed too
    version = subprocess.run([tool("memcstat"), "--server-version", f"--servers={module_server.address}"],
                             capture_output=True, text=True, timeout=30)
    # it prints to stderr
    assert version.returncode == 0 and version.stderr.split() == [module_server.address, "2.4.7"]


def test_memcping(module_server):
    proc = subprocess.run([tool("memcping"), f"--servers={module_server.address}"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_memcdump_fails(module_server):
    """memcdump asks for ``stats cachedump``, which Kestrel does not have (docs/protocols.md's table)."""
    proc = subprocess.run([tool("memcdump"), f"--servers={module_server.address}"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "Failed to dump keys" in proc.stdout + proc.stderr


# -- gets and flush_all: what docs/protocols.md's table warns about -----------------------------------------


def test_gets_removes_the_item_then_fails_in_pymemcache_and_python_memcached(module_server):
    """Kestrel's ``gets`` is ``get`` (behaviour §2.3): the server removes the item and answers a
    VALUE line without a cas field, which both clients fail to parse: the item is lost."""
    base = pytest.importorskip("pymemcache.client.base")
    memcache = pytest.importorskip("memcache")
    client = base.Client((module_server.host, module_server.port), default_noreply=False, timeout=PATIENCE)
    try:
        assert client.set("gets_pm", b"x")
        with pytest.raises(ValueError):
            client.gets("gets_pm")
    finally:
        client.close()
    assert queue_items(module_server, "gets_pm") == 0
    other = memcache.Client([module_server.address], socket_timeout=PATIENCE)
    assert other.set("gets_pym", b"x")
    with pytest.raises(ValueError):
        other.gets("gets_pym")
    other.disconnect_all()
    assert queue_items(module_server, "gets_pym") == 0


def test_pylibmc_refuses_gets_before_sending_it(module_server):
    pylibmc = pytest.importorskip("pylibmc")
    client = pylibmc.Client([module_server.address])
    assert client.set("gets_plm", b"x")
    with pytest.raises(ValueError, match="cas"):
        client.gets("gets_plm")
    assert queue_items(module_server, "gets_plm") == 1  # nothing was sent: the item stays


def test_flush_all_flushes_but_every_client_reports_a_failure(server):
    """Kestrel answers ``Flushed all queues.``, where memcached answers ``OK``: the queues are
    flushed, and each client takes the answer for a failure in its own way."""
    base = pytest.importorskip("pymemcache.client.base")
    memcache = pytest.importorskip("memcache")
    pylibmc = pytest.importorskip("pylibmc")

    def fill() -> None:
        with Client(server.address) as client:
            assert client.put("fa", b"x")

    fill()
    pm = base.Client((server.host, server.port), default_noreply=False, timeout=PATIENCE)
    try:
        assert pm.flush_all() is False
    finally:
        pm.close()
    assert queue_items(server, "fa") == 0
    fill()
    pym = memcache.Client([server.address], socket_timeout=PATIENCE)
    assert pym.flush_all() is None  # it returns nothing, whatever the answer
    pym.disconnect_all()
    assert queue_items(server, "fa") == 0
    fill()
    plm = pylibmc.Client([server.address])
    with pytest.raises(pylibmc.Error, match="flush_all"):
        plm.flush_all()
    with pytest.raises(pylibmc.Error, match="DISABLED"):
        plm.set("fa", b"y")  # and the server is disabled until its retry time
    assert queue_items(server, "fa") == 0


# -- node's memcached 2.2.2 (npm; make test installs it into .venv/node_modules) -----------------

NODE_MODULES = Path(__file__).resolve().parents[2] / ".venv" / "node_modules"

NODE_SCRIPT = r"""
const Memcached = require('memcached');
const m = new Memcached(process.argv[2], {timeout: 2000, retries: 0});
const out = {};
m.version((err, v) => {
  out.version = err ? String(err) : v[0].version;
  m.set('node_q', 'hello', 0, (err, ok) => {
    out.set = ok;
    m.get('node_q', (err, data) => {
      out.get = data;
      m.set('node_q', 'again', 0, () => {
        const done = () => { console.log(JSON.stringify(out)); process.exit(0); };
        const timer = setTimeout(() => { out.flush = 'no answer'; done(); }, 3000);
        m.flush((err, res) => { clearTimeout(timer); out.flush = err ? String(err) : res; done(); });
      });
    });
  });
});
"""


def test_node_memcached(server, tmp_path):
    node = shutil.which("node")
    if node is None or not (NODE_MODULES / "memcached").is_dir():
        pytest.skip("node's memcached is not installed (make test installs it)")
    script = tmp_path / "client.js"
    script.write_text(NODE_SCRIPT)
    proc = subprocess.run([node, str(script), server.address], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NODE_PATH": str(NODE_MODULES)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["version"] == "2.4.7" and result["set"] is True and result["get"] == "hello"
    assert result["flush"] == "no answer"  # flush() never calls back ...
    assert queue_items(server, "node_q") == 0  # ... though the server flushed
