"""Load a server's configuration from a TOML file (see ``docs/configuration.md``).

Server settings are top-level keys. ``[queue_defaults]`` overrides Kestrel's built-in queue
defaults for every queue, ``[queues."name"]`` configures one queue, and ``[aliases]`` maps an
alias name to its destination queues. Queue settings inherit as in Kestrel 2.3.4+ (reference
behaviour §5.13): built-in defaults ← ``queue_defaults`` ← the master's table ← a fanout child's own
table (``P+C``); only keys a table sets override its parent, and a child without a table of
its own uses its master's resolved settings.

Every problem is reported, not only the first, each with the file, the line and the key:
``kestrel.toml:12: queues.jobs.max_itemz: unknown queue setting (did you mean max_items?)``.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from os import PathLike
from typing import Any

from ..queue_name import fanout_master, is_fanout_child
from . import _values as v
from ._settings import QueueConfig, ServerConfig, ZooKeeperConfig, ZooKeeperCredentials
from ._toml_lines import KeyLines, format_key

__all__ = [
    "QUEUE_SETTINGS",
    "SERVER_SETTINGS",
    "ZOOKEEPER_SETTINGS",
    "ConfigError",
    "ConfigProblem",
    "effective_queue_config",
    "load_config",
    "parse_config",
    "resolve_queue_configs",
]


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a config file: where it is (file, line, key) and what is wrong."""

    source: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` lists every problem found, in file order."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


def _not_in_file(value: Any) -> Any:
    """``config_file`` is a field, not a setting: ``load_config`` fills it with the file's path."""
    raise v.BadValue("cannot be set in the file: load_config records the path of the file it read")


SERVER_SETTINGS: dict[str, v.Parser] = {
    "host": v.text,
    "port": v.port,
    "text_port": v.port,
    "thrift_port": v.port,
    "admin_port": v.port,
    "admin_host": v.text,
    "admin_token": v.token,
    "data_dir": v.text,
    "max_open_transactions": v.count(0),
    "max_item_bytes": v.size,
    "max_line_bytes": v.positive_size,
    "monitor_max_items": v.count(1),
    "expiration_timer_frequency": v.optional_duration(zero_is_none=True),
    "client_timeout": v.optional_duration(zero_is_none=True),
    "busy_poll": v.duration,
    "max_connections": v.count(1),
    "max_buffered_bytes": v.positive_size,
    "connection_limit_refuse_writes": v.optional_count(0),
    "connection_limit_refuse_reads": v.optional_count(0),
    "status_file": v.text,
    "default_status": v.status_name,
    "status_change_grace_period": v.duration,
    "config_file": _not_in_file,
}
"""Top-level keys: the name of a :class:`ServerConfig` field → the parser of its value."""

QUEUE_SETTINGS: dict[str, v.Parser] = {
    "max_items": v.limit("count"),
    "max_size": v.limit("size"),
    "max_item_size": v.limit("size"),
    "max_age": v.optional_duration(),
    "default_journal_size": v.size,
    "max_memory_size": v.size,
    "max_journal_size": v.size,
    "min_journal_compact_delay": v.optional_duration(),
    "discard_old_when_full": v.boolean,
    "keep_journal": v.boolean,
    "sync_journal": v.sync_journal,
    "expire_to_queue": v.optional_queue_name,
    "max_expire_sweep": v.limit("count"),
    "fanout_only": v.boolean,
    "max_queue_age": v.optional_duration(),
    "enable_trace": v.boolean,
    "disable_aggressive_rewrites": v.boolean,
    "open_transaction_timeout": v.optional_duration(),
}
"""Keys of ``[queue_defaults]`` and ``[queues."name"]``: a :class:`QueueConfig` field → parser."""

ZOOKEEPER_SETTINGS: dict[str, v.Parser] = {
    "host": v.text,
    "port": v.count(1, 65535),
    "path_prefix": v.zookeeper_path,
    "session_timeout": v.duration,
    "credentials": v.zookeeper_credentials,
    "acl": v.zookeeper_acl,
}
"""Keys of ``[zookeeper]``: a :class:`ZooKeeperConfig` field → parser (Kestrel's camelCase
names, ``pathPrefix`` and ``sessionTimeout``, are reported with the snake_case spelling)."""

_TABLES = ("queue_defaults", "queues", "aliases", "zookeeper")

# Kestrel names whose snake_case form is not ours (the others are found by converting camelCase).
_KESTREL_NAMES = {
    "listenAddress": "host",
    "memcacheListenPort": "port",
    "textListenPort": "text_port",
    "thriftListenPort": "thrift_port",
    "queuePath": "data_dir",
    "default": "queue_defaults",
}
_THRIFT_ONLY = "Kestrel's thrift client-id whitelist; kestrel-actors does not read thrift client ids"
_UNSUPPORTED_QUEUE = {
    "whiteListClientIdForDequeue": _THRIFT_ONLY,
    "whiteListClientIdForEnqueue": _THRIFT_ONLY,
}
_UNSUPPORTED_SERVER: dict[str, str] = {}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_TOML_POSITION = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\Z")


def _snake(name: str) -> str:
    return _KESTREL_NAMES.get(name) or _CAMEL.sub("_", name).lower()


def _did_you_mean(key: str, name: str, choices: list[str]) -> str:
    """`` (did you mean x?)`` for a Kestrel spelling of a setting or a near-miss, else ``""``."""
    if name != key and name in choices:
        return f" (did you mean {name}?)"
    close = difflib.get_close_matches(key, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _unknown_server_key(key: str) -> str:
    if key in _UNSUPPORTED_SERVER:
        return f"not supported: {_UNSUPPORTED_SERVER[key]}"
    name = _snake(key)
    if name in QUEUE_SETTINGS:
        return (f"unknown server setting: {name} is a queue setting; "
                'put it in [queue_defaults] or [queues."name"]')
    return "unknown server setting" + _did_you_mean(key, name, [*SERVER_SETTINGS, *_TABLES])


def _unknown_queue_key(key: str) -> str:
    if key in _UNSUPPORTED_QUEUE:
        return f"not supported: {_UNSUPPORTED_QUEUE[key]}"
    name = _snake(key)
    if name in SERVER_SETTINGS or name in _TABLES:
        return f"unknown queue setting: {name} is a server setting; put it at the top of the file"
    return "unknown queue setting" + _did_you_mean(key, name, list(QUEUE_SETTINGS))


class _Reader:
    """Checks one parsed document, collecting problems located by :class:`KeyLines`."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines = KeyLines(text)
        self.problems: list[ConfigProblem] = []

    def problem(self, path: tuple[str, ...], message: str) -> None:
        self.problems.append(ConfigProblem(self.source, self.lines.line_of(path), format_key(path), message))

    def value(self, path: tuple[str, ...], parser: v.Parser, raw: Any, out: dict[str, Any]) -> None:
        try:
            out[path[-1]] = parser(raw)
        except v.BadValue as exc:
            self.problem(path, str(exc))

    def name_ok(self, path: tuple[str, ...], name: str) -> bool:
        try:
            v.check_queue_name(name)
        except v.BadValue as exc:
            self.problem(path, str(exc))
            return False
        return True

    def queue_table(self, path: tuple[str, ...], table: Any) -> dict[str, Any]:
        """The settings a queue table sets explicitly, parsed (only these override a parent)."""
        if not isinstance(table, dict):
            self.problem(path, f"expected a table (queue settings); got {table!r}")
            return {}
        settings: dict[str, Any] = {}
        for key, raw in table.items():
            parser = QUEUE_SETTINGS.get(key)
            if parser is None:
                self.problem((*path, key), _unknown_queue_key(key))
            else:
                self.value((*path, key), parser, raw, settings)
        return settings

    def queues(self, raw: Any) -> dict[str, dict[str, Any]]:
        if not isinstance(raw, dict):
            self.problem(("queues",), f'expected a table of [queues."name"] tables; got {raw!r}')
            return {}
        tables = {}
        for name, table in raw.items():
            self.name_ok(("queues", name), name)
            tables[name] = self.queue_table(("queues", name), table)
        return tables

    def aliases(self, raw: Any) -> dict[str, tuple[str, ...]]:
        if not isinstance(raw, dict):
            self.problem(("aliases",), f"expected a table (alias name = [destinations]); got {raw!r}")
            return {}
        aliases = {}
        for name, destinations in raw.items():
            path = ("aliases", name)
            self.name_ok(path, name)
            if not isinstance(destinations, list) or not destinations:
                expected = "expected a non-empty list of destination queue names"
                self.problem(path, f"{expected}; got {destinations!r}")
                continue
            for destination in destinations:
                try:
                    v.queue_name(destination)
                except v.BadValue as exc:
                    self.problem(path, str(exc))
            aliases[name] = tuple(destinations)
        return aliases

    def zookeeper(self, raw: Any) -> ZooKeeperConfig | None:
        if not isinstance(raw, dict):
            self.problem(("zookeeper",), f"expected a table (host, path_prefix, …); got {raw!r}")
            return None
        settings: dict[str, Any] = {}
        for key, value in raw.items():
            parser = ZOOKEEPER_SETTINGS.get(key)
            if parser is None:
                hint = _did_you_mean(key, _snake(key), list(ZOOKEEPER_SETTINGS))
                self.problem(("zookeeper", key), "unknown zookeeper setting" + hint)
            else:
                self.value(("zookeeper", key), parser, value, settings)
        missing = [key for key in ("host", "path_prefix") if key not in raw]
        for key in missing:
            self.problem(("zookeeper",), f"{key} is required")
        if settings.get("session_timeout", 1.0) <= 0:
            self.problem(("zookeeper", "session_timeout"), "expected a duration above 0")
        if settings.get("acl") == "creator-all" and "credentials" not in raw:
            self.problem(("zookeeper", "acl"), '"creator-all" needs credentials (user, password)')
        if missing or self.problems:
            return None
        if "credentials" in settings:
            settings["credentials"] = ZooKeeperCredentials(*settings["credentials"])
        return ZooKeeperConfig(**settings)

    def read(self, document: dict[str, Any]) -> ServerConfig:
        server: dict[str, Any] = {}
        defaults: dict[str, Any] = {}
        tables: dict[str, dict[str, Any]] = {}
        aliases: dict[str, tuple[str, ...]] = {}
        for key, raw in document.items():
            if key == "queue_defaults":
                defaults = self.queue_table((key,), raw)
            elif key == "queues":
                tables = self.queues(raw)
            elif key == "aliases":
                aliases = self.aliases(raw)
            elif key == "zookeeper":
                server["zookeeper"] = self.zookeeper(raw)
            elif key in SERVER_SETTINGS:
                self.value((key,), SERVER_SETTINGS[key], raw, server)
            else:
                self.problem((key,), _unknown_server_key(key))
        if self.problems:
            self.problems.sort(key=lambda problem: problem.line or 0)
            raise ConfigError(self.problems)
        queue_defaults = QueueConfig().replace(**defaults)
        return ServerConfig(
            **server,
            queue_defaults=queue_defaults,
            queues=resolve_queue_configs(queue_defaults, tables),
            aliases=aliases,
        )


def resolve_queue_configs(defaults: QueueConfig, tables: dict[str, dict[str, Any]]) -> dict[str, QueueConfig]:
    """The resolved config of every queue with a table, from the settings each table sets.

    ``defaults`` is the built-in defaults with ``[queue_defaults]`` applied; ``tables`` maps a
    queue name to the parsed settings its table sets explicitly. A master ``P`` is
    ``defaults`` plus its table; a child ``P+C`` (split at the first ``+``) is ``P``'s resolved
    config (``defaults`` if ``P`` has no table) plus its own table. Pure: no I/O, no checks.
    """
    resolved: dict[str, QueueConfig] = {}
    for name, settings in tables.items():
        if not is_fanout_child(name):
            resolved[name] = defaults.replace(**settings)
    for name, settings in tables.items():
        master = fanout_master(name)
        if master is not None:
            resolved[name] = resolved.get(master, defaults).replace(**settings)
    return resolved


def effective_queue_config(config: ServerConfig, name: str) -> QueueConfig:
    """The settings queue ``name`` runs with, whether or not it has a table of its own.

    Its resolved table if it has one; else, for a fanout child, its master's resolved config
    (or the defaults if the master has no table either); else ``[queue_defaults]``.
    """
    return config.queue_config(name)


def _invalid_toml(exc: tomllib.TOMLDecodeError, text: str, source: str) -> ConfigError:
    message = str(exc)
    match = _TOML_POSITION.search(message)
    line: int | None = None
    if match:
        message = message[: match.start()]
        if match.group(1):
            line = int(match.group(1))
            message += f" (column {match.group(2)})"
        else:
            line = max(1, len(text.splitlines()))
            message += " (at the end of the file)"
    return ConfigError([ConfigProblem(source, line, "", f"invalid TOML: {message}")])


def parse_config(text: str, source: str) -> ServerConfig:
    """The config a TOML text describes; ``source`` (usually the file name) prefixes messages.

    Raises :class:`ConfigError` listing every problem: invalid TOML, unknown keys, bad values,
    illegal queue or alias names. ``config_file`` is left unset (see :func:`load_config`).
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _invalid_toml(exc, text, source) from None
    return _Reader(text, source).read(document)


def load_config(path: str | PathLike[str]) -> ServerConfig:
    """Read and parse the config file at ``path``, recording it as ``config_file`` for reloads."""
    source = str(path)
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        problem = ConfigProblem(source, None, "", f"cannot read the config file: {reason}")
        raise ConfigError([problem]) from None
    return parse_config(text, source).replace(config_file=source)
