"""The compiled build (ADR 0015): which modules run compiled, the switch that runs the pure-Python
source instead, and the guard that keeps a build older than its source out of use.

Each case imports the package in a fresh interpreter: the guard decides once, at import.
``make test`` sets ``KESTREL_ACTORS_EXPECT_COMPILED=1``: there the build must be in use; and
``KESTREL_ACTORS_EXPECT_PROFILE=1`` unless run with ``PGO=0``: there it must be profile-guided.
"""

from __future__ import annotations

import ast
import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kestrel_actors
from kestrel_actors._compiled import COMPILED_MODULES, PROFILE_MARKER, PURE_ENV

from .helpers import ServerProcess, request, wait_for

PACKAGE = Path(kestrel_actors.__file__).parent
SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)
BUILT = any(path.name.endswith(SUFFIXES) for path in PACKAGE.rglob("*.so"))
needs_build = pytest.mark.skipif(not BUILT, reason="a pure install: nothing compiled here")

PROBE = (
    "import importlib, json\n"
    "from kestrel_actors._compiled import COMPILED_MODULES, compiled_state, profile_guided\n"
    "files = [importlib.import_module(name).__file__ for name in COMPILED_MODULES]\n"
    "print(json.dumps({'state': compiled_state(), 'files': files, 'profile_guided': profile_guided()}))\n"
)


def probe_answer(pythonpath: Path, **env: str) -> tuple[dict, str]:
    """Import every compiled module in a fresh interpreter: PROBE's answer, and stderr."""
    clean = {name: value for name, value in os.environ.items() if name != PURE_ENV}
    # in ``pythonpath``: ``python -c`` puts the working directory first on the path
    done = subprocess.run([sys.executable, "-c", PROBE], env={**clean, "PYTHONPATH": str(pythonpath), **env},
                          cwd=pythonpath, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout), done.stderr


def probe(pythonpath: Path, **env: str) -> tuple[str, list[str], str]:
    """The guard's state, the compiled modules' files, stderr."""
    answer, stderr = probe_answer(pythonpath, **env)
    return answer["state"], answer["files"], stderr


def test_the_list_names_modules_that_exist():
    for name in COMPILED_MODULES:
        assert (PACKAGE.parent / (name.replace(".", "/") + ".py")).is_file(), name


@needs_build
def test_the_whole_set_runs_compiled_or_none_of_it():
    state, files, _ = probe(PACKAGE.parent)
    compiled = [file.endswith(SUFFIXES) for file in files]
    assert all(compiled) if state == "mypyc" else not any(compiled), (state, files)
    if os.environ.get("KESTREL_ACTORS_EXPECT_COMPILED") == "1":
        assert state == "mypyc", "make test must run the compiled build: rebuild it"


@needs_build
def test_the_build_says_whether_it_is_profile_guided():
    answer, _ = probe_answer(PACKAGE.parent)
    guided = answer["profile_guided"]
    assert guided == (answer["state"] == "mypyc" and (PACKAGE / PROFILE_MARKER).is_file())
    if os.environ.get("KESTREL_ACTORS_EXPECT_PROFILE") == "1":
        assert guided, "make test (PGO=1) must run the profile-guided build: rebuild it (make compiled)"


@needs_build
def test_the_pure_switch_imports_every_compiled_module_from_its_source():
    state, files, stderr = probe(PACKAGE.parent, **{PURE_ENV: "1"})
    assert state == f"no ({PURE_ENV}=1)"
    assert all(file.endswith(".py") for file in files), files
    assert stderr == ""


@needs_build
def test_a_source_newer_than_its_build_sends_the_whole_set_back_to_pure_python(tmp_path):
    copy = tmp_path / "kestrel_actors"
    # keeps file times; the group's shared library is inside the package (setup.py's group_name)
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    # the copy's build made newer than its sources, whether or not this checkout's own build is
    # (a source edited since `make compiled` must not fail this test of the staleness check)
    built = time.time() + 30
    for library in copy.rglob("*.so"):
        os.utime(library, (built, built))
    state, files, stderr = probe(tmp_path)
    assert state == "mypyc" and all(file.startswith(str(copy)) and file.endswith(SUFFIXES) for file in files)

    edited = copy / "queue" / "_rules.py"
    later = time.time() + 60
    os.utime(edited, (later, later))
    state, files, stderr = probe(tmp_path)
    assert state == "no (stale build)"
    assert all(file.startswith(str(copy)) and file.endswith(".py") for file in files), files
    assert stderr.count("\n") == 1 and "kestrel_actors.queue._rules" in stderr, stderr


def test_the_server_says_whether_it_runs_compiled(tmp_path):
    same_switch = {PURE_ENV: os.environ[PURE_ENV]} if PURE_ENV in os.environ else {}  # as the server has it
    answer, _ = probe_answer(PACKAGE.parent, **same_switch)
    expected, guided = answer["state"], answer["profile_guided"]
    server = ServerProcess(tmp_path / "data").start()

    def listening_lines() -> list[dict]:
        return [json.loads(line) for line in server.log().splitlines()
                if '"listening"' in line and '"memcache"' in line]

    try:
        # the port accepts a moment before its log line is written: wait for the line
        wait_for(lambda: bool(listening_lines()), timeout=10)
        listening = listening_lines()
    finally:
        server.stop()
    assert [(line["compiled"], line["profile_guided"]) for line in listening] == [(expected, guided)]


def test_the_server_names_a_fall_back_to_pure_python_in_health_and_the_page(tmp_path, monkeypatch):
    """A build older than an edited module runs pure Python (above); beside the one stderr line,
    ``/health``'s body and the admin page name it. The build here is a copy of the source with an
    empty extension file for each compiled module: the guard only compares file times, and a
    stale build's extensions are never loaded."""
    copy = tmp_path / "kestrel_actors"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", PROFILE_MARKER))
    for name in COMPILED_MODULES:
        copy.joinpath(*name.split(".")[1:-1], name.rsplit(".", 1)[1] + SUFFIXES[0]).touch()
    edited = copy / "queue" / "_rules.py"
    later = time.time() + 60
    os.utime(edited, (later, later))
    monkeypatch.delenv(PURE_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # ``python -m`` puts the working directory first on the path
    server = ServerProcess(tmp_path / "data", admin_port=True).start()
    try:
        health = request(f"http://127.0.0.1:{server.admin_port}/health")
        page = request(f"http://127.0.0.1:{server.admin_port}/")
    finally:
        server.stop()
    said = "pure-python (compiled build stale: kestrel_actors/queue/_rules.py newer)"
    assert health[:3] == (200, "text/plain; charset=utf-8", f"ok\nbuild: {said}\n".encode())
    assert page.status == 200 and f'<div id="build">build: {said}</div>'.encode() in page.body
    listening = [json.loads(line) for line in server.log().splitlines()
                 if '"listening"' in line and '"memcache"' in line]
    assert [line["compiled"] for line in listening] == ["no (stale build)"]


def test_setup_py_calls_no_private_member_of_setuptools_or_distutils():
    """The build uses setuptools' and distutils' public API only: no ``_name`` reached on another
    object (such as a compiler's ``_compile``) and no import from a private module."""
    tree = ast.parse((PACKAGE.parent / "setup.py").read_text())
    private = [f"line {node.lineno}: .{node.attr}" for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")]
    private += [f"line {node.lineno}: from {node.module}" for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)
                and any(part.startswith("_") and not part.startswith("__") for part in (node.module or "").split("."))]
    assert private == []


def probe_compiled(code: str) -> dict:
    """Run ``code`` (which prints JSON with the guard's ``state``) in a fresh interpreter on this
    checkout; the test is skipped unless the compiled build is in use there."""
    clean = {name: value for name, value in os.environ.items() if name != PURE_ENV}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, "PYTHONPATH": str(PACKAGE.parent)},
                          cwd=PACKAGE.parent, capture_output=True, text=True, timeout=120, check=True)
    answer: dict = json.loads(done.stdout)
    if answer["state"] != "mypyc":
        pytest.skip(f"the build is not in use here: {answer['state']}")
    return answer


ONCE_PER_CONNECTION_DATACLASSES = {
    "kestrel_actors.session._context": {"Reload", "SessionContext"},
    "kestrel_actors.session._actor": {"_Answered", "MonitorState"},
    "kestrel_actors.messages._session_queue": {"Session", "CancelWaits"},
}
"""The dataclasses the compiled modules may keep: made once per connection, queue or monitor."""

INIT_PROBE = (
    "import importlib, json, types\n"
    "from kestrel_actors._compiled import COMPILED_MODULES, compiled_state\n"
    "found = []\n"
    "for name in COMPILED_MODULES:\n"
    "    for key, cls in vars(importlib.import_module(name)).items():\n"
    "        init = cls.__dict__.get('__init__') if isinstance(cls, type) and cls.__module__ == name else None\n"
    "        if isinstance(init, types.FunctionType) and init.__code__.co_filename == '<string>':\n"
    "            found.append([name, key])\n"
    "print(json.dumps({'state': compiled_state(), 'found': found}))\n"
)


@needs_build
def test_no_record_made_per_request_runs_an_interpreted_dataclass_init():
    """mypyc compiles a dataclass's class but not the ``__init__`` the dataclasses module
    generates (its code comes from ``<string>``): made per request, such a record runs
    interpreted Python on the request path. Only the listed once-per-connection ones may."""
    answer = probe_compiled(INIT_PROBE)
    allowed = {(module, name) for module, names in ONCE_PER_CONNECTION_DATACLASSES.items() for name in names}
    assert {tuple(pair) for pair in answer["found"]} <= allowed


GROUP_PROBE = (
    "import importlib, json, sys\n"
    "from kestrel_actors._compiled import COMPILED_MODULES, compiled_state\n"
    "for name in COMPILED_MODULES:\n"
    "    importlib.import_module(name)\n"
    "groups = [name for name in sys.modules if name.endswith('__mypyc')]\n"
    "print(json.dumps({'state': compiled_state(), 'groups': groups}))\n"
)

REQUEST_PATH = {
    # name: what it may still look up by name, and why
    "SessionActor.on_receive": set(),
    "SessionActor._pump": set(),
    "SessionActor._start_batch": set(),
    "MemcacheHandler.queue_of": set(),
    "SessionActor._batch_done": set(),
    "SessionActor._answer": set(),
    "SessionActor._compile_rest": set(),
    "MemcacheHandler.joins": {"QUEUE_KINDS", "queue"},  # a follower neither a GET nor a SET
    "SessionActor._flush": set(),
    "SessionActor._write_refusal": set(),
    "MemcacheHandler.compile": {"max_open_transactions"},  # the config: an interpreted dataclass
    "MemcacheHandler.reply": set(),
    "MemcacheHandler.creates": set(),
    "SessionContext.writes_allowed": set(),
    "SessionContext.reads_allowed": set(),
    "QueueActor._run": {"deadline"},  # a fetch's deadline: one of five operation classes
    "QueueActor._add": set(),
    "QueueActor._send_replies": {"send", "fail"},  # bound methods handed over
    "_HeldReplies.send": set(),
    "_tell_answer": {"to"},  # a fanout copy's ack (CopyDone: interpreted); a batch's answer natively
    "bucket_index": set(),
    "QueueCore.add": set(),
    "QueueCore.remove": set(),
    "Dispatcher._run": {"switch"},  # gevent's hub
    "Dispatcher.tell_from_hub": {"loop", "pendingcnt"},
    "GeventRef.tell": {" not found"},  # the message of a tell to a stopped actor
    "record_batch": set(),
    "SessionActor.fetch": set(),
    # an except clause's class; the idle timer's loop (gevent's), when an idle timeout is set
    "SocketTransport._readable": {"BlockingIOError", "loop", "now"},
    "SocketTransport._account": set(),
    # a connection's set-up reads no config value (read once per server: ``Connections``); the
    # handler's class attribute, the link's bound methods handed to the transport, a closed
    # socket's close and the two log calls (refused, debug) remain
    "Connections._open": {"ANSWERS_AFTER_FIN", "hang_up", "input_end", "close", "warning", "debug"},
    # a reply (a lone GET hit's from 8 KiB as its parts): an except clause's class, a closed connection's error
    "SocketTransport.sendall": {"BlockingIOError", "EBADF"},
    "SocketTransport.send_parts": {"BlockingIOError", "EBADF"},
    "SocketTransport._drop_sent": {"nbytes"},  # the unsent rest of a part, a memoryview (rare)
    # heapify when compacting, and the heap's tie-breaking count, for a deadline out of order
    "WaitList.park": {"heapify", "next"},
    "WaitList.oldest": set(),
    "WaitList.remove": set(),
    "QueueActor._wake_one": set(),
    "_Mailbox.enqueue": set(),
    "_ToSession.hand_over": set(),  # a read's commands, handed to the dispatcher
    "Dispatcher.deliver": {"run_callback", "_run_on_hub"},  # a burst's callback (gevent's loop)
    "Dispatcher._run_on_hub": set(),
    "runs_off_hub": set(),
    "FileJournal.rotation_due": set(),
    "QueueActor.may_run_on_hub": set(),
    # a connection's repeated request line; a new one is split into tokens (bytes methods)
    "MemcacheDecoder._decode": {"lower", "split"},
    "line_at": set(),
    "FileJournal.add": set(),
    "AddRecords.header": set(),
    "JournalWriter.append_record": set(),
    "QueueCore._pop_head": set(),
    "PackedItems.append": set(),
    "PackedItems.popleft": set(),
    "PackedItems.head": set(),
    "PackedItems._take_packed": set(),
    "PackedItems._drop_first": set(),
    # a pipelined burst's run of GETs (ADR 0021)
    "PackedItems.pop_run": set(),
    "QueueCore._count_out": set(),
    "FileJournal.remove": set(),
    # its leader (a Protocol: the journal, or a replay), asked only at the end of a run of records
    "ReadBehindReader.next_item": {"flush", "name", "size", "written_size"},
    "_unpack": set(),
    "ValueReplies.reply": set(),
    "Histogram.add": set(),
    "HeldMemory.moved": set(),
    # a monitor stream's items opened, sent and confirmed (the Spark source's server work, ADR 0022)
    "SessionActor._monitor_step": set(),
    "MemcacheHandler.add_item_replies": set(),
    "ValueReplies.add_stream_parts": set(),
    "_footprint": {"obj"},  # what a memoryview (an unsent rest, rare) keeps alive
    "QueueCore.confirm": set(),
    "FileJournal.remove_tentative": set(),
    "FileJournal.confirm_remove": set(),
    "_xid_record": set(),
}
"""Compiled functions that run for every SET or GET (at 100 clients, or alone) (``Class.method`` or a module's
function), and the names each may still look up (the actors' ``on_receive`` is left out: past
its first test, a dispatch over messages that are not requests)."""

ANYWHERE = {
    # the exception classes of except clauses, a log call in one and an error message's f-string
    "Exception", "OSError", "AssertionError", "ValueError", "BaseException", "GreenletExit",
    "exception", "format",
}
"""A deque's methods are not among them: mypyc has no native deque, so ``d.popleft()`` looks
the method up by name on every call; the request path calls them through ``Final`` names
(``_popleft: Final = deque.popleft``)."""

_BY_NAME = (
    re.compile(r"CPyObject_GetAttr3?\(|PyObject_GetAttr\(|PyObject_SetAttr\(|PyObject_VectorcallMethod\("),
    re.compile(r"= CPyStatic_\w+___globals;"),
)


def generated_source() -> str:
    """The build's generated C (setup.py builds multi-file: one C file per module in build/)."""
    answer = probe_compiled(GROUP_PROBE)
    (group,) = answer["groups"]
    *package, last = group.removesuffix("__mypyc").split(".")  # kestrel_actors._native: setup.py's group_name
    build = PACKAGE.parent.joinpath("build")
    group_file = build.joinpath(*package, f"__native_{last}.c")
    if not group_file.exists():
        pytest.skip(f"no generated C here (an installed wheel): {group_file}")
    return "\n".join(path.read_text() for path in [group_file, *sorted(build.glob("__native_*.c"))])


def function_lines(source: str, function: str) -> list[str]:
    """The lines of ``function``'s generated C (``Class.method`` or a module's function)."""
    *owner, name = function.split(".")
    c_name = "___".join([*owner, name])
    lines = source.splitlines()
    starts = [index for index, line in enumerate(lines)
              if re.match(rf"^\S.*\bCPyDef_\w*?___{re.escape(c_name)}\(.*\{{\s*$", line)]
    assert starts, f"{function} is not in the build"
    body = []
    for line in lines[starts[0] + 1:]:
        if line.startswith("}"):
            break
        body.append(line)
    return body


def lookups_by_name(source: str, function: str) -> list[str]:
    """The names that ``function``'s generated C looks up by name: attributes and methods of
    objects typed ``Any`` or a ``Protocol``, and module globals that are not ``Final``."""
    lines = function_lines(source, function)
    found = []
    for index, line in enumerate(lines):
        if any(pattern.search(line) for pattern in _BY_NAME):
            for back in range(index, max(-1, index - 8), -1):
                named = re.search(r"/\* '(.*?)' \*/", lines[back])
                if named:
                    found.append(named.group(1))
                    break
    return found


@needs_build
def test_a_request_is_told_without_a_record_around_it():
    """A read's commands reach the session as the decoder's list itself, and a tell queued for
    a busy actor (a queue's answer to the session up the stack, for every request) is queued as
    its bare message: neither makes a wrapper record per request (``Received``, ``_Letter``)."""
    source = generated_source()
    made = {function: [line.strip() for line in function_lines(source, function)
                       if re.search(r"\bCPyDef_\w*(_Letter|Received)\(", line)]
            for function in ("_ToSession.hand_over", "GeventRef.tell", "_HubRuns.run", "_Mailbox.enqueue")}
    assert {function: lines for function, lines in made.items() if lines} == {}


@needs_build
def test_a_lone_request_is_batched_and_answered_without_a_tuple():
    """A batch of one request keeps no entry for it (``SessionActor.lone``: the entry tuples of a
    batch of several are made in ``_compile_rest``), and a queue holds its answer as it is, to be
    told to its ``BatchDone.to`` (no pair of receiver and answer): no tuple per request."""
    source = generated_source()
    made = {function: [line.strip() for line in function_lines(source, function)
                       if re.search(r"\bPyTuple_(New|Pack)\(", line)]
            for function in ("SessionActor._start_batch", "SessionActor._batch_done", "SessionActor._answer",
                             "QueueActor._run", "QueueActor._send_replies", "_tell_answer")}
    assert {function: lines for function, lines in made.items() if lines} == {}


@needs_build
def test_a_get_s_fetch_is_told_apart_without_a_set_lookup():
    """``QueueActor._run`` tells a GET's fetch (a ``Remove``, or an ``Open``) by two identity
    tests before it asks ``FETCH_OPS`` or ``MANY_FETCHES``: each ``kind in`` a frozenset hashes
    the class (``PySet_Contains``, about 70 instructions), and a GET asked both."""
    lines = function_lines(generated_source(), "QueueActor._run")
    lookups = [index for index, line in enumerate(lines)
               if re.search(r"CPyStatic_\w*___(FETCH_OPS|MANY_FETCHES);", line)]
    assert len(lookups) == 2, lookups
    told = {}
    for start, end in zip([0, *lookups], lookups, strict=False):
        before = "\n".join(lines[start:end])
        told[lines[end].strip()] = [name for name in ("Remove", "Open")
                                    if not re.search(rf"CPyType_\w*___{name}\b", before)]
    assert {lookup: missing for lookup, missing in told.items() if missing} == {}


@needs_build
def test_histograms_count_with_native_arithmetic():
    """``buckets[i] += n`` on a ``list[int]`` compiles to ``PyNumber_InPlaceAdd`` on boxed
    integers (mypyc 2.4); the request path's histogram updates are written so that they do not."""
    source = generated_source()
    generic = {function: [line.strip() for line in function_lines(source, function)
                          if re.search(r"PyNumber_InPlace\w+\(", line)]
               for function in ("Histogram.add", "record_batch")}
    assert {function: lines for function, lines in generic.items() if lines} == {}


@needs_build
def test_the_monitor_scan_reads_bytes_and_digits_natively():
    """The planner's per-item scan (ADR 0022) reads the received ``bytes`` and builds a
    header's numbers in machine integers: a tagged ``int`` multiply of a 13-digit stamp went
    through ``PyNumber_Multiply``, a ``bytearray``'s byte through ``PyObject_GetItem``. (The
    only generic item access left copies a value, view to view, in ``HeaderScan.put``.)"""
    source = generated_source()
    generic = [line.strip() for line in function_lines(source, "HeaderScan.scan")
               if re.search(r"CPyTagged_Multiply|PyNumber_\w+\(|PyObject_GetItem\(|CPyBytes_GetSlice\(", line)]
    assert generic == []


@needs_build
@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf (binutils) here")
def test_the_build_exports_only_its_init_functions():
    """setup.py's ``LEAN_CALL_FLAGS`` (ADR 0020): with default visibility the group's library
    exported its thousands of functions and statics, and every read of a static that its modules
    share went through the GOT."""
    probe_compiled(GROUP_PROBE)  # skips unless this checkout's build is in use
    files = [path for path in PACKAGE.rglob("*") if path.name.endswith(SUFFIXES)]
    assert any("__mypyc" in path.name for path in files), files
    for path in files:
        table = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True,
                               timeout=60, check=True).stdout
        defined = [fields[7] for fields in map(str.split, table.splitlines())
                   if len(fields) >= 8 and fields[0][:-1].isdigit() and fields[6] != "UND"
                   and fields[3] != "SECTION" and fields[4] != "LOCAL"]
        assert defined and all(name.startswith("PyInit_") for name in defined), (path, defined[:10])


@needs_build
def test_the_request_path_looks_nothing_up_by_name():
    """Compiled code reads a typed attribute, calls a typed method and reads a ``Final`` constant
    natively; an ``Any`` or a ``Protocol`` in between, a type tested through a local
    (``kind = type(x)``), or a constant that is not ``Final`` makes it a lookup by name, which
    neither mypy nor the build reports (ADR 0015). This reads the build's generated C."""
    source = generated_source()
    found = {function: sorted(set(lookups_by_name(source, function)) - ANYWHERE - allowed)
             for function, allowed in REQUEST_PATH.items()}
    assert {function: names for function, names in found.items() if names} == {}
