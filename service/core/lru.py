"""One bounded table in use order: the least recently used entries go first once it is over its bounds.

Bounded by count and, where its entries hold payloads, by bytes: `size(value)` says what an entry
holds, and whoever changes what an entry holds says so (`grew`), so the byte total is always the sum
of the entries' sizes. What may go is the owner's rule (`shed(evictable)`: a job still running stays,
and the oldest that may go goes instead), so one helper serves the API's job table, its caches and
a worker's recent jobs. Pure; one owner thread for the entries, though `grew` may be called from any
thread (a worker's pool threads report a result's size while its owner loop adds and sheds).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_NOTHING: tuple[()] = ()  # what shed() returns when nothing went: no list made on the common path


class BoundedLRU(Generic[K, V]):
    """At most `max_count` entries and, with `size`, at most `max_bytes` of them (what `shed` keeps)."""

    __slots__ = ("_entries", "_lock", "bytes", "max_bytes", "max_count", "size")

    def __init__(self, *, max_count: int, max_bytes: int | None = None, size: Callable[[V], int] | None = None) -> None:
        if max_count < 1:
            raise ValueError("a bounded LRU needs max_count >= 1")
        if (max_bytes is None) != (size is None):
            raise ValueError("a byte bound needs the size of an entry, and a size needs a byte bound")
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.size = size
        self.bytes = 0  # the sum of size(value) over the entries
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()  # byte updates only: grew() comes from other threads

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The entry, its place unchanged (a read that should keep it, use `touch`)."""
        return self._entries.get(key)

    def touch(self, key: K) -> V | None:
        """The entry, made the most recently used."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V | None:
        """Add or replace an entry, as the most recently used; the entry it replaced, if any. Nothing
        goes here: `shed` says what does, by the owner's rule."""
        entries = self._entries
        old = entries.get(key)
        if old is not None:
            entries.move_to_end(key)
        entries[key] = value
        size = self.size
        if size is not None:
            delta = size(value) - (size(old) if old is not None else 0)
            if delta:
                with self._lock:
                    self.bytes += delta
        return old

    def pop(self, key: K) -> V | None:
        """Take an entry out; None when there is none."""
        value = self._entries.pop(key, None)
        if value is not None and self.size is not None:
            self.grew(-self.size(value))
        return value

    def grew(self, delta: int) -> None:
        """An entry's size changed by `delta` bytes (any thread)."""
        with self._lock:
            self.bytes += delta

    def over(self, *, by_bytes: bool = True) -> bool:
        """Past the count bound or (with by_bytes) the byte bound."""
        if len(self._entries) > self.max_count:
            return True
        return by_bytes and self.max_bytes is not None and self.bytes > self.max_bytes

    def shed(self, evictable: Callable[[V], bool] | None = None, *, by_bytes: bool = True) -> Sequence[V]:
        """Take out the least recently used entries `evictable` lets go (all, without it) while over the
        bounds (only the count bound unless by_bytes), and return them. An entry that may not go keeps
        its place; what it holds is bounded elsewhere (the jobs in flight)."""
        entries = self._entries
        max_count = self.max_count
        max_bytes = self.max_bytes if by_bytes else None
        if len(entries) <= max_count and (max_bytes is None or self.bytes <= max_bytes):
            return _NOTHING  # the common case: one length and one comparison, nothing made
        size = self.size
        gone: list[V] = []
        freed = 0
        while len(entries) > max_count or (max_bytes is not None and self.bytes - freed > max_bytes):
            # The oldest that may go (usually the oldest itself); the walk ends before the table changes.
            for oldest in entries.items():
                if evictable is None or evictable(oldest[1]):
                    break
            else:
                break  # nothing may go
            key, value = oldest
            del entries[key]
            gone.append(value)
            if size is not None:
                freed += size(value)
        if freed:
            with self._lock:
                self.bytes -= freed
        return gone

    def keys(self) -> Iterator[K]:
        return iter(self._entries)

    def values(self) -> Iterator[V]:
        """Least recently used first."""
        return iter(self._entries.values())

    def newest(self) -> Iterator[V]:
        """Most recently used first."""
        return reversed(self._entries.values())

    def newest_items(self) -> Iterator[tuple[K, V]]:
        """(key, value), most recently used first."""
        return reversed(self._entries.items())
