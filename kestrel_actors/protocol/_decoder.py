"""What every protocol's decoder shares: the bytes kept between reads, and the end after a close.

Each codec (memcache, text, thrift) says only how to parse; :class:`Decoder` holds the rules
around that, so the three cannot drift apart: how the rest of a read is kept for the next,
and that a decoder is spent once it has returned a command that closes the connection.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from ._commands import Bad

__all__ = ["Decoder"]


@mypyc_attr(allow_interpreted_subclasses=True)
class Decoder:
    """Incremental decoder: :meth:`feed` takes bytes and returns the complete commands.

    After a command that closes the connection (a :class:`Bad` with ``close``), the decoder
    is spent: :attr:`closed` is true and later input is ignored.
    """

    __slots__ = ("_buffer", "_kept", "closed")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._kept = 0
        """``len(_buffer)``, kept as it changes: compiled, a bytearray's length or truth is a
        generic call, and each read asked it three times (here, and twice as ``buffered``, ~85
        instructions a read)."""
        self.closed = False

    @property
    def buffered(self) -> int:
        """Bytes read and kept for the next read (an unfinished request): what this decoder
        holds of the server's buffered input (``--max-buffered-bytes``)."""
        return self._kept

    def release(self) -> None:
        """The connection has ended: let go of what is buffered now, not when the decoder is
        collected (a connection's objects form cycles, which the tuned collector sees late)."""
        self._buffer = bytearray()
        self._kept = 0
        self.closed = True

    def reuse(self, command: object) -> None:
        """``command``, which this decoder made, has been answered and nobody holds it any longer:
        a codec may refill it as its next request of that kind (``MemcacheDecoder``), not make
        another. By default it is let go."""

    def _decode(self, source: bytes | bytearray, commands: list[object]) -> int:
        """Append to ``commands`` what ``source`` holds complete, stopping after one that
        closes; return where the unparsed rest of ``source`` starts."""
        raise NotImplementedError

    def feed(self, data: bytes | bytearray) -> list[object]:
        if self.closed:
            return []
        buffer = self._buffer
        if self._kept or type(data) is not bytes:
            buffer += data
            source: bytes | bytearray = buffer
        else:
            source = data  # nothing left from the last read: parse it in place, no copies
        commands: list[object] = []
        pos = self._decode(source, commands)
        if commands and type(commands[-1]) is Bad and commands[-1].close:
            self.closed = True
            buffer.clear()
            self._kept = 0
        elif source is buffer:
            del buffer[:pos]
            self._kept = len(buffer)
        elif pos < len(source):
            buffer += memoryview(data)[pos:]
            self._kept = len(buffer)
        return commands
