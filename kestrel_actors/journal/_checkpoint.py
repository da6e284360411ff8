"""A queue's checkpoint: where its items start in the journal files, so a restart replays only
what was written after it (behaviour §6.8).

A queue is, at any moment, the items an UNREMOVE put back at its head (the *front*, few: they
are written out whole), then an unbroken run of the queue's add records (ADD and CONTINUE)
from its head to its tail: every add appends at the tail and every removal takes the head.
So the queue's state at a journal position is: the front items, the open reads, the xid, its
item and byte counts, and where in the files its first add record is. The live journal counts
the add records (``added``) and the ones removed from the run (``consumed``), and remembers the
place of every ``MARK_EVERY``-th add record (``_sequence.AddSequence``): the head is the last
mark at or before ``consumed``, plus a few records to skip.

The file is ``<data_dir>/.checkpoint/<name>``: the line ``kestrel-checkpoint 2``, one line of
JSON (the state; each item's length, add time and expiry), the items' bytes back to back (the
front, then the open reads), and the CRC-32 of all that in hex. The bytes are not in the JSON:
one taken while a ``monitor`` holds 10,000 reads of 1 KiB open cost the server about 450 million
instructions as base64 inside JSON (version 1, still read), 30 million as they are. It is written to
``<name>~~tmp`` in that directory, fsynced, renamed into place and the directory fsynced, after
the journal records up to its position were fsynced. Journal files are named in it by name,
inode number and size, and the 64 bytes before the checkpoint's position by their CRC-32: a
restart uses it only if every file it names is still there (under any name: a rotation may
have renamed the current file), in order, with the recorded bytes. Anything else (no file, a
bad CRC, a file gone, packed or cut) is a full replay. A rewrite or pack, which replaces the
files, deletes the checkpoint before it commits.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any

import structlog

from .._crc import crc32
from ..queue import Item
from ._files import CHECKPOINT_DIR, fsync_dir, open_regular

__all__ = [
    "CHECKPOINT_DIR",
    "Checkpoint",
    "CheckpointFile",
    "read_checkpoint",
    "remove_checkpoint",
    "tail_crc",
    "write_checkpoint",
]

log = structlog.get_logger("kestrel_actors.journal")

MAGIC = b"kestrel-checkpoint 2\n"
MAGIC_V1 = b"kestrel-checkpoint 1\n"
TAIL_BYTES = 64
"""Bytes before the checkpoint's position whose CRC-32 it records."""


@dataclass
class CheckpointFile:
    name: str
    inode: int
    size: int
    """An archive's size; for the last file, the checkpoint's position in it."""


@dataclass
class Checkpoint:
    queue: str
    files: list[CheckpointFile]
    """From the file of the head's mark to the file of the checkpoint's position."""
    tail_crc: int
    head_offset: int
    head_skip: int
    length: int
    bytes: int
    xid: int
    added: int
    consumed: int
    front: list[Item]
    open_items: dict[int, Item]
    marks: list[list[int]]
    """``[index, file number in files, offset]`` of the marks after the head's."""


def encode(ck: Checkpoint) -> bytes:
    datas = [item.data for item in ck.front]
    datas.extend(item.data for item in ck.open_items.values())
    body = json.dumps({
        "queue": ck.queue, "files": [[f.name, f.inode, f.size] for f in ck.files], "tail_crc": ck.tail_crc,
        "head_offset": ck.head_offset, "head_skip": ck.head_skip, "length": ck.length, "bytes": ck.bytes,
        "xid": ck.xid, "added": ck.added, "consumed": ck.consumed,
        "front": [[len(i.data), i.add_time, i.expiry] for i in ck.front],
        "open": [[xid, len(i.data), i.add_time, i.expiry] for xid, i in ck.open_items.items()], "marks": ck.marks,
    }, separators=(",", ":")).encode("ascii") + b"\n"
    whole = b"".join([MAGIC, body, *datas])
    return whole + b"%08x\n" % crc32(whole)


def decode(raw: bytes) -> Checkpoint:
    """The checkpoint in ``raw``; ValueError (or KeyError, TypeError) if it is damaged."""
    if raw.startswith(MAGIC_V1):
        return _decode_v1(raw)
    whole, crc = raw[:-9], raw[-9:]
    if not whole.startswith(MAGIC) or crc[-1:] != b"\n" or int(crc[:-1], 16) != crc32(whole):
        raise ValueError("bad checksum")
    end = whole.index(b"\n", len(MAGIC))
    doc = json.loads(whole[len(MAGIC):end])
    at = end + 1

    def item(length: object, add_time: object, expiry: object) -> Item:
        nonlocal at
        start, at = at, at + int(length)  # type: ignore[call-overload]
        if at > len(whole):
            raise ValueError("an item runs past the end")
        return Item(whole[start:at], int(add_time), int(expiry))  # type: ignore[call-overload]

    front = [item(*fields) for fields in doc["front"]]
    open_items = {}
    for xid, *fields in doc["open"]:
        opened = item(*fields)
        opened.xid = int(xid)
        open_items[int(xid)] = opened
    if at != len(whole):
        raise ValueError("bytes after the last item")
    return _state(doc, front, open_items)


def _decode_v1(raw: bytes) -> Checkpoint:
    """Version 1: the items' bytes in base64 inside the JSON."""
    head, _, crc = raw.rstrip(b"\n").rpartition(b"\n")
    head += b"\n"
    if int(crc, 16) != crc32(head):
        raise ValueError("bad checksum")
    doc = json.loads(head[len(MAGIC_V1):])
    open_items = {}
    for xid, *fields in doc["open"]:
        item = _unitem_v1(fields)
        item.xid = int(xid)
        open_items[int(xid)] = item
    return _state(doc, [_unitem_v1(f) for f in doc["front"]], open_items)


def _unitem_v1(fields: list[object]) -> Item:
    data, add_time, expiry = fields
    return Item(base64.b64decode(str(data)), int(add_time), int(expiry))  # type: ignore[call-overload]


def _state(doc: dict[str, Any], front: list[Item], open_items: dict[int, Item]) -> Checkpoint:
    return Checkpoint(
        queue=doc["queue"], files=[CheckpointFile(str(n), int(i), int(s)) for n, i, s in doc["files"]],
        tail_crc=int(doc["tail_crc"]), head_offset=int(doc["head_offset"]), head_skip=int(doc["head_skip"]),
        length=int(doc["length"]), bytes=int(doc["bytes"]), xid=int(doc["xid"]), added=int(doc["added"]),
        consumed=int(doc["consumed"]), front=front, open_items=open_items,
        marks=[[int(a), int(b), int(c)] for a, b, c in doc["marks"]])


def _path(data_dir: str, name: str) -> str:
    return os.path.join(data_dir, CHECKPOINT_DIR, name)


def tail_crc(source: str | int, offset: int) -> int:
    """CRC-32 of the TAIL_BYTES before ``offset`` in file ``source`` (a path or an open
    descriptor; fewer bytes at a file's start)."""
    start = max(0, offset - TAIL_BYTES)
    if isinstance(source, int):
        return crc32(os.pread(source, offset - start, start))
    fd = open_regular(source)  # never through a symbolic link, never a pipe
    try:
        return crc32(os.pread(fd, offset - start, start))
    finally:
        os.close(fd)


def write_checkpoint(data_dir: str, ck: Checkpoint) -> None:
    """Write ``ck`` atomically: temp file, fsync, rename, directory fsync (blocking)."""
    directory = os.path.join(data_dir, CHECKPOINT_DIR)
    os.makedirs(directory, exist_ok=True)
    temp = os.path.join(directory, ck.queue + "~~tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        data = encode(ck)
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, _path(data_dir, ck.queue))
    fsync_dir(directory)


def read_checkpoint(data_dir: str, name: str) -> Checkpoint | None:
    """Queue ``name``'s checkpoint, or None (none, or damaged: then logged and deleted)."""
    path = _path(data_dir, name)
    try:
        os.unlink(path + "~~tmp")  # a checkpoint whose writing was cut short: never renamed, never used
    except OSError:
        pass
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read a queue's checkpoint; replaying its whole journal", queue=name, error=str(exc))
        return None
    try:
        ck = decode(raw)
        if ck.queue != name:
            raise ValueError("another queue's checkpoint")
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("damaged checkpoint; replaying the whole journal", queue=name, error=str(exc))
        remove_checkpoint(data_dir, name)
        return None
    return ck


def remove_checkpoint(data_dir: str, name: str) -> None:
    """Delete queue ``name``'s checkpoint (and a temp file of one), durably (blocking)."""
    directory = os.path.join(data_dir, CHECKPOINT_DIR)
    removed = False
    for filename in (name, name + "~~tmp"):
        try:
            os.unlink(os.path.join(directory, filename))
            removed = True
        except FileNotFoundError:
            pass
    if removed:
        fsync_dir(directory)
