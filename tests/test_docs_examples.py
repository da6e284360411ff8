"""Every shell and Python example in README.md and docs/ runs as written, against a server
started the way README says (``kestrel-actors serve`` with its defaults: memcache 22133, text
2222, thrift 2229, admin 2223, ``./data``).

An example is a fenced block marked ``sh`` or ``python``. A block that cannot run here says so
in an HTML comment on the line before it, ``<!-- example: skip (why) -->``; the reasons are
listed by :func:`test_every_skipped_example_says_why`. Examples run in file order, each file
against a server whose queues were flushed first, with ``kestrel-actors`` on PATH and the
interpreter running the tests as ``python``/``python3``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kestrel_actors.client import Client

from .helpers import default_ports_held, listening

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PORTS = (22133, 2222, 2229, 2223)
_BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.S | re.M)
_SKIP = re.compile(r"<!-- example: skip \((.+?)\) -->\s*$")
# documents whose examples another test runs (it starts what they need: Spark, ZooKeeper)
_ELSEWHERE = {"docs/spark-bridge.md": "tests/bridge run these against a real Spark",
              "docs/benchmarks.md": "benchmarks, run by make bench"}


@dataclass(frozen=True)
class Example:
    document: str
    line: int
    language: str
    code: str
    skip: str | None

    def __str__(self) -> str:
        return f"{self.document}:{self.line}"


def examples() -> list[Example]:
    found: list[Example] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        document = str(path.relative_to(ROOT))
        text = path.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            skip = _SKIP.search(before)
            reason = skip.group(1) if skip else _ELSEWHERE.get(document)
            found.append(Example(document, line, match.group(1), match.group(2), reason))
    return found


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory):
    """``kestrel-actors serve`` as ``make run`` starts it, in a directory of its own (the
    default ports held against the other test worker's tests for the module's duration)."""
    with default_ports_held():
        yield from _serve_as_make_run(tmp_path_factory)


def _serve_as_make_run(tmp_path_factory):
    busy = [port for port in DEFAULT_PORTS if listening(port)]
    if busy:
        pytest.fail(f"the README's default ports are in use ({busy}): stop what holds them")
    cwd = tmp_path_factory.mktemp("readme")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    log = open(cwd / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "kestrel_actors.cli", "serve"], cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not all(listening(port) for port in DEFAULT_PORTS):
        assert proc.poll() is None and time.monotonic() < deadline, (cwd / "server.log").read_text()
        time.sleep(0.1)
    assert proc.poll() is None, (cwd / "server.log").read_text()  # the ports are ours, not another's
    yield cwd, env
    proc.terminate()
    proc.wait(30)
    log.close()


def _run(example: Example, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    shims = cwd / "bin"
    shims.mkdir(exist_ok=True)
    for name in ("python", "python3"):  # the examples' `python` is the one running the tests
        if not (shims / name).exists():
            (shims / name).symlink_to(sys.executable)
    env = {**env, "PATH": f"{shims}{os.pathsep}{env['PATH']}"}
    if shutil.which("kestrel-actors", path=env["PATH"]) is None:  # not installed as a script
        (shims / "kestrel-actors").write_text(f"#!/bin/sh\nexec {sys.executable} -m kestrel_actors.cli \"$@\"\n")
        (shims / "kestrel-actors").chmod(0o755)
    command = ["bash", "-e", "-o", "pipefail", "-c", example.code] if example.language == "sh" \
        else [sys.executable, "-c", example.code]
    return subprocess.run(command, cwd=cwd, env=env, input="y\n", capture_output=True, text=True,
                          timeout=120)


_RUNNABLE = [example for example in examples() if example.skip is None]


@pytest.mark.parametrize("example", _RUNNABLE, ids=str)
def test_example_runs_as_written(example, readme_server):
    cwd, env = readme_server
    with Client("127.0.0.1:22133") as client:
        for queue in ("jobs", "jobs_retry"):
            client.flush(queue)
        client.set_status("up")
    result = _run(example, cwd, env)
    assert result.returncode == 0, f"{example} failed:\n{example.code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def test_every_skipped_example_says_why():
    skipped = [example for example in examples() if example.skip is not None]
    assert all(example.skip.strip() for example in skipped)
    runnable_documents = {example.document for example in _RUNNABLE}
    assert "README.md" in runnable_documents  # the harness found the README's examples
    assert len(_RUNNABLE) >= 5
