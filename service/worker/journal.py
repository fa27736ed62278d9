"""The job store's journal: rows made durable with one append, folded into SQLite later.

A job's result is reported once it is durable (write before report, runner.complete), and a received
job once recorded gets its 201. Committing each to SQLite first put a thread hand-off, a wake-up of
the store's writer and a transaction (about 55 us of it in SQLite alone) on every job's path: on a
sequential echo the worker spent 150 us of CPU per job on its store and the job waited for it. An
append to this file is one write(2) on the thread that has the rows (about 6 us), and the writer
folds the rows into SQLite in batches, off the job's path (jobstore.py).

Durability is the same as SQLite's WAL with synchronous=NORMAL, which the store used: what write(2)
returned survives a crash of the process (the kernel holds it), not of the machine. A store opened
after a crash replays what its journal holds into SQLite before it marks unfinished jobs interrupted,
so a job whose result was reported reads as finished, never as interrupted.

The file is a run of segments, `<store>.journal.<n>`; a new one starts past SEGMENT_BYTES, and a
segment is deleted once every row in it is committed to SQLite, so what the journal holds on disk is
bounded by what the writer has not folded yet (its bound is the store's) plus one segment.

A record is `kind (u8) | body length (u32) | crc32 of body (u32) | body`, little-endian. Kinds 3
(received jobs) and 4 (finished ones) have a MessagePack body: an array of rows, each an array of
its fields (nil, float, int, str, bin). Kinds 1 and 2 are the same rows in the format journals had
before 2026-12-05, still read so that an upgrade after a crash loses nothing: a row count (u32) and
each row's fields, each a tag and a value: `N` (None), `F` + float64, `I` + int64, `S` + u32 length
+ UTF-8, `B` + u32 length + bytes. Encoding a row the old way cost 3-4 us in Python against 0.2-0.3
us in msgspec (hot; more on a sequential job's cold path), twice per job. A record cut short by a
crash or failing its checksum ends the replay of its segment (counted in `torn`).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

log = logging.getLogger(__name__)

SEGMENT_BYTES = 8 * 1024 * 1024
INSERT, RESULT = 1, 2  # what a record holds: received jobs (jobstore.INSERT_SQL) or finished ones (RESULT_SQL)
_WRITTEN = {INSERT: 3, RESULT: 4}  # the kind byte a record is written with: MessagePack rows
_TAGGED = {1: INSERT, 2: RESULT}  # the kind bytes of older journals: tagged rows (_decode_tagged)
_READ = {**_TAGGED, **{byte: kind for kind, byte in _WRITTEN.items()}}  # what each kind byte holds
_encode = msgspec.msgpack.Encoder().encode
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16
_decode = msgspec.msgpack.Decoder(list[tuple[Any, ...]]).decode

_HEAD = struct.Struct("<BII")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_I64 = struct.Struct("<q")

Row = tuple[Any, ...]


def encode(rows: Sequence[Row]) -> bytes:
    """A record's body: its rows as MessagePack (bytes-like fields as bin, memoryviews included)."""
    return _encode(rows)


def decode(kind: int, body: bytes) -> list[Row]:
    """The rows of a record's body; ValueError when it does not add up."""
    if kind in _TAGGED:
        return _decode_tagged(body)
    try:
        return _decode(body)
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from None


def _decode_tagged(body: bytes) -> list[Row]:
    """A body of an older journal (kinds 1 and 2)."""
    try:
        (count,), at = _U32.unpack_from(body, 0), _U32.size
        rows: list[Row] = []
        for _ in range(count):
            (width,) = _U32.unpack_from(body, at)
            at += _U32.size
            row: list[Any] = []
            for _ in range(width):
                tag, at = body[at : at + 1], at + 1
                if tag == b"N":
                    row.append(None)
                elif tag == b"F":
                    row.append(_F64.unpack_from(body, at)[0])
                    at += _F64.size
                elif tag == b"I":
                    row.append(_I64.unpack_from(body, at)[0])
                    at += _I64.size
                elif tag in (b"S", b"B"):
                    (n,) = _U32.unpack_from(body, at)
                    at += _U32.size
                    if at + n > len(body):
                        raise ValueError("a field runs past its record")
                    raw = body[at : at + n]
                    at += n
                    row.append(raw.decode() if tag == b"S" else raw)
                else:
                    raise ValueError(f"unknown field tag {tag!r}")
            rows.append(tuple(row))
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    if at != len(body):
        raise ValueError("bytes left over after the rows")
    return rows


class Journal:
    """Appends records to the current segment and deletes segments once committed. `append` is
    thread-safe (a lock around the write, so records never interleave); the rest is the writer's."""

    def __init__(self, store_path: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.prefix = store_path.name + ".journal."
        self.folder = store_path.parent
        self.segment_bytes = segment_bytes
        self.lock = threading.Lock()
        self.segment = 0  # the number of the segment appends go to
        self.broken = False  # an append failed: the store commits before it reports from then on
        self.torn = 0  # records a replay found cut short or failing their checksum
        self._fd: int | None = None
        self._sizes: dict[int, int] = {}  # bytes in each segment on disk, by number (the current one too)

    def segments(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.folder.glob(self.prefix + "*"):
            suffix = path.name[len(self.prefix) :]
            if suffix.isdigit():
                found.append((int(suffix), path))
        return sorted(found)

    def replay(self) -> Iterator[tuple[int, list[Row]]]:
        """Every record left by a run that ended before its writer folded it, oldest first."""
        for number, path in self.segments():
            self.segment = max(self.segment, number + 1)
            data = path.read_bytes()
            self._sizes[number] = len(data)
            at = 0
            while at < len(data):
                try:
                    kind, size, crc = _HEAD.unpack_from(data, at)
                    body = data[at + _HEAD.size : at + _HEAD.size + size]
                    if kind not in _READ or len(body) != size or zlib.crc32(body) != crc:
                        raise ValueError("cut short or failing its checksum")
                    rows = decode(kind, body)
                except (struct.error, ValueError) as exc:
                    self.torn += 1
                    why = "the record at byte %d is unreadable (%s), so is the rest"
                    log.warning("job store journal %s: " + why, path, at, exc)
                    break
                at += _HEAD.size + size
                yield _READ[kind], rows

    def append(self, records: Sequence[tuple[int, Sequence[Row]]]) -> int:
        """Caller holds `lock`. Write records (kind, rows) in one write: their bytes, or 0 (and the
        journal is off from now on) when the write fails, so the caller commits before it reports."""
        if self.broken:
            return 0
        parts: list[bytes] = []
        size = 0  # counted as the parts are made: a sum over them afterwards cost a generator per append
        for kind, rows in records:
            body = _encode(rows)  # MessagePack copies a row's bytes once; writev takes the parts as they are
            parts += (_HEAD.pack(_WRITTEN[kind], len(body), zlib.crc32(body)), body)
            size += _HEAD.size + len(body)
        if len(parts) > _IOV_MAX:
            parts = [b"".join(parts)]  # more threads' records at once than one writev takes
        try:
            if self._fd is None or self._sizes[self.segment] >= self.segment_bytes:
                self._rotate()
            assert self._fd is not None
            written = os.writev(self._fd, parts)
            if written != size:
                raise OSError(f"short write: {written} of {size} bytes")
        except OSError as exc:
            self.broken = True
            why = "rows are committed before they are reported from now on"
            log.error("job store journal in %s failed (%s): %s", self.folder, exc, why)
            return 0
        self._sizes[self.segment] += written
        return written

    def _rotate(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.segment += 1
        path = self.folder / f"{self.prefix}{self.segment:08d}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._sizes.setdefault(self.segment, 0)

    @property
    def bytes_held(self) -> int:
        """Bytes in segments not deleted yet (a gauge: read without the lock)."""
        return sum(list(self._sizes.values()))  # list(): one step under the GIL

    def bound(self) -> int:
        """Caller holds `lock`: segments numbered below this hold only rows appended so far."""
        return self.segment + 1 if self.broken else self.segment

    def release(self, below: int) -> None:
        """Writer: delete the segments numbered below `below` (their rows are committed)."""
        for number in sorted(n for n in list(self._sizes) if n < below):  # list(): one step under the GIL
            try:
                (self.folder / f"{self.prefix}{number:08d}").unlink()
            except FileNotFoundError:
                pass
            del self._sizes[number]  # not under `lock`: appends touch only the newest segment's entry

    def close(self) -> None:
        """Writer, once everything is committed: no segment is needed any more."""
        with self.lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self.broken = True  # no append after close: a late write commits before it reports
            below = self.segment + 1
        self.release(below)
