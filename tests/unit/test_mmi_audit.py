"""The broker's log of state-changing MMI commands (broker/mmiaudit.py) on the stub transport: who, what, on
which service or task, the outcome; refusals included, reads not; bounded and counted; read by an admin
key with show_audit, refused to any other key."""

from __future__ import annotations

from test_key_access import SECRET, announce, curve_broker, mmi

from zfab.broker.mmiaudit import AUDITED, MmiAuditLog
from zfab.core.access import MMI_COMMANDS, Grant


def test_every_command_beyond_read_is_audited_and_none_that_reads() -> None:
    assert {t for t, action in MMI_COMMANDS.items() if action not in ("read", "audit")} == AUDITED
    assert {"pause_service", "resume_service", "set_limit", "clear_limit"} <= AUDITED
    assert "show_audit" not in AUDITED and "show_workers" not in AUDITED


def test_a_keys_pause_limits_and_refusals_are_kept_with_who_what_target_and_outcome() -> None:
    b = curve_broker()
    announce(b, b"w1", {"login": SECRET}, user=b"root")
    assert mmi(b, "pause_service", user=b"root", service="demo")[0] == b"200"
    assert mmi(b, "pause_service", user=b"ops", service="demo")[0] == b"400"  # an operator: refused
    limit = {"service": "demo", "task_name": "login", "rate_limit": "5/s"}
    assert mmi(b, "set_limit", user=b"root", **limit)[0] == b"200"
    assert mmi(b, "resume_service", user=b"root", service="nope")[0] == b"404"
    mmi(b, "show_workers", user=b"root")  # a read: not audited
    status, page = mmi(b, "show_audit", user=b"root")
    assert status == b"200" and page["you"] == "root" and page["next"] == 4
    got = [(e["seq"], e["key"], e["role"], e["command"], e["target"], e["status"]) for e in page["entries"]]
    assert got == [
        (1, "root", "admin", "pause_service", "demo", 200),
        (2, "ops", "operator", "pause_service", "demo", 400),
        (3, "root", "admin", "set_limit", "demo/login", 200),
        (4, "root", "admin", "resume_service", "nope", 404),
    ]
    assert [e["seq"] for e in mmi(b, "show_audit", user=b"root", after=2, limit=1)[1]["entries"]] == [3]
    assert mmi(b, "show_audit", user=b"root", after=4)[1]["entries"] == []
    assert mmi(b, "show_audit", user=b"root", limit=0)[0] == b"400"
    # Only an admin key reads it.
    status, refused = mmi(b, "show_audit", user=b"ops")
    assert status == b"400" and "needs the role admin" in refused["detail"]
    assert b.counts["mmi_audited"] == 4
    facts = mmi(b, "show_broker", user=b"root")[1]
    assert facts["mmi_audit_entries"] == 4 and facts["mmi_audit_capacity"] == MmiAuditLog.CAPACITY


def test_the_log_is_bounded_the_oldest_going_first_counted_and_targets_are_cut() -> None:
    log = MmiAuditLog(capacity=3)
    admin = Grant.of("root", "admin")
    for i in range(5):
        log.record(admin, "pause_service", {"service": f"s{i}" + "x" * 500}, b"200")
    page = log.page({}, admin)
    assert [e["seq"] for e in page["entries"]] == [3, 4, 5] and page["evicted"] == 2
    assert all(len(e["target"]) == 200 for e in page["entries"])
    assert log.page({"after": 5}, admin)["next"] == 5
    assert log.page({}, None)["you"] == ""  # without CURVE: no key names the reader
