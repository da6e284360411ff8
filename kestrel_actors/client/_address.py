"""A server's address, apart from the client: parsing one (a Spark source's options, each
time Spark starts a process that reads them) needs none of the connection code."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_PORT", "ServerAddress"]

DEFAULT_PORT = 22133


@dataclass(frozen=True, order=True)
class ServerAddress:
    """``host:port`` of one server (port 22133 when omitted; ``[v6]:port`` for IPv6)."""

    host: str
    port: int = DEFAULT_PORT

    @classmethod
    def parse(cls, text: str | ServerAddress) -> ServerAddress:
        if isinstance(text, ServerAddress):
            return text
        text = text.strip()
        if not text:
            raise ValueError("empty server address")
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        elif text.count(":") == 1:
            host, _, port = text.partition(":")
        else:
            host, port = text, ""
        if not host:
            raise ValueError(f"no host in server address {text!r}")
        try:
            number = int(port) if port else DEFAULT_PORT
        except ValueError:
            raise ValueError(f"bad port in server address {text!r}") from None
        if not 0 < number < 65536:
            raise ValueError(f"port out of range in server address {text!r}")
        return cls(host, number)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
