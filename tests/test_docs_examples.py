"""Every shell and Python example in README.md and docs/ runs as written, against a server
started the way README says (``kestrel-actors serve`` with its defaults: memcache 22133, text
2222, thrift 2229, admin 2223, ``./data``).

Every fenced block names its language (``text`` for transcripts and output). An example is a
block marked ``sh`` (or ``shell``, ``bash``) or ``python``. A block that cannot run here says so
in an HTML comment on the line before it, ``<!-- example: skip (why) -->``; the reasons are
listed by :func:`test_every_skipped_example_says_why`. Examples run in file order, each against
a server whose queues were flushed first.

A shell example runs in a fresh ``bash`` (``-e -o pipefail``) whose PATH is the machine's, not
the test's: only README's set-up block, marked ``<!-- example: setup -->`` (``source
.venv/bin/activate``), which runs first in each, makes ``kestrel-actors`` reachable, so an
example that only works with the venv already on PATH fails here as it would for a reader.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kestrel_actors.client import Client

from .helpers import DEFAULT_PORTS, default_ports_held, listening

ROOT = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)
_SHELLS = {"sh", "shell", "bash"}
_SKIP = re.compile(r"<!-- example: skip \((.+?)\) -->\s*$")
_SETUP = "<!-- example: setup -->"
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
    setup: bool = False

    def __str__(self) -> str:
        return f"{self.document}:{self.line}"


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _fences(path: Path) -> list[tuple[int, str, str, str]]:
    """Each fenced block of ``path``: its line, info string, code, and the line before it."""
    text = path.read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(1).strip(), match.group(2),
             text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1])
            for match in _FENCE.finditer(text)]


def examples() -> list[Example]:
    found: list[Example] = []
    for path in _documents():
        document = str(path.relative_to(ROOT))
        for line, info, code, before in _fences(path):
            language = "sh" if info in _SHELLS else info
            if language not in ("sh", "python"):
                continue
            skip = _SKIP.search(before)
            reason = skip.group(1) if skip else _ELSEWHERE.get(document)
            found.append(Example(document, line, language, code, reason, setup=_SETUP in before))
    return found


def _setup_code() -> str:
    """README's set-up block: what a reader runs in each new shell before the examples."""
    setups = [example for example in examples() if example.setup]
    assert len(setups) == 1 and setups[0].document == "README.md", setups
    return setups[0].code


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory):
    """``kestrel-actors serve`` as ``make run`` starts it, in a directory of its own (the
    default ports held against the other test worker's tests for the module's duration)."""
    with default_ports_held():
        yield from _serve_as_make_run(tmp_path_factory)


def _serve_as_make_run(tmp_path_factory):
    busy = [port for port in DEFAULT_PORTS if listening(port)]
    if busy:
        pytest.fail(f"the README's default ports are still in use after 5 minutes ({busy}): "
                    "stop what holds them")
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


def _venv_bin() -> Path:
    return Path(sys.executable).parent


def fresh_shell_env(cwd: Path) -> dict[str, str]:
    """A new login's environment for ``bash`` in ``cwd``: the machine's PATH without the venv
    running the tests, and ``cwd/.venv`` standing for the checkout's venv (the venv itself when
    the tests run in one, else a stand-in whose ``activate`` puts this interpreter on PATH)."""
    venv = cwd / ".venv"
    if not venv.exists():
        if (_venv_bin() / "activate").exists():
            venv.symlink_to(_venv_bin().parent)
        else:
            (venv / "bin").mkdir(parents=True)
            for name in ("python", "python3"):
                (venv / "bin" / name).symlink_to(sys.executable)
            (venv / "bin" / "kestrel-actors").write_text(
                f"#!/bin/sh\nexec {sys.executable} -m kestrel_actors.cli \"$@\"\n")
            (venv / "bin" / "kestrel-actors").chmod(0o755)
            (venv / "bin" / "activate").write_text(f'PATH="{venv / "bin"}:$PATH"\n')
    path = [entry for entry in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if entry and Path(entry).resolve() != _venv_bin().resolve()]
    env = {"PATH": os.pathsep.join(path), "HOME": os.environ.get("HOME", str(cwd)),
           "LANG": os.environ.get("LANG", "C.UTF-8"), "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
    # the checkout under test first, as in the test's own processes (an editable install of
    # another checkout would otherwise answer)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def _run(example: Example, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if example.language == "sh":
        code = example.code if example.setup else f"{_setup_code()}\n{example.code}"
        command = ["bash", "-e", "-o", "pipefail", "-c", code]
        env = fresh_shell_env(cwd)
    else:
        command = [sys.executable, "-c", example.code]
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
    assert result.returncode == 0, (
        f"{example} failed:\n{example.code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")


def test_every_skipped_example_says_why():
    skipped = [example for example in examples() if example.skip is not None]
    assert all(example.skip.strip() for example in skipped)
    runnable_documents = {example.document for example in _RUNNABLE}
    assert "README.md" in runnable_documents  # the harness found the README's examples
    assert len(_RUNNABLE) >= 5
    assert any(example.language == "sh" and example.document == "README.md" for example in _RUNNABLE)


def test_every_block_names_its_language():
    """A bare fence hides a shell example from this test: each says what it is (``text`` for
    transcripts), so that every ``sh`` block is either run or skipped with a reason."""
    bare = [f"{path.relative_to(ROOT)}:{line}" for path in _documents() for line, info, _, _ in _fences(path)
            if not info and str(path.relative_to(ROOT)) not in _ELSEWHERE]
    assert not bare, f"fenced blocks without a language: {bare}"


def test_readme_setup_makes_the_command_reachable(tmp_path):
    """README's set-up, in a fresh shell, is all it takes for ``kestrel-actors`` to run."""
    env = fresh_shell_env(tmp_path)
    bare = subprocess.run(["bash", "-c", "kestrel-actors --version"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 127, "the fresh shell should not have the venv on PATH"
    result = subprocess.run(["bash", "-e", "-c", f"{_setup_code()}\nkestrel-actors --version"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "version" in result.stdout


def test_no_example_waits_on_an_open_nc():
    """``printf 'status readonly\\r\\n' | nc host 22133`` never exits: the server keeps the
    connection open after its answer, and nc (without -q/-N) waits for it to close."""
    waiting = []
    for path in _documents():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for pipe in re.finditer(r"printf '([^']*)' \| nc( -[qN]\S*)?", line):
                if pipe.group(2) is None and "quit" not in pipe.group(1):
                    waiting.append(f"{path.relative_to(ROOT)}:{number}: {pipe.group(0)}")
    assert not waiting, waiting


def test_readme_says_what_confirm_answers(readme_server):
    """README's ``monitor jobs 1 100`` line and the server agree on ``confirm``: more than came
    answers ``ERROR`` and confirms nothing (Kestrel's rule, behaviour §2.7)."""
    [line] = [line for line in (ROOT / "README.md").read_text().splitlines() if "monitor jobs 1 100" in line]
    with Client("127.0.0.1:22133") as client:
        client.flush("jobs")
        assert client.put_many("jobs", [b"a", b"b"]) == 2
        conn = client.connection()
        try:
            conn.send(b"monitor jobs 1 100\r\n")
            assert conn.read_values(b"jobs", 100) == [b"a", b"b"]
            conn.send(b"confirm jobs 100\r\n")
            assert conn.read_line() == b"ERROR"
            conn.send(b"confirm jobs 2\r\n")
            assert conn.read_line() == b"END"
        finally:
            conn.close()
    assert "ERROR" in line and "confirm jobs 100 confirms them" not in line, line


def _endpoint_stem(path: str) -> str:
    path = path.split("?", 1)[0]
    for suffix in (".json", ".txt"):
        if path.endswith(suffix) and path != "/queue.json":
            return path[: -len(suffix)]
    return path


def test_admin_doc_lists_every_endpoint():
    """docs/admin.md's endpoint table has a row for every path the admin port answers."""
    from kestrel_actors.admin import AdminApp

    app = AdminApp(None, None)
    try:
        served = {_endpoint_stem(path) for path in app.routes}
    finally:
        app.close()
    text = (ROOT / "docs" / "admin.md").read_text()
    table = text[text.index("| endpoint | what |"):].split("\n\n", 1)[0]
    documented = {_endpoint_stem(path) for row in table.splitlines()
                  for path in re.findall(r"`(/[^`]*)`", row.split("|")[1])}
    assert served <= documented, f"not in docs/admin.md's table: {sorted(served - documented)}"


def test_spark_doc_says_what_spark_needs():
    """docs/spark-bridge.md names Java 17 and the extra that installs pyspark (setup.cfg's)."""
    import configparser

    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert "pyspark" in setup["options.extras_require"]["spark"]
    text = (ROOT / "docs" / "spark-bridge.md").read_text()
    assert "Java 17" in text and "pip install '.[spark]'" in text
