"""The admin endpoints that act: /shutdown, /quiesce and /reload (POST with X-Kestrel-Admin), on a
real server process."""

from __future__ import annotations

import socket
import time

from ..helpers import ServerProcess, act, act_json, get_json


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
    except OSError:
        return True
    return False


def test_shutdown_stops_the_server_and_keeps_the_data(tmp_path):
    server = ServerProcess(tmp_path / "data", admin_port=True).start()
    try:
        client = server.client()
        assert client.set("kept", b"durable") == b"STORED"
        assert act_json(server.admin_url + "/shutdown") == {"response": "ok"}
        assert server.proc.wait(timeout=15) == 0
        assert '"shutdown requested on the admin port"' in server.log()
        server.start()
        assert server.client().get("kept") == b"durable"
    finally:
        server.stop()


def test_shutdown_by_post(admin_server):
    reply = act(admin_server.admin_url + "/shutdown.txt")
    assert (reply.status, reply.body) == (200, b"response: ok\n")
    assert admin_server.proc.wait(timeout=15) == 0


def test_quiesce_refuses_new_clients_serves_the_connected_and_ends_when_they_leave(admin_server):
    client = admin_server.client()
    assert client.set("work", b"one") == b"STORED"
    assert act_json(admin_server.admin_url + "/quiesce") == {"response": "ok"}
    deadline = time.monotonic() + 5
    while not refused(admin_server.host, admin_server.port):
        assert time.monotonic() < deadline, "still accepting clients after /quiesce"
        time.sleep(0.05)
    assert client.get("work") == b"one"  # the connected client is still served
    assert client.set("work", b"two") == b"STORED"
    assert admin_server.proc.poll() is None
    client.close()
    assert admin_server.proc.wait(timeout=15) == 0


def test_reload_rereads_the_configuration(tmp_path, make_admin_server):
    config = tmp_path / "kestrel.toml"
    config.write_text("[queues.jobs]\nmax_items = 2\n")
    server = make_admin_server("--config", str(config))
    client = server.client()
    client.set("jobs", b"a")
    assert get_json(server.admin_url + "/stats.json")["gauges"]["q/jobs/max_items"] == 2
    config.write_text("[queues.jobs]\nmax_items = 5\n")
    assert act_json(server.admin_url + "/reload") == {"response": "ok"}
    assert get_json(server.admin_url + "/stats.json")["gauges"]["q/jobs/max_items"] == 5
    for data in (b"b", b"c", b"d", b"e"):
        assert client.set("jobs", data) == b"STORED"
    assert client.set("jobs", b"f") == b"NOT_STORED"  # the new limit is enforced


def test_reload_of_a_broken_file_keeps_the_running_configuration(tmp_path, make_admin_server):
    config = tmp_path / "kestrel.toml"
    config.write_text("[queues.jobs]\nmax_items = 2\n")
    server = make_admin_server("--config", str(config))
    server.client().set("jobs", b"a")
    config.write_text("[queues.jobs]\nmax_items = \n")
    reply = act(server.admin_url + "/reload")  # the reason (issue 21.6)
    assert reply.status == 500 and reply.json()["error"].startswith("config not reloaded: "), reply
    assert get_json(server.admin_url + "/stats.json")["gauges"]["q/jobs/max_items"] == 2
    assert server.proc.poll() is None
