"""Job uuids: UUIDv7 in 32 hex digits, time-ordered, all different, across threads and refills."""

from __future__ import annotations

import threading
import time
import uuid

from zfab.core import ids


def test_uuids_are_version_7_in_32_hex_digits_and_distinct_across_refills() -> None:
    before = time.time_ns() // 1_000_000
    got = [ids.new_uuid() for _ in range(3 * ids._BATCH + 7)]
    after = time.time_ns() // 1_000_000

    assert all(len(u) == 32 and u == u.lower() and int(u, 16) >= 0 for u in got)
    assert len(set(got)) == len(got)
    parsed = [uuid.UUID(u) for u in got]
    assert {(p.version, p.variant) for p in parsed} == {(7, uuid.RFC_4122)}
    # the first 48 bits are the Unix time in ms: a later uuid never sorts before an earlier ms
    stamps = [int(u[:12], 16) for u in got]
    assert before <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= after


def test_the_bits_after_the_time_are_random() -> None:
    # 74 random bits: uuids of the same millisecond differ, and not by a counter
    a, b = ids.uuid7(1_000, 0), ids.uuid7(1_000, (1 << 74) - 1)
    assert a[:12] == b[:12] == f"{1_000:012x}" and a[12] == b[12] == "7"
    assert uuid.UUID(a).int & ~((1 << 80) - 1) == uuid.UUID(b).int & ~((1 << 80) - 1)
    tails = {ids.new_uuid()[13:] for _ in range(500)}
    assert len(tails) == 500
    assert len({t[-1] for t in tails}) > 8  # the low digits vary (were it a counter, they would climb)


def test_threads_never_get_the_same_uuid() -> None:
    out: list[list[str]] = [[] for _ in range(4)]

    def take(i: int) -> None:
        out[i].extend(ids.new_uuid() for _ in range(2000))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    flat = [u for part in out for u in part]
    assert len(flat) == 8000 and len(set(flat)) == 8000
