"""What a newcomer installs: ``pip install .`` brings the server, the client and the CLI and
nothing of Spark, and serves; ``make run`` passes on the ports it is given."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kestrel_actors.client import Client

from ..helpers import free_port, listening, stop_process_group

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_pip_install_dot_serves_without_the_extras(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # pure Python (KESTREL_ACTORS_MYPYC=0): compiling takes minutes; make test's `pip install -e`
    # builds the compiled modules, and tests/test_compiled_build.py checks that they run (ADR 0015)
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", str(ROOT)],
                               env={**os.environ, "KESTREL_ACTORS_MYPYC": "0"},
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, timeout=120, check=True).stdout.lower()
    for extra in ("pyspark", "pyarrow", "pandas", "matplotlib", "pytest"):  # tqdm serves the load tests
        assert f"\n{extra}==" not in f"\n{listed}", f"{extra} came with a plain install"
    port = free_port()
    # from outside the repository, so that the installed package is the one that runs
    server = subprocess.Popen([str(venv / "bin" / "kestrel-actors"), "serve", "--port", str(port),
                               "--text-port", "0", "--thrift-port", "0", "--admin-port", "0",
                               "--data-dir", str(tmp_path / "data")],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        deadline = time.monotonic() + 60
        while not listening(port):
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        put = subprocess.run([str(venv / "bin" / "kestrel-actors"), "put", "jobs", "-s", f"127.0.0.1:{port}"],
                             input=b"hello\n", timeout=60, cwd=tmp_path)
        assert put.returncode == 0
        with Client(f"127.0.0.1:{port}") as client:
            assert client.get("jobs") == b"hello"
    finally:
        server.terminate()
        server.wait(30)


def test_make_run_takes_every_port_and_a_config_file(tmp_path):
    if not (ROOT / ".venv" / ".installed-serve").exists():
        pytest.skip("make run's venv is not installed here (make test installs it)")
    ports = {name: free_port() for name in ("PORT", "TEXT_PORT", "THRIFT_PORT", "ADMIN_PORT")}
    config = tmp_path / "kestrel.toml"
    config.write_text('[queues."capped"]\nmax_items = 1\n')
    log_path = tmp_path / "make-run.log"
    with open(log_path, "wb") as log:
        make = subprocess.Popen(["make", "-s", "-C", str(ROOT), "run", *(f"{k}={v}" for k, v in ports.items()),
                                 f"DATA_DIR={tmp_path / 'data'}", f"CONFIG={config}"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not all(listening(port) for port in ports.values()):
            assert make.poll() is None and time.monotonic() < deadline, "make run did not listen on every port"
            time.sleep(0.1)
        with Client(f"127.0.0.1:{ports['PORT']}") as client:
            assert client.put("capped", b"one")
            assert not client.put("capped", b"two")  # the config file's max_items stands
        assert (tmp_path / "data" / "capped").exists()
    except BaseException:
        print(log_path.read_text(errors="replace")[-4000:])  # the server's log, in pytest's report
        raise
    finally:
        stop_process_group(make)
