"""CRC-32 as zlib computes it, at ISA-L's speed where its wheel is installed.

Two checksums run over many bytes: a Spark batch's write-ahead file (each item's bytes once by
the planner, once by an executor: ADR 0013) and a queue's checkpoint, which holds the bytes of
every open read (a ``monitor``'s batch waiting for its confirm: ADR 0022). zlib's ``crc32``
costs ~0.36 µs per KiB here, ISA-L's 0.03. ``isal`` comes with the ``spark`` extra, for the
machines its wheels are built for (setup.cfg); without it this is zlib's. Both give the same
checksum, so what one install writes another reads.
"""

from __future__ import annotations

__all__ = ["crc32"]

try:
    from isal.isal_zlib import crc32
except ImportError:  # no isal wheel for this machine, or no spark extra
    from zlib import crc32
