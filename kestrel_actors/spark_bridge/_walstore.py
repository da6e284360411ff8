"""Where the ``kestrel`` source's write-ahead log lives (``walLocation``): a local directory
(a path or ``file://``) or an S3 prefix (``s3a://`` or ``s3://``, through ``pyarrow.fs``).

The log (:mod:`._wal`) needs five things of its storage, and each store gives them:

* **stage, then publish**: a batch's file must appear under its name whole and durable, or
  not at all, because a restart replays whatever it finds there. A directory stages a
  temporary file and ``fsync``s it; publishing renames it into place and ``fsync``s the
  directory. An object store has no rename and no append, so nothing is written until
  publishing, which is **one PUT of the whole object under its final name**: S3 makes an
  object visible only once its upload is complete (a single PUT, or a multipart upload's
  completion), never part of one, and a later read or listing sees it (S3 is strongly
  consistent). A PUT under an existing name replaces the object whole, as a rename does.
* ranges of a published file (an executor's slice), the whole file (a replay), whether one
  exists, the names listed, and deleting one. A directory's ranges are read (one ``pread``
  each, into the ``bytes`` an executor hands to Arrow), not mapped: on shared storage a file
  that another host removes while a late task still reads it would end a mapping's reader
  with SIGBUS, where a read fails with an ordinary error or keeps the bytes it read.

An unsupported scheme (``hdfs://``, ``gs://``, ...) is refused when the options are parsed, so
a query never writes its log into a local directory named after the scheme.

S3's endpoint and credentials come from the options ``walS3Endpoint``, ``walS3AccessKey``,
``walS3SecretKey`` and ``walS3Region`` (they travel with the query to the executors), or else
from the AWS SDK's usual places on each process: ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
``AWS_REGION``, ``~/.aws``, an instance profile. (Hadoop's ``spark.hadoop.fs.s3a.*`` settings are not read:
a Python data source runs in Python workers, which do not see Spark's configuration.)
"""

from __future__ import annotations

import functools
import os
import re
import stat
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

__all__ = ["S3_OPTIONS", "S3Access", "Staged", "WalLocation", "WalStore", "open_store"]

SUPPORTED = "a local path, file:///path, or s3a://bucket/prefix (s3:// too)"
_S3_SCHEMES = ("s3a", "s3")
Buffer = bytes | memoryview
"""Bytes read from the log: a copy, or a view of memory that stays valid while it lives."""
# Option names as written in the docs; SourceOptions hands them over lower-cased.
S3_OPTIONS = ("walS3Endpoint", "walS3AccessKey", "walS3SecretKey", "walS3Region")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


@dataclass(frozen=True)
class S3Access:
    """How to reach an S3-compatible store; a field left None is taken from the AWS SDK's
    environment variables and files on the process that opens the store."""

    endpoint: str | None = None  # http(s)://host:port
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    region: str | None = None


@dataclass(frozen=True)
class WalLocation:
    """``walLocation`` parsed: a local directory, or an S3 bucket and key prefix."""

    text: str  # as the user wrote it, for messages
    scheme: str  # "file" or "s3"
    root: str  # the directory, or "bucket/prefix" (no trailing slash)
    s3: S3Access | None = None

    @classmethod
    def parse(cls, text: str, options: Mapping[str, str] | None = None) -> WalLocation:
        """``text`` as a location; ``options`` are the source's options (lower-cased names),
        of which the ``walS3*`` ones matter. ValueError names what is wrong."""
        settings = {k.lower(): v for k, v in (options or {}).items()}
        given = [name for name in S3_OPTIONS if settings.get(name.lower())]
        scheme = "" if _WINDOWS_DRIVE.match(text) else urlsplit(text).scheme.lower()
        if scheme in ("", "file"):
            if given:
                raise ValueError(f"{text!r} is a local directory, so {', '.join(given)} does "
                                 f"not apply (it is for an s3a:// walLocation)")
            directory = text.removeprefix("file:")
            if text.startswith("file://"):
                parts = urlsplit(text)
                if parts.netloc not in ("", "localhost"):
                    raise ValueError(f"{text!r} names host {parts.netloc!r}: a file:// "
                                     f"walLocation is a path on every machine, file:///path")
                directory = unquote(parts.path)
            if not directory:
                raise ValueError(f"{text!r} names no directory; give {SUPPORTED}")
            return cls(text, "file", directory)
        if scheme in _S3_SCHEMES:
            parts = urlsplit(text)
            bucket, prefix = parts.netloc, parts.path.strip("/")
            if not bucket:
                raise ValueError(f"{text!r} names no bucket; write s3a://bucket/prefix")
            endpoint = settings.get("wals3endpoint") or None
            if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
                raise ValueError(f"{text!r}: walS3Endpoint must be http(s)://host[:port], "
                                 f"got {endpoint!r}")
            access = S3Access(endpoint, settings.get("wals3accesskey") or None,
                              settings.get("wals3secretkey") or None,
                              settings.get("wals3region") or None)
            return cls(text, "s3", f"{bucket}/{prefix}" if prefix else bucket, access)
        raise ValueError(f"{text!r}: scheme {scheme!r} is not supported by the write-ahead "
                         f"log; give {SUPPORTED}")

    def uri(self, name: str) -> str:
        """Where file ``name`` is, as a user would write it (for messages and slices)."""
        if self.scheme == "file":
            return str(Path(self.root) / name)
        return f"s3://{self.root}/{name}"


class Staged(Protocol):
    """A file written but not yet in the log: :meth:`publish` puts it under its name."""

    def publish(self) -> None: ...

    def discard(self) -> None: ...


class WalStore(Protocol):
    """The storage of one write-ahead log; names are file names inside it."""

    location: WalLocation

    def ensure(self) -> None:
        """Make the directory, or check the bucket is there (the planner, at start)."""

    def stage(self, name: str, chunks: list[bytes | bytearray | memoryview]) -> Staged: ...

    def names(self) -> list[str]: ...

    def exists(self, name: str) -> bool: ...

    def read(self, name: str) -> bytes: ...

    def read_ranges(self, name: str, ranges: Iterable[tuple[int, int]]) -> list[Buffer]:
        """The bytes at each (offset, size), shorter where the file ends first;
        FileNotFoundError if there is no such file."""

    def delete(self, name: str) -> None:
        """Remove the file if it is there."""

    def retire(self, name: str) -> None:
        """A batch's file Spark has committed: gone from the log (a directory keeps it as a
        spare to write the next batch over, :class:`LocalStore`)."""

    def close(self) -> None:
        """The planner stops: what it kept for its next batches (spares) goes, unless the
        next planner may use it (:class:`LocalStore`)."""

    def touch(self, name: str) -> None:
        """An empty file (tests' markers)."""


def open_store(location: WalLocation) -> WalStore:
    """The store of ``location``, one per process and location (executors open it per task)."""
    return _open(location)


@functools.lru_cache(maxsize=8)
def _open(location: WalLocation) -> WalStore:
    if location.scheme == "file":
        return LocalStore(location)
    return S3Store(location)


# -- a local (or shared, mounted) directory ---------------------------------------------------


@dataclass
class _StagedFile:
    temporary: Path
    final: Path
    directory: Path

    def publish(self) -> None:
        os.replace(self.temporary, self.final)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def discard(self) -> None:
        self.temporary.unlink(missing_ok=True)


_SPARES = 2
"""Retired batch files kept to write the next batches over: the read-ahead's batch is written
while Spark runs the one before, so two are in use at a time."""
_SPARE = re.compile(r"^\.spare-(\d+)-\d+\.wal$")
SHELF_VARIABLE = "KESTREL_WAL_SPARES"


def spare_shelf() -> Path | None:
    """Where a directory's planners keep their spares (:class:`LocalStore`):
    ``$KESTREL_WAL_SPARES``, empty for none; by default ``<tempdir>/kestrel-wal-spares-<uid>``.
    None unless it is a directory of this user's that no one else can read: a spare holds a
    batch's item bytes."""
    given = os.environ.get(SHELF_VARIABLE)
    if given == "":
        return None
    shelf = Path(given or Path(tempfile.gettempdir()) / f"kestrel-wal-spares-{os.getuid()}")
    try:
        shelf.mkdir(mode=0o700, parents=given is not None, exist_ok=True)
        status = shelf.lstat()
    except OSError:
        return None
    mine = stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid()
    return shelf if mine and not status.st_mode & 0o077 else None


class LocalStore:
    """A directory. A batch's file is written over a retired one's (a spare, at most
    :data:`_SPARES`), not created and deleted each batch: overwriting pages a file has costs
    the planner no new blocks and page-cache pages (ADR 0022). A task still reading a retired
    file once it is written over reads another batch's bytes, which its slice's checksum
    refuses (ADR 0013).

    The spares are kept on the shelf (:func:`spare_shelf`) when it is on the directory's file
    system: a planner's spares outlive it (Spark ends a query's planner process without a
    ``stop``), and the next planner's first batches, of any query, are written over them
    instead of new files (~0.1 s of CPU per 50 MB new, on a guest that hands free memory back
    to its host). Otherwise they are ``.spare-<pid>-<n>.wal`` in the directory, removed at
    ``stop`` (a killed planner's at the next start). A spare never has a batch's name: it
    becomes one only as a batch written over it whole, truncated, synced and renamed, as a
    new file is."""

    def __init__(self, location: WalLocation) -> None:
        self.location = location
        self.directory = Path(location.root)
        self._lock = threading.Lock()  # the read-ahead stages while Spark's calls retire
        self._retired = 0

    @functools.cached_property
    def _shelf(self) -> Path | None:
        # looked for by a planner only (an executor's store never writes), once the
        # directory exists
        shelf = spare_shelf()
        try:
            same = shelf is not None and shelf.stat().st_dev == self.directory.stat().st_dev
        except OSError:
            return None
        return shelf if same else None

    def ensure(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in self.names():  # a killed planner's spares
            if (m := _SPARE.match(name)) and not _alive(int(m.group(1))):
                (self.directory / name).unlink(missing_ok=True)

    def stage(self, name: str, chunks: list[bytes | bytearray | memoryview]) -> Staged:
        temporary = self.directory / f".{name}.tmp"
        flags = os.O_WRONLY | os.O_CREAT
        spare = self._take_spare(sum(len(chunk) for chunk in chunks))
        try:
            if spare is None:
                raise FileNotFoundError
            os.replace(spare, temporary)  # (another planner may have taken a shelf's first)
        except FileNotFoundError:
            flags |= os.O_TRUNC
        with open(os.open(temporary, flags, 0o666), "wb") as out:
            out.writelines(chunks)
            out.flush()
            out.truncate()  # a spare longer than this batch ends here
            os.fsync(out.fileno())
        return _StagedFile(temporary, self.directory / name, self.directory)

    def _spares(self) -> list[tuple[int, Path]]:
        """Each spare's size and path (this process's only, in the directory)."""
        if (shelf := self._shelf) is not None:
            paths = list(shelf.iterdir())
        else:
            mine = f".spare-{os.getpid()}-"
            paths = [self.directory / n for n in self.names() if n.startswith(mine)]
        sized = []
        for path in paths:
            try:
                sized.append((path.stat().st_size, path))
            except FileNotFoundError:
                continue  # taken by another planner
        return sized

    def _take_spare(self, size: int) -> Path | None:
        """The largest spare at most twice ``size``: writing a batch over a much longer one
        would truncate away the pages a later, full batch could have used (the first
        batch is small, ADR 0013 decision 7)."""
        with self._lock:
            fits = [each for each in self._spares() if each[0] <= 2 * size]
            return max(fits)[1] if fits else None

    def retire(self, name: str) -> None:
        path = self.directory / name
        with self._lock:
            spares = self._spares()
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return
            if len(spares) >= _SPARES:
                smallest = min(spares)
                if smallest[0] >= size:
                    path.unlink(missing_ok=True)
                    return
                smallest[1].unlink(missing_ok=True)
            self._retired += 1
            pid, shelf = os.getpid(), self._shelf
            spare = shelf / f"{pid}-{self._retired}.wal" if shelf is not None \
                else self.directory / f".spare-{pid}-{self._retired}.wal"
            try:
                os.replace(path, spare)
            except FileNotFoundError:
                return
            except OSError:  # a shelf on another file system after all (EXDEV)
                self._shelf = None
                path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._shelf is None:
            with self._lock:
                for _, spare in self._spares():
                    spare.unlink(missing_ok=True)

    def names(self) -> list[str]:
        return os.listdir(self.directory)

    def exists(self, name: str) -> bool:
        return (self.directory / name).exists()

    def read(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()

    def read_ranges(self, name: str, ranges: Iterable[tuple[int, int]]) -> list[Buffer]:
        # Read, not mapped: a mapped file that another host removes or truncates (a shared
        # file system, a zombie or speculative task still reading) ends the Python worker
        # with SIGBUS; a read gets an ordinary error, or bytes that no later change touches.
        # It costs ~0.1 us per row more than a mapping (the kernel's copy; ADR 0022).
        fd = os.open(self.directory / name, os.O_RDONLY)
        try:
            return [_read_at(fd, offset, size) for offset, size in ranges]
        finally:
            os.close(fd)

    def delete(self, name: str) -> None:
        (self.directory / name).unlink(missing_ok=True)

    def touch(self, name: str) -> None:
        (self.directory / name).touch()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a spare's owner)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_at(fd: int, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset``, fewer only where the file ends (a read may return less
    than asked, on a network file system for one, without being at the end)."""
    got = os.pread(fd, size, offset)
    while len(got) < size:
        more = os.pread(fd, size - len(got), offset + len(got))
        if not more:
            break
        got += more
    return got


# -- an S3 prefix ------------------------------------------------------------------------------


@dataclass
class _StagedObject:
    store: S3Store
    name: str
    chunks: list[bytes | bytearray | memoryview]

    def publish(self) -> None:
        self.store.put(self.name, self.chunks)
        self.chunks = []  # (views of the planner's buffers, which go back to its pool)

    def discard(self) -> None:
        self.chunks = []  # nothing was written


class S3Store:
    """An S3 prefix through ``pyarrow.fs.S3FileSystem`` (pyarrow is the source's dependency
    already; its S3 support is in the wheels)."""

    def __init__(self, location: WalLocation) -> None:
        from pyarrow import fs

        self.location = location
        access = location.s3 or S3Access()
        endpoint = access.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") \
            or os.environ.get("AWS_ENDPOINT_URL")
        settings: dict[str, Any] = {"region": access.region or os.environ.get("AWS_REGION")
                                    or os.environ.get("AWS_DEFAULT_REGION")}
        if endpoint:
            parts = urlsplit(endpoint)
            settings.update(scheme=parts.scheme or "https",
                            endpoint_override=parts.netloc or parts.path)
        if access.access_key or access.secret_key:
            settings.update(access_key=access.access_key, secret_key=access.secret_key)
        self.endpoint = endpoint or "AWS"
        self.fs = fs.S3FileSystem(**{k: v for k, v in settings.items() if v is not None})
        self._fs = fs

    def _key(self, name: str) -> str:
        return f"{self.location.root}/{name}"

    def ensure(self) -> None:
        bucket = self.location.root.split("/", 1)[0]
        if self.fs.get_file_info(bucket).type == self._fs.FileType.NotFound:
            raise FileNotFoundError(
                f"kestrel source: walLocation {self.location.text}: bucket {bucket} does not "
                f"exist at {self.endpoint} (the source does not create buckets)")

    def stage(self, name: str, chunks: list[bytes | bytearray | memoryview]) -> Staged:
        return _StagedObject(self, name, chunks)

    def put(self, name: str, chunks: list[bytes | bytearray | memoryview]) -> None:
        """One object written whole: it is visible only once the upload completes."""
        with self.fs.open_output_stream(self._key(name)) as out:
            for chunk in chunks:
                out.write(chunk)

    def names(self) -> list[str]:
        listed = self.fs.get_file_info(self._fs.FileSelector(self.location.root,
                                                             allow_not_found=True))
        return [info.base_name for info in listed if info.type == self._fs.FileType.File]

    def exists(self, name: str) -> bool:
        return bool(self.fs.get_file_info(self._key(name)).type == self._fs.FileType.File)

    def read(self, name: str) -> bytes:
        with self.fs.open_input_file(self._key(name)) as f:
            return bytes(f.readall())

    def read_ranges(self, name: str, ranges: Iterable[tuple[int, int]]) -> list[Buffer]:
        with self.fs.open_input_file(self._key(name)) as f:
            return [memoryview(f.read_at(size, offset)) for offset, size in ranges]

    def delete(self, name: str) -> None:
        try:
            self.fs.delete_file(self._key(name))
        except FileNotFoundError:
            pass

    def retire(self, name: str) -> None:
        # An object is written whole by one PUT: there are no pages to write over.
        self.delete(name)

    def close(self) -> None:
        pass

    def touch(self, name: str) -> None:
        self.put(name, [])
