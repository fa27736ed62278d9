"""Owner threads under SCHED_BATCH when asked (transport/scheduling.py, ZFAB_SCHED_BATCH, off by default):
the owner's thread and the ZeroMQ I/O thread its first socket starts take the policy; the application's
threads keep theirs; the default, and a system that refuses the call, leave every thread as it was, with the
loop working either way."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from test_loop import EchoRole, router  # noqa: F401  (the fixture)

from zfab.settings import Settings
from zfab.transport import scheduling
from zfab.transport.loop import OwnerLoop

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")


def policies() -> dict[str, set[int]]:
    """The scheduling policy of each of this process's threads, by thread name (/proc/self/task/*/stat)."""
    out: dict[str, set[int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            raw = Path(f"/proc/self/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        policy = int(raw[raw.rindex(")") + 2 :].split()[38])  # field 41 of proc(5): policy
        out.setdefault(name, set()).add(policy)
    return out


def echo_round_trip(r: Any, loop: OwnerLoop) -> None:
    loop.submit([b"ping"])
    _ident, *rest = r.recv_multipart()
    assert rest == [b"ping"]


def test_the_owner_thread_and_its_zeromq_io_thread_run_under_sched_batch(router: Any) -> None:  # noqa: F811
    # Given a started loop (its own context: its I/O thread starts with the owner's first socket)
    r, ep = router
    loop = OwnerLoop(EchoRole(ep), name="batched", sched_batch=True)
    loop.start()
    try:
        echo_round_trip(r, loop)
        # Then the owner's thread and the I/O thread its context started are SCHED_BATCH
        owner = loop._thread
        assert owner is not None and owner.native_id is not None
        assert loop.batched
        assert os.sched_getscheduler(owner.native_id) == os.SCHED_BATCH
        io = {n: p for n, p in policies().items() if n.startswith("ZMQbg/IO")}
        assert os.SCHED_BATCH in set().union(*io.values()), io
        # And the test's own thread (the application's) keeps its policy
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
        assert os.sched_getscheduler(threading.main_thread().native_id) == os.SCHED_OTHER
    finally:
        loop.stop()


def test_by_default_the_owner_thread_is_left_as_the_system_has_it(router: Any) -> None:  # noqa: F811
    r, ep = router
    assert not Settings().sched_batch
    loop = OwnerLoop(EchoRole(ep), name="plain")
    loop.start()
    try:
        echo_round_trip(r, loop)
        owner = loop._thread
        assert owner is not None and owner.native_id is not None
        assert not loop.batched
        assert os.sched_getscheduler(owner.native_id) == os.SCHED_OTHER
    finally:
        loop.stop()


def test_a_system_that_refuses_the_policy_leaves_a_working_loop(router: Any, monkeypatch: Any) -> None:  # noqa: F811
    # Given a system that refuses sched_setscheduler (a seccomp profile, say)
    def refuse(*_: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(scheduling.os, "sched_setscheduler", refuse)
    r, ep = router
    loop = OwnerLoop(EchoRole(ep), name="refused", sched_batch=True)
    loop.start()
    try:
        # Then the loop runs as before, under the system's policy, and says it is not batched
        echo_round_trip(r, loop)
        assert not loop.batched
        owner = loop._thread
        assert owner is not None and owner.native_id is not None
        assert os.sched_getscheduler(owner.native_id) == os.SCHED_OTHER
    finally:
        loop.stop()


def test_batch_this_thread_changes_only_the_calling_thread() -> None:
    seen: dict[str, int] = {}

    def worker() -> None:
        seen["ok"] = int(scheduling.batch_this_thread())
        seen["policy"] = os.sched_getscheduler(0)

    t = threading.Thread(target=worker)
    t.start()
    t.join(5)
    assert seen == {"ok": 1, "policy": os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
