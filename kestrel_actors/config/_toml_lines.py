"""Find the line that defines a key in a TOML text, for error messages.

``tomllib`` gives no positions for valid documents, so this scans the text line by line:
table headers (``[a."b+c"]``) set the current table, and ``key = value`` lines (dotted keys
included) record the full key path. It is a locator, not a parser: it skips multi-line
strings and never fails; a key it cannot place (e.g. inside an inline table) falls back to
the nearest enclosing key or table it did place.
"""

from __future__ import annotations

import re

__all__ = ["KeyLines", "format_key"]

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_BARE_FULL = re.compile(r"[A-Za-z0-9_-]+\Z")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def format_key(path: tuple[str, ...]) -> str:
    """``queues."jobs+a".max_items``: the path as TOML writes it, quoting where needed."""
    return ".".join(part if _BARE_FULL.match(part) else _quote(part) for part in path)


def _quote(part: str) -> str:
    return '"' + part.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _parse_key(line: str, pos: int) -> tuple[tuple[str, ...], int] | None:
    """Parse a (dotted) key starting at ``pos``; return its parts and the position after it."""
    parts: list[str] = []
    size = len(line)
    while True:
        while pos < size and line[pos] in " \t":
            pos += 1
        if pos >= size:
            return None
        char = line[pos]
        if char == '"':
            pos += 1
            chars: list[str] = []
            while pos < size and line[pos] != '"':
                if line[pos] == "\\" and pos + 1 < size:
                    chars.append(_ESCAPES.get(line[pos + 1], line[pos + 1]))
                    pos += 2
                else:
                    chars.append(line[pos])
                    pos += 1
            if pos >= size:
                return None
            parts.append("".join(chars))
            pos += 1
        elif char == "'":
            end = line.find("'", pos + 1)
            if end < 0:
                return None
            parts.append(line[pos + 1 : end])
            pos = end + 1
        else:
            match = _BARE.match(line, pos)
            if not match:
                return None
            parts.append(match.group())
            pos = match.end()
        while pos < size and line[pos] in " \t":
            pos += 1
        if pos < size and line[pos] == ".":
            pos += 1
            continue
        return tuple(parts), pos


class KeyLines:
    """Line numbers (1-based) of the keys and tables defined in a TOML text."""

    def __init__(self, text: str) -> None:
        self.lines: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        in_string: str | None = None
        for number, raw in enumerate(text.splitlines(), start=1):
            if in_string is not None:
                if raw.count(in_string) % 2 == 1:
                    in_string = None
                continue
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                double = line.startswith("[[")
                parsed = _parse_key(line, 2 if double else 1)
                if parsed is not None:
                    table = parsed[0]
                    self._record(table, number)
                continue
            parsed = _parse_key(line, 0)
            if parsed is None:
                continue
            parts, pos = parsed
            if pos >= len(line) or line[pos] != "=":
                continue
            self._record(table + parts, number)
            rest = line[pos + 1 :]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_string = quote
                    break

    def _record(self, path: tuple[str, ...], number: int) -> None:
        for end in range(1, len(path) + 1):
            self.lines.setdefault(path[:end], number)
        self.lines[path] = number

    def line_of(self, path: tuple[str, ...]) -> int | None:
        """The line defining ``path``, else that of its nearest recorded ancestor, else None."""
        for end in range(len(path), 0, -1):
            number = self.lines.get(path[:end])
            if number is not None:
                return number
        return None
