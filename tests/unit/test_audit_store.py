"""The audit log's SQLite table (api/store/audit.py): filters, paging newest first, and its bounds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from zfab.api.store.audit import SqliteAudit


def test_entries_are_paged_newest_first_filtered_and_bounded_by_count_and_age(tmp_path: Path) -> None:
    async def go() -> None:
        store = SqliteAudit(tmp_path / "api.sqlite", max_count=5, max_age=3600)
        now = time.time()
        await store.add([(now - 7200, "old", "admin", "DELETE /schedules/{sid}", "/schedules/a", "1.2.3.4", 204)])
        for i in range(6):
            who = "alice" if i % 2 else "bob"
            await store.add([(now + i, who, "admin", "POST /mmi/services/{service}/pause", f"/x/{i}", "::1", 200)])
        rows, total = await store.page(None, None, None, 100, 0)
        assert total == 6 and [r[4] for r in rows] == [f"/x/{i}" for i in range(5, -1, -1)]
        store._pruned_at = 0.0  # the next write prunes
        await store.add([(now + 9, "carol", "operator", "PUT /mmi/x", "/x/9", "::1", 403)])
        rows, total = await store.page(None, None, None, 100, 0)
        assert total == 5 and rows[0][1] == "carol" and "old" not in {r[1] for r in rows}
        rows, total = await store.page("alice", "pause", now + 2, 1, 0)
        assert total == 2 and rows[0][4] == "/x/5"
        assert (await store.page("alice", "pause", now + 2, 1, 1))[0][0][4] == "/x/3"
        await store.close()
        again = SqliteAudit(tmp_path / "api.sqlite", max_count=5, max_age=3600)  # kept across a restart
        assert (await again.page(None, None, None, 10, 0))[1] == 5
        await again.close()

    asyncio.run(go())
