"""Job uuids: 32 hex digits, all different, across threads and refills."""

from __future__ import annotations

import threading

from service.core import ids


def test_uuids_are_32_hex_digits_and_distinct_across_refills() -> None:
    got = [ids.new_uuid() for _ in range(3 * ids._BATCH + 7)]
    assert all(len(u) == 32 and int(u, 16) >= 0 for u in got)
    assert len(set(got)) == len(got)


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
