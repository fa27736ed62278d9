"""What a user set on the broker (paused queues, limits set at run time) kept in PostgreSQL when the
brokers share a PostgreSQL lease (service/broker/kept.py), on a real throwaway server (pgserver.py):
the broker that takes over reads what the deposed one wrote; a write never waits on the database
and one that fails is counted and tried again until the database is back.

Skipped where PostgreSQL is not installed, except under CI=true (.ci/run installs it), where that fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pgserver
import pytest
from fabric import wait_for

from zfab.broker.kept import FileKept, PgKept, open_kept, reread
from zfab.broker.limits import Limiter
from zfab.broker.paused import PausedServices
from zfab.core.limits import read_rule
from zfab.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pg() -> Iterator[pgserver.PgServer]:
    yield from pgserver.serving()


@pytest.fixture
def url(pg: pgserver.PgServer) -> str:
    return pg.create_database("kept")


def broker_state(url: str) -> tuple[PgKept, PausedServices, Limiter]:
    """What one broker of a pair holds: its kept store, its paused services and its limiter."""
    kept = open_kept(Settings(broker_lease=url))
    assert isinstance(kept, PgKept)
    return kept, PausedServices(kept, 100), Limiter(kept)


def test_a_broker_that_takes_over_starts_with_what_the_deposed_one_kept(url: str, pg: pgserver.PgServer) -> None:
    kept_a, paused_a, limits_a = broker_state(url)
    assert paused_a.pause(b"demo") and paused_a.pause(b"files")
    limits_a.set_rule(b"demo", "echo", read_rule({"concurrency": 2}))
    assert kept_a.flush(10)
    kept_a.close()
    # the table was made when missing, one row per kind under the lease's default name
    rows = pg.sql(url, "SELECT lease, kind FROM zfab_broker_kept ORDER BY kind")
    assert rows == [("zfab-broker", "limits"), ("zfab-broker", "paused")]
    kept_b, paused_b, limits_b = broker_state(url)
    paused_b.load()
    limits_b.load()
    assert paused_b.labels() == ["demo", "files"]
    assert limits_b.overrides[(b"demo", "echo")] == read_rule({"concurrency": 2})
    kept_b.close()


def test_a_standby_rereads_at_takeover_what_changed_since_it_started(url: str) -> None:
    kept_b, paused_b, limits_b = broker_state(url)
    paused_b.load()  # the standby starts: nothing paused yet
    kept_a, paused_a, limits_a = broker_state(url)
    paused_a.pause(b"demo")
    limits_a.set_rule(b"demo", "slow", None)  # a declared limit lifted at run time
    assert kept_a.flush(10)
    assert paused_b.labels() == []
    on_loop: list[str] = []

    def call(fn: object) -> None:  # the broker's loop.call: here, on this thread
        on_loop.append("applied")
        fn()  # type: ignore[operator]

    reread(kept_b, call, (paused_b.take, limits_b.take))
    assert on_loop == ["applied"]
    assert paused_b.labels() == ["demo"] and limits_b.overrides == {(b"demo", "slow"): None}
    # a resume at the new active broker is what the next one reads
    paused_b.resume(b"demo")
    assert kept_b.flush(10)
    kept_c, paused_c, _ = broker_state(url)
    paused_c.load()
    assert paused_c.labels() == []
    for k in (kept_a, kept_b, kept_c):
        k.close()


def test_a_reread_the_loop_cannot_take_is_logged_not_raised(url: str, caplog: pytest.LogCaptureFixture) -> None:
    kept, paused, limits = broker_state(url)

    def closed(fn: object) -> None:
        raise RuntimeError("the broker is shutting down")

    reread(kept, closed, (paused.take, limits.take))  # on the lease keeper's thread: it must go on
    assert "was not applied" in caplog.text
    kept.close()


def test_two_fabrics_on_one_database_keep_apart_by_lease_name(url: str) -> None:
    kept_a, paused_a, _ = broker_state(url + "#fabric-a")
    paused_a.pause(b"demo")
    assert kept_a.flush(10)
    kept_b, paused_b, _ = broker_state(url + "#fabric-b")
    paused_b.load()
    assert paused_b.labels() == []
    kept_a.close()
    kept_b.close()


def test_a_write_while_the_database_is_down_is_counted_and_made_when_it_is_back(pg: pgserver.PgServer) -> None:
    url = pg.create_database("down")
    kept, paused, _ = broker_state(url)
    paused.pause(b"before")
    assert kept.flush(10)
    pg.stop()
    try:
        paused.pause(b"during")  # returns at once: the writer thread meets the dead database
        assert paused.labels() == ["before", "during"]
        wait_for(lambda: paused.write_errors >= 1, 20, what="the failed write counted")
    finally:
        pg.start()
    wait_for(lambda: kept.flush(0.1), 30, what="the pending write made once PostgreSQL is back")
    again = PausedServices(open_kept(Settings(broker_lease=url)), 100)
    again.load()
    assert again.labels() == ["before", "during"]
    kept.close()
    again.kept.close()


def test_a_kept_document_that_cannot_be_read_pauses_nothing(url: str, pg: pgserver.PgServer) -> None:
    kept, paused, _ = broker_state(url)
    paused.pause(b"demo")
    assert kept.flush(10)
    pg.sql(url, 'UPDATE zfab_broker_kept SET doc = \'{"not": "a list"}\'::jsonb')
    fresh, fresh_limits = PausedServices(kept, 100), Limiter(kept)
    fresh.load()
    fresh_limits.load()
    assert fresh.labels() == [] and fresh_limits.overrides == {}
    kept.close()


def test_a_single_broker_or_a_kubernetes_lease_keeps_files(tmp_path: Path) -> None:
    for lease in (None, "k8s://zfab/zfab-broker"):
        kept = open_kept(Settings(broker_lease=lease, data_dir=str(tmp_path)))
        assert isinstance(kept, FileKept) and kept.directory == tmp_path / "broker"
