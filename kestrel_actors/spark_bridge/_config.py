"""The bridge's settings, and the parsers the CLI shares with Python callers.

:class:`BridgeConfig` is a plain frozen dataclass so a test or an embedding program can build
one directly and hand it to :func:`~kestrel_actors.spark_bridge.run_bridge`; the CLI builds the
same object from its options.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..client import ServerAddress
from ..config import duration

__all__ = [
    "BridgeConfig",
    "default_state_dir",
    "job_module_name",
    "load_job",
    "parse_duration",
    "parse_key_values",
    "parse_servers",
]

OUTPUT_FORMATS = ("json", "parquet")


def parse_duration(text: str | float) -> float:
    """``"1s"``, ``"250ms"``, ``"2m"``, ``"1d"``, ``"1.5"`` (seconds) → seconds as a float: a
    duration as the config file takes one (docs/configuration.md), where a number alone in a
    string is seconds too. Raises ``ValueError``."""
    return duration(text, bare_seconds=True)


def parse_key_values(pairs: Any, what: str = "option") -> dict[str, str]:
    """``["k=v", ...]`` (or a mapping) → ``{k: v}``; the value may itself contain ``=``."""
    if isinstance(pairs, Mapping):
        return {str(k): str(v) for k, v in pairs.items()}
    result: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} must look like key=value, got {pair!r}")
        result[key.strip()] = value
    return result


def parse_servers(text: str | Any) -> tuple[ServerAddress, ...]:
    """``"h1:22133,h2"`` (or a list of such) → distinct addresses, in the order given."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    result: list[ServerAddress] = []
    for part in parts:
        address = part if isinstance(part, ServerAddress) else ServerAddress.parse(part)
        if address not in result:
            result.append(address)
    if not result:
        raise ValueError("no servers given")
    return tuple(result)


def job_module_name(spec: str | Callable[..., Any]) -> str:
    """The module a job comes from (``package.module`` of ``package.module:function``)."""
    if callable(spec):
        return getattr(spec, "__module__", "") or ""
    return spec.partition(":")[0]


def load_job(spec: str | Callable[..., Any], py_files: Sequence[str] = ()) -> Callable[..., Any]:
    """Resolve ``package.module:function`` (dotted attributes allowed after the colon).

    The module is imported like ``python -m`` would: from ``sys.path`` *and* the current
    directory, which the ``kestrel-actors`` entry point leaves off ``sys.path``; and, as
    ``spark-submit --py-files`` does for its driver, from ``py_files`` (a ``.zip``/``.egg`` is
    a path entry, a ``.py`` file is found in its directory), so a job that imports code shipped
    to the executors imports the same code here.
    """
    if callable(spec):
        return spec
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"job must look like package.module:function, got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    for path in py_files:
        entry = os.path.abspath(os.path.dirname(path) if path.endswith(".py") else path)
        if entry not in sys.path:
            sys.path.append(entry)
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"job {spec!r} is not callable")
    return target


def is_local_path(path: str) -> bool:
    """True for a plain filesystem path or a ``file:`` URI (where the bridge can fsync)."""
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def local_path(path: str) -> Path:
    return Path(urlparse(path).path if path.startswith("file:") else path)


def default_state_dir(output_path: str | None) -> Path:
    """Where batch counters live unless ``--state-dir`` says otherwise.

    Beside the output (``<output-path>/_kestrel_bridge``, hidden from Spark readers by its
    leading underscore) when that is local, so the counters and the batches they number move
    together; otherwise under ``$XDG_STATE_HOME/kestrel-actors/bridge``.
    """
    if output_path and is_local_path(output_path):
        return local_path(output_path) / "_kestrel_bridge"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "kestrel-actors" / "bridge"


@dataclass(frozen=True)
class BridgeConfig:
    """Everything one bridge run needs. Durations are seconds.

    ``job`` is ``"package.module:function"`` or the function itself; it is called as
    ``job(rdd_of_bytes, meta)`` (see :class:`~kestrel_actors.spark_bridge.BatchMeta`).
    At most one of ``output_queue`` and ``output_path`` may be set.

    Stopping: ``max_batches`` (``once`` is ``max_batches=1``) counts non-empty batches per
    server; ``until_empty`` stops a server's loop at its first empty batch.

    Failures: a batch whose job (or output) fails ``max_failures`` times in a row is moved to
    ``dead_letter_queue`` (default ``<queue>_failed``, same server) and the bridge goes on;
    0 retries for ever. A server that cannot be reached is retried for ever with backoff.
    ``job_timeout`` (0: none) cancels a batch's Spark jobs and returns its items to the queue.
    ``keep_alive`` is how often the connection is pinged while Spark works (0: never).
    ``py_files`` are shipped to the executors (``SparkContext.addPyFile``), and so is the
    job's own module when it is not installed (see ``_spark.ship_job_code``).
    """

    queue: str
    job: str | Callable[..., Any]
    servers: tuple[ServerAddress, ...] = (ServerAddress("127.0.0.1", 22133),)
    job_args: Mapping[str, str] = field(default_factory=dict)
    batch_size: int = 10_000
    batch_wait: float = 1.0
    partitions: int = 4
    master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    app_name: str = "kestrel-bridge"
    output_queue: str | None = None
    output_path: str | None = None
    output_format: str = "json"
    state_dir: str | None = None
    max_batches: int = 0
    until_empty: bool = False
    max_failures: int = 5
    dead_letter_queue: str | None = None
    job_timeout: float = 0.0
    keep_alive: float = 1.0
    py_files: tuple[str, ...] = ()
    retry_initial: float = 0.5
    retry_max: float = 30.0
    connect_timeout: float = 5.0
    io_timeout: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.servers, str) or not all(
                isinstance(s, ServerAddress) for s in self.servers):
            object.__setattr__(self, "servers", parse_servers(self.servers))
        object.__setattr__(self, "job_args", parse_key_values(self.job_args, "job arg"))
        object.__setattr__(self, "spark_conf", parse_key_values(self.spark_conf, "conf"))
        if isinstance(self.py_files, str):
            object.__setattr__(self, "py_files", tuple(
                p for p in self.py_files.split(",") if p.strip()))
        else:
            object.__setattr__(self, "py_files", tuple(self.py_files))
        if self.dead_letter_queue is None:
            object.__setattr__(self, "dead_letter_queue", f"{self.queue}_failed")
        if not self.queue or any(ch in self.queue for ch in " /.~\r\n\t"):
            raise ValueError(f"bad queue name {self.queue!r}")
        if self.output_queue is not None and self.output_path is not None:
            raise ValueError("give at most one of output_queue and output_path")
        if self.output_queue is not None and (
                not self.output_queue or any(ch in self.output_queue for ch in " /.~\r\n\t")):
            raise ValueError(f"bad output queue name {self.output_queue!r}")
        if self.output_queue == self.queue:
            raise ValueError("the output queue must differ from the input queue")
        if not self.dead_letter_queue or self.dead_letter_queue == self.queue or any(
                ch in self.dead_letter_queue for ch in " /.~\r\n\t"):
            raise ValueError(f"bad dead-letter queue name {self.dead_letter_queue!r} (it must "
                             "be a queue name other than the input queue)")
        if self.job_timeout < 0 or self.keep_alive < 0:
            raise ValueError("job_timeout and keep_alive cannot be negative")
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(f"output_format must be one of {OUTPUT_FORMATS}")
        if self.batch_size < 1 or self.partitions < 1:
            raise ValueError("batch_size and partitions must be at least 1")
        if self.batch_wait < 0 or self.max_batches < 0 or self.max_failures < 0:
            raise ValueError("batch_wait, max_batches and max_failures cannot be negative")
        if not self.servers:
            raise ValueError("no servers given")

    @property
    def resolved_state_dir(self) -> Path:
        return Path(self.state_dir) if self.state_dir else default_state_dir(self.output_path)
