"""The broker's side of the role table (core/access.py) on the stub transport: what each CURVE key's grant
lets it do, and a service's task declarations fixed by its first registration (broker/declarations.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_broker_handlers import make_broker, replies, stub

from zfab import Broker
from zfab.core import protocol as nfp
from zfab.core.access import ALL, MMI_COMMANDS, Grant
from zfab.transport import FakeClock

SECRET = {"type": "object", "properties": {"password": {"type": "string"}}, "x-zfab": {"redact": ["password"]}}
CLEAR = {"type": "object", "properties": {"password": {"type": "string"}}}


def announce(b: Broker, ident: bytes, tasks: dict[str, Any], user: bytes | None = None) -> None:
    ann = nfp.dumps({"v": 2, "name": ident.decode(), "credits": 2, "tasks": tasks})
    stub(b).feed([ident, b"", nfp.WORKER, nfp.READY, b"demo", ann], user_id=user)


def mmi(b: Broker, task: str, user: bytes | None = None, **kwargs: Any) -> tuple[bytes, Any]:
    body = json.dumps({"task": task, "kwargs": kwargs}).encode()
    client = b"c-" + (user or b"")  # under CURVE an identity stays with the key that first used it
    stub(b).feed([client, b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"u-mmi", body], user_id=user)
    got = [r for r in replies(stub(b).take(), to=client) if r[0] == nfp.MMI]
    return got[-1][2], got[-1][3]


def test_a_conflicting_announcement_is_refused_counted_and_does_not_change_the_redaction() -> None:
    b = make_broker(FakeClock())
    announce(b, b"w1", {"login": SECRET})
    announce(b, b"w2", {"login": CLEAR})  # the same task, its secret no longer declared
    sent = stub(b).take()
    refusal = [f for f in sent if f[0] == b"w2" and f[3] == nfp.DISCONNECT]
    assert refusal and json.loads(refusal[0][5])["reason"] == "declaration_conflict"
    assert b.counts["announcement_refused"] == 1 and b"w2" not in b.registry.workers
    assert mmi(b, "show_tasks", service="demo")[1]["tasks"]["login"] == SECRET
    announce(b, b"w3", {"login": SECRET, "other": CLEAR})  # the same declaration, and a new task: taken
    assert b"w3" in b.registry.workers and b.registry.services[b"demo"].declared["other"] == CLEAR


class Zap:
    """The ZAP handler as the broker reads it: each key's grant, by its user id."""

    def __init__(self, grants: dict[bytes, Grant]) -> None:
        self.grants = grants

    def may_register(self, name: bytes, user: bytes | None, service: bytes | None = None) -> bool:
        g = self.grants.get(user or b"")
        return g is not None and (service is None or g.may_register(service.decode()))


def curve_broker() -> Broker:
    b = make_broker(FakeClock())
    b.identities.zap = Zap(  # type: ignore[assignment]
        {
            b"wkey": Grant.of("wkey", "viewer", register=("demo",), client=False),
            b"ops": Grant.of("ops", "operator", scope=("demo",)),
            b"root": Grant.of("root", "admin", register=ALL),
        }
    )
    return b


def post(b: Broker, user: bytes, service: bytes = b"demo", uuid: bytes = b"u1") -> tuple[bytes, Any]:
    body = b'{"task":"login","args":[],"kwargs":{}}'
    f = nfp.dumps({"push": True, "ack": True, "task": "login", "timeout": 10})
    stub(b).feed([b"c-" + user, b"", nfp.CLIENT, nfp.POST, service, b"any", uuid, body, f], user_id=user)
    got = replies(stub(b).take(), to=b"c-" + user)
    return got[0][2], got[0][3]


def test_a_worker_key_registers_only_its_services_and_cannot_submit_pause_or_set_limits() -> None:
    b = curve_broker()
    announce(b, b"w1", {"login": SECRET}, user=b"wkey")
    assert b"w1" in b.registry.workers
    stub(b).take()
    status, body = post(b, b"wkey")
    assert status == nfp.ST_BAD_REQUEST and "worker key" in json.dumps(body)
    status, body = mmi(b, "pause_service", user=b"wkey", service="demo")
    assert status == nfp.ST_BAD_REQUEST and body["error"] == "forbidden" and b"demo" not in b.paused
    status, _ = mmi(b, "set_limit", user=b"wkey", service="demo", task_name="login", concurrency=1)
    assert status == nfp.ST_BAD_REQUEST
    status, _ = mmi(b, "show_services", user=b"wkey")
    assert status == nfp.ST_BAD_REQUEST  # not a client at all: no reads either
    ann = nfp.dumps({"v": 2, "name": "w9", "credits": 2, "tasks": {}})
    stub(b).feed([b"w9", b"", nfp.WORKER, nfp.READY, b"other", ann], user_id=b"wkey")
    assert b"w9" not in b.registry.workers  # a service its entry does not name
    assert b.counts["refused_by_key"] == 1


def test_a_client_key_has_a_role_and_a_scope_like_a_token() -> None:
    b = curve_broker()
    announce(b, b"w1", {"login": SECRET}, user=b"root")
    stub(b).take()
    assert post(b, b"ops")[0] in (nfp.ST_DISPATCHED, nfp.ST_QUEUED)
    status, body = post(b, b"ops", service=b"other", uuid=b"u2")
    assert status == nfp.ST_BAD_REQUEST and "outside the scope" in json.dumps(body)
    status, body = mmi(b, "pause_service", user=b"ops", service="demo")
    assert status == nfp.ST_BAD_REQUEST and "needs the role admin" in body["detail"]
    status, rows = mmi(b, "show_services", user=b"ops")
    assert status == nfp.ST_OK and {r["service"] for r in rows} == {"demo"}
    assert mmi(b, "pause_service", user=b"root", service="demo")[0] == nfp.ST_OK


def test_an_admin_key_may_change_a_declaration() -> None:
    b = curve_broker()
    announce(b, b"w1", {"login": SECRET}, user=b"wkey")
    announce(b, b"w2", {"login": CLEAR}, user=b"wkey")
    assert b"w2" not in b.registry.workers
    announce(b, b"w3", {"login": CLEAR}, user=b"root")
    assert b"w3" in b.registry.workers and b.registry.services[b"demo"].declared["login"] == CLEAR


@pytest.mark.parametrize("role", ["viewer", "operator", "admin", "scoped", "worker"])
def test_every_mmi_command_is_allowed_or_refused_to_each_key_as_the_role_table_says(role: str) -> None:
    """Generated from the table (core/access.py MMI_COMMANDS): a command added without an entry, or checked
    otherwise than its entry says, fails here."""
    b = make_broker(FakeClock())
    grant = {
        "scoped": Grant.of("scoped", "admin", scope=("demo",)),
        "worker": Grant.of("worker", "viewer", register=ALL, client=False),
    }.get(role) or Grant.of(role, role)
    b.identities.zap = Zap({b"k": grant, b"root": Grant.of("root", "admin", register=ALL)})  # type: ignore[assignment]
    announce(b, b"w1", {"login": SECRET}, user=b"root")
    stub(b).take()
    assert set(MMI_COMMANDS) == set(b.mmi.TASKS) | set(b.mmi.CONTROLS)
    for command, action in MMI_COMMANDS.items():
        kwargs: dict[str, Any] = {"service": "demo", "task_name": "login"}
        status, body = mmi(b, command, user=b"k", **kwargs)
        refused = status == nfp.ST_BAD_REQUEST and isinstance(body, dict) and body.get("error") == "forbidden"
        assert refused is (action not in grant.actions), (role, command, status, body)
