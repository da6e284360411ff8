"""A log pipe whose reader has gone (``serve | reader`` and the reader exits): the server keeps
serving and still stops on SIGTERM. Python ignores SIGPIPE, so a log write raises EPIPE."""

from __future__ import annotations

import os
import signal
import subprocess

from ..helpers import Client, ServerProcess, expect, listening, set_cmd, unique, value, wait_for

STOP_DEADLINE = 30.0
"""Generous: the drain bound (5 s) plus the queues' close, on a loaded machine."""


def start_piped(tmp_path, stderr_to_pipe: bool) -> tuple[ServerProcess, subprocess.Popen[bytes], int]:
    """Start a server with stdout (and, with ``stderr_to_pipe``, stderr: ``2>&1``) into a pipe;
    return it with the pipe's read end, once its memcache port listens."""
    server = ServerProcess(tmp_path / "data")
    server.data_dir.mkdir(parents=True)
    read_end, write_end = os.pipe()
    errors = None if stderr_to_pipe else open(tmp_path / "stderr", "wb")  # noqa: SIM115
    try:
        proc = subprocess.Popen(server.command(), stdout=write_end,
                                stderr=write_end if stderr_to_pipe else errors)
    finally:
        os.close(write_end)
        if errors is not None:
            errors.close()
    wait_for(lambda: proc.poll() is not None or listening(server.port), timeout=60)
    if proc.poll() is not None or not listening(server.port):
        proc.kill()
        proc.wait()
        raise AssertionError(f"the server did not listen: exit code {proc.returncode}")
    return server, proc, read_end


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM, then the exit code; ``None`` (after a SIGKILL) if it did not exit in time."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(STOP_DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def test_requests_are_served_and_sigterm_stops_the_server_after_the_log_reader_has_gone(tmp_path):
    """``serve 2>&1 | reader``: a request that logs (a new queue's journal is opened) is
    answered while the pipe has no reader, and SIGTERM then exits 0."""
    server, proc, read_end = start_piped(tmp_path, stderr_to_pipe=True)
    try:
        os.close(read_end)
        queue = unique()
        client = Client(server.host, server.port)
        client.send(set_cmd(queue, b"kept") + b"get %s\r\n" % queue.encode())
        expect(client, b"STORED\r\n" + value(queue, b"kept"))
        client.close()
        assert stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_stops_the_server_whose_log_reader_has_gone_with_no_request_between(tmp_path):
    """``serve | reader``, no request between the reader's exit and SIGTERM: the next log line
    (at the latest the shutdown's own) fails; the server still exits 0, and says once on
    stderr that it gave up its log."""
    _, proc, read_end = start_piped(tmp_path, stderr_to_pipe=False)
    try:
        os.close(read_end)
        assert stop(proc) == 0
        notes = (tmp_path / "stderr").read_text().splitlines()
        assert len(notes) == 1 and "the log stream failed" in notes[0] and "EPIPE" in notes[0], notes
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
