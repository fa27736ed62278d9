"""core/lru.py: the one bounded table in use order that the API's caches and tables and a worker's recent
jobs are built on (by count, and by bytes where entries hold payloads; what may go is the owner's rule)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from zfab.core.lru import BoundedLRU


@dataclass
class Entry:
    size: int
    done: bool = True


def sized(max_count: int, max_bytes: int) -> BoundedLRU[str, Entry]:
    return BoundedLRU(max_count=max_count, max_bytes=max_bytes, size=lambda e: e.size)


def test_past_its_count_the_least_recently_used_goes_first() -> None:
    # Given a table of three, where "a" was read (touched) after "b" was added
    lru: BoundedLRU[str, int] = BoundedLRU(max_count=3)
    for i, key in enumerate("abc"):
        lru.put(key, i)
    assert lru.touch("a") == 0
    # When a fourth arrives and the table sheds
    lru.put("d", 3)
    gone = lru.shed()
    # Then "b", the least recently used, went; a plain get does not reorder
    assert list(gone) == [1] and list(lru.keys()) == ["c", "a", "d"]
    assert lru.get("c") == 2 and list(lru.keys()) == ["c", "a", "d"]
    assert list(lru.newest()) == [3, 0, 2]


def test_nothing_goes_within_the_bounds_and_no_list_is_made_for_it() -> None:
    lru = sized(2, 100)
    lru.put("a", Entry(10))
    assert lru.shed() == () and lru.shed(lambda e: True) == ()
    assert len(lru) == 1 and lru.bytes == 10


def test_the_byte_total_is_the_sum_of_the_entries_through_put_replace_grow_and_pop() -> None:
    lru = sized(10, 100)
    a, b = Entry(30), Entry(20)
    lru.put("a", a)
    lru.put("b", b)
    assert lru.bytes == 50
    lru.put("a", Entry(5))  # a replaced: its old size leaves the total
    assert lru.bytes == 25
    b.size += 70
    lru.grew(70)  # whoever changes an entry says so
    assert lru.bytes == 95 and not lru.over()
    assert lru.pop("b") is b and lru.bytes == 5
    assert lru.pop("nope") is None and lru.bytes == 5


def test_past_its_bytes_only_entries_the_owner_lets_go_are_shed_and_the_others_keep_their_place() -> None:
    # Given a running job (may not go) as the oldest entry, then finished ones
    lru = sized(10, 100)
    lru.put("running", Entry(60, done=False))
    lru.put("f1", Entry(30))
    lru.put("f2", Entry(30))
    # When over its bytes, shed by the owner's rule
    gone = lru.shed(lambda e: e.done)
    # Then the oldest finished one went, the running one stayed first, and the total fits
    assert [e.size for e in gone] == [30] and list(lru.keys()) == ["running", "f2"] and lru.bytes == 90


def test_the_count_bound_alone_sheds_any_entry_and_leaves_the_bytes_to_the_owners_rule() -> None:
    lru = sized(2, 10)
    lru.put("a", Entry(8, done=False))
    lru.put("b", Entry(8, done=False))
    lru.put("c", Entry(8, done=False))
    assert [e.size for e in lru.shed(by_bytes=False)] == [8]  # count: finished or not
    assert list(lru.keys()) == ["b", "c"] and lru.bytes == 16 and lru.over() and not lru.over(by_bytes=False)
    assert lru.shed(lambda e: e.done) == []  # bytes: nothing the owner lets go
    assert lru.bytes == 16


def test_sizes_reported_from_other_threads_all_count() -> None:
    lru = sized(10, 10**9)

    def grow() -> None:
        for _ in range(10_000):
            lru.grew(1)

    threads = [threading.Thread(target=grow) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert lru.bytes == 40_000


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_count": 0}, "max_count"),
        ({"max_count": 1, "max_bytes": 10}, "size"),
        ({"max_count": 1, "size": len}, "byte bound"),
    ],
)
def test_a_table_without_a_bound_is_refused(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        BoundedLRU(**kwargs)  # type: ignore[arg-type]
