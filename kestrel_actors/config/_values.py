"""Parsers for the values of a config file: durations, sizes, counts, names.

Each parser takes the value ``tomllib`` produced and returns the typed setting, or raises
:class:`BadValue` with a message that says what was expected. The config loader adds the file,
line and key. Sizes use Kestrel's binary units: ``MB`` and ``MiB`` are both 1024², as in
Kestrel's ``16.megabytes``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..queue_name import name_problem

__all__ = [
    "INT_MAX",
    "LONG_MAX",
    "BadValue",
    "Parser",
    "boolean",
    "check_queue_name",
    "count",
    "duration",
    "limit",
    "optional_count",
    "optional_duration",
    "optional_queue_name",
    "port",
    "positive_size",
    "queue_name",
    "size",
    "status_name",
    "sync_journal",
    "text",
    "token",
    "zookeeper_acl",
    "zookeeper_credentials",
    "zookeeper_path",
]

INT_MAX = 2**31 - 1
"""Kestrel's largest count (a Java int); here, not in ``_settings``, so that parsing a value
needs none of the settings' records."""
LONG_MAX = 2**63 - 1

Parser = Callable[[Any], Any]


class BadValue(ValueError):
    """A value of the wrong type or out of range; the message says what was expected."""


_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(us|µs|ms|s|m|h|d)?\s*\Z", re.IGNORECASE)
_DURATION_UNITS = {"us": 0.000001, "µs": 0.000001, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?:([kmgt])(?:i?b)?|b)?\s*\Z", re.IGNORECASE)
_SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_HINT = 'a duration: seconds as a number, or a string like "100ms", "30s", "5m", "1h"'
_SIZE_HINT = 'a size: bytes as an integer, or a string like "512KiB", "16MiB", "1GB"'


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    return f"{value!r} ({type(value).__name__})"


def duration(value: Any, bare_seconds: bool = False) -> float:
    """Seconds, from a non-negative number or a string with a unit (us, ms, s, m, h, d).

    ``bare_seconds``: a string that is a number alone is seconds too, as on a command line, where
    every value is a string; in a config file a number is written as a number.
    """
    if _is_number(value):
        if value < 0 or value != value:
            raise BadValue(f"expected {_DURATION_HINT}, not a negative number")
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match and (match.group(2) or bare_seconds):
            return float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
    raise BadValue(f"expected {_DURATION_HINT}; got {_describe(value)}")


def optional_duration(zero_is_none: bool = False) -> Parser:
    """A duration, or ``"none"`` for Kestrel's ``None``; with ``zero_is_none``, 0 is none too."""

    def parse(value: Any) -> float | None:
        if isinstance(value, str) and value.strip().lower() == "none":
            return None
        try:
            seconds = duration(value)
        except BadValue:
            raise BadValue(f'expected "none" or {_DURATION_HINT}; got {_describe(value)}') from None
        return None if zero_is_none and seconds == 0 else seconds

    return parse


def sync_journal(value: Any) -> float | None:
    """``"never"`` (no fsync: ``None``), ``"always"`` (fsync each write: 0) or a period."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word == "never":
            return None
        if word == "always":
            return 0.0
    try:
        return duration(value)
    except BadValue:
        raise BadValue(f'expected "never", "always" or {_DURATION_HINT}; got {_describe(value)}') from None


def size(value: Any, maximum: int = LONG_MAX) -> int:
    """Bytes, from a non-negative integer or a string with a binary unit (K, M, G, T)."""
    result: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        result = value
    elif isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            unit = match.group(2)
            result = int(float(match.group(1)) * (_SIZE_UNITS[unit.lower()] if unit else 1))
    if result is None:
        raise BadValue(f"expected {_SIZE_HINT}; got {_describe(value)}")
    if not 0 <= result <= maximum:
        raise BadValue(f"expected {_SIZE_HINT} between 0 and {maximum}; got {_describe(value)}")
    return result


def positive_size(value: Any) -> int:
    """A size of at least one byte."""
    result = size(value)
    if result < 1:
        raise BadValue(f"expected {_SIZE_HINT} of at least 1 byte; got {_describe(value)}")
    return result


def limit(kind: str) -> Parser:
    """A queue limit: a size (``kind="size"``) or a 32-bit count (``kind="count"``), or
    ``"unlimited"`` for Kestrel's default (``Long.MaxValue`` / ``Int.MaxValue``)."""
    maximum = LONG_MAX if kind == "size" else INT_MAX

    def parse(value: Any) -> int:
        if isinstance(value, str) and value.strip().lower() == "unlimited":
            return maximum
        if kind == "size":
            return size(value, maximum)
        return count(0, maximum)(value)

    return parse


def count(minimum: int = 0, maximum: int = INT_MAX) -> Parser:
    """An integer in ``[minimum, maximum]``."""

    def parse(value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadValue(f"expected an integer; got {_describe(value)}")
        if not minimum <= value <= maximum:
            raise BadValue(f"expected an integer between {minimum} and {maximum}; got {value}")
        return value

    return parse


def optional_count(minimum: int = 0) -> Parser:
    """An integer, or ``"none"`` for no limit."""
    inner = count(minimum)

    def parse(value: Any) -> int | None:
        if isinstance(value, str) and value.strip().lower() == "none":
            return None
        try:
            return inner(value)
        except BadValue as exc:
            raise BadValue(f'{exc} (or "none")') from None

    return parse


def port(value: Any) -> int:
    return count(0, 65535)(value)


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadValue(f"expected true or false; got {_describe(value)}")
    return value


def text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise BadValue(f"expected a non-empty string; got {_describe(value)}")
    return value


_TOKEN = re.compile(r"[!-~]{1,256}\Z")


def token(value: Any) -> str:
    """A secret sent in an HTTP header or a query string: 1 to 256 visible ASCII characters
    (no spaces), so that it reaches the server byte for byte whichever way it is sent."""
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise BadValue(f"expected 1 to 256 visible ASCII characters, no spaces; got {_describe_secret(value)}")
    return value


_TOML_KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (dict, "a table"), (list, "an array"))


def _describe_secret(value: Any) -> str:
    # never echo a secret into a reply, a log or a terminal: a table or an array (or a number)
    # holds it as well as a string does, and repr would show it
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    return next((kind for type_, kind in _TOML_KINDS if isinstance(value, type_)), "a date or time")


def queue_name(value: Any) -> str:
    """A legal queue name (behaviour §5.2, plus the limits of :func:`~kestrel_actors.queue_name.name_problem`)."""
    if not isinstance(value, str):
        raise BadValue(f"expected a queue name (a string); got {_describe(value)}")
    check_queue_name(value)
    return value


def check_queue_name(name: str) -> None:
    """Raise :class:`BadValue` unless ``name`` can name a queue (the server's one rule)."""
    problem = name_problem(name)
    if problem is not None:
        raise BadValue(problem)


def optional_queue_name(value: Any) -> str | None:
    """A queue name, or ``""`` for none (so a table can clear an inherited ``expire_to_queue``)."""
    if value == "":
        return None
    return queue_name(value)


def status_name(value: Any) -> str:
    """A status a server may start in: Up, ReadOnly, WriteAvoid or Quiescent (any case)."""
    names = {"up": "Up", "readonly": "ReadOnly", "writeavoid": "WriteAvoid", "quiescent": "Quiescent"}
    if isinstance(value, str) and value.strip().lower() in names:
        return names[value.strip().lower()]
    raise BadValue(f'expected one of "Up", "ReadOnly", "WriteAvoid", "Quiescent"; got {_describe(value)}')


def zookeeper_path(value: Any) -> str:
    """An absolute ZooKeeper path without a trailing slash: ``/kestrel/production``."""
    if (not isinstance(value, str) or not value.startswith("/") or value.endswith("/")
            or "//" in value or any(c in value for c in "\0\n\r")):
        raise BadValue('expected an absolute ZooKeeper path like "/kestrel/production" '
                       f"(no trailing slash); got {_describe(value)}")
    return value


def zookeeper_acl(value: Any) -> str:
    """``open`` or ``creator-all`` (Kestrel's ``OpenUnsafeACL``/``EveryoneReadCreatorAllACL``)."""
    names = {"open": "open", "open-unsafe": "open", "creator-all": "creator-all",
             "everyone-read-creator-all": "creator-all"}
    if isinstance(value, str) and value.strip().lower() in names:
        return names[value.strip().lower()]
    raise BadValue(f'expected "open" or "creator-all"; got {_describe(value)}')


def zookeeper_credentials(value: Any) -> tuple[str, str]:
    """Digest credentials: a table ``{ user = "…", password = "…" }``."""
    if isinstance(value, dict) and set(value) == {"user", "password"}:
        user, password = value["user"], value["password"]
        if isinstance(user, str) and user and ":" not in user and isinstance(password, str) and password:
            return user, password
    raise BadValue('expected a table { user = "name", password = "secret" } '
                   "(a non-empty user without \":\" and a non-empty password)")
