"""The role table (zfab/core/access.py) against the code: every HTTP route behind auth has an entry, and
each role, a scoped token and ZFAB_API_TOKENS' tokens are allowed or refused every route as the table says.

Generated from the table: a route added without an entry, or enforced otherwise than its entry says,
fails here. The app runs without its lifespan (no broker): an allowed route answers whatever it answers
without a fabric (503, 404, 422...), never the role check's 403.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from zfab.api.http.app import create_app
from zfab.api.http.auth import require_auth
from zfab.api.http.routeindex import flat_routes
from zfab.api.settings import ApiSettings
from zfab.core.access import (
    ACTIONS,
    HTTP_ROUTES,
    MMI_COMMANDS,
    ROLES,
    AccessError,
    AccessFile,
    Grant,
    parse,
    role_allows,
    topic_service,
)

TOKENS = {role: f"tok-{role}" for role in ROLES} | {"scoped": "tok-scoped", "nopayloads": "tok-nopayloads"}


def _sha(t: str) -> str:
    return hashlib.sha256(t.encode()).hexdigest()


ACCESS = "\n".join(
    [
        *(f'[[token]]\nname = "{r}"\nsha256 = "{_sha(t)}"\nrole = "{r}"\n' for r, t in TOKENS.items() if r in ROLES),
        f'[[token]]\nname = "scoped"\nsha256 = "{_sha(TOKENS["scoped"])}"\nrole = "admin"\nscope = ["demo", "net-*"]\n',
        f'[[token]]\nname = "np"\nsha256 = "{_sha(TOKENS["nopayloads"])}"\nrole = "viewer"\npayloads = false\n',
        '[[key]]\nname = "w1"\nregister = ["demo"]\n',
        '[[key]]\nname = "ops"\nrole = "operator"\nscope = ["demo"]\n',
    ]
)


def _flat(dep: Any) -> Any:
    for d in dep.dependencies:
        yield d.call
        yield from _flat(d)


def _auth_routes() -> list[tuple[str, str]]:
    app = create_app(ApiSettings())
    out = []
    for route in flat_routes(app.router.routes):
        dep = getattr(route, "dependant", None)
        if dep is not None and require_auth in list(_flat(dep)):
            out += [(m, route.path) for m in sorted(route.methods)]
    return out


def test_every_route_behind_auth_has_an_entry_in_the_role_table_and_every_entry_a_route() -> None:
    routes = _auth_routes()
    assert routes, "no route behind auth found: the walk is broken"
    missing = [r for r in routes if r not in HTTP_ROUTES]
    assert not missing, f"routes without an entry in the role table (zfab/core/access.py): {missing}"
    stale = [r for r in HTTP_ROUTES if r not in routes]
    assert not stale, f"role table entries without a route: {stale}"
    assert set(HTTP_ROUTES.values()) | set(MMI_COMMANDS.values()) <= set(ACTIONS)


def test_roles_are_ordered_and_the_table_says_what_each_may_do() -> None:
    assert role_allows("viewer", "read") and not role_allows("viewer", "submit")
    assert role_allows("operator", "submit") and role_allows("operator", "schedule")
    assert not role_allows("operator", "pause") and not role_allows("operator", "limits")
    assert all(role_allows("admin", a) for a in ACTIONS)
    assert not role_allows("root", "read") and not role_allows("admin", "no-such-action")


def test_the_access_file_parses_tokens_and_keys_and_refuses_what_it_cannot_read() -> None:
    table = parse(ACCESS)
    viewer = table.token(hashlib.sha256(b"tok-viewer").digest())
    assert viewer is not None and viewer.role == "viewer" and viewer.everywhere and viewer.payloads
    scoped = table.token(hashlib.sha256(b"tok-scoped").digest())
    assert scoped is not None and scoped.sees("demo") and scoped.sees("net-a") and not scoped.sees("other")
    w1 = table.keys["w1"]
    assert w1.may_register("demo") and not w1.may_register("other") and not w1.client and not w1.allows("submit")
    assert table.keys["ops"].allows("submit") and not table.keys["ops"].allows("pause")
    for bad in ('[[token]]\nsha256 = "12"\n', '[[token]]\nsha256 = "' + "a" * 64 + '"\nrole = "root"\n', "x = ["):
        with pytest.raises(AccessError):
            parse(bad)


def test_the_access_file_is_read_again_when_it_changes_and_a_bad_edit_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "access.toml"
    path.write_text(ACCESS)
    f = AccessFile(str(path))
    assert len(f.current(0.0).tokens) == 5
    path.write_text('[[token]]\nname = "only"\nsha256 = "' + _sha("x") + '"\nrole = "admin"\n# changed\n')
    assert len(f.current(10.0).tokens) == 1 and f.reloads == 1
    path.write_text("not toml = [")
    assert len(f.current(20.0).tokens) == 1 and f.errors == 1


def test_a_topic_names_its_service_second() -> None:
    assert topic_service("job.demo.echo.completed") == "demo" and topic_service("queue.net-a") == "net-a"
    assert topic_service("x") == ""
    assert Grant.of("g", "viewer", scope=("demo",)).sees("demo")


class Caller:
    """The whole app over ASGI, without its lifespan (no broker), from a non-loopback peer."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def request(self, method: str, path: str, headers: dict[str, str] | None = None, json: Any = None) -> Any:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app, client=("192.0.2.1", 50000), raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
                return await c.request(method, path, headers=headers, json=json)

        return asyncio.run(go())

    def get(self, path: str, headers: dict[str, str] | None = None) -> Any:
        return self.request("GET", path, headers)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Caller:
    path = tmp_path_factory.mktemp("access") / "access.toml"
    path.write_text(ACCESS)
    return Caller(create_app(ApiSettings(_env_file=None, access_file=str(path), api_tokens="tok-legacy", api_db="")))  # type: ignore[call-arg]


def _url(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def _refused_by_role(resp: Any) -> bool:
    return resp.status_code == 403 and resp.headers.get("content-type", "").startswith("application/problem+json")


CASES = [(who, method, path) for who in [*ROLES, "scoped", "legacy"] for (method, path) in HTTP_ROUTES]


@pytest.mark.parametrize(("who", "method", "path"), CASES)
def test_each_caller_is_allowed_or_refused_each_route_as_the_table_says(
    client: Caller, who: str, method: str, path: str
) -> None:
    token = "tok-legacy" if who == "legacy" else TOKENS[who]
    role = "admin" if who in ("scoped", "legacy") else who
    resp = client.request(method, _url(path), headers={"Authorization": f"Bearer {token}"}, json={})
    if role_allows(role, HTTP_ROUTES[(method, path)]):
        assert not _refused_by_role(resp), f"{who} refused {method} {path}: {resp.text[:200]}"
    else:
        assert _refused_by_role(resp), f"{who} not refused {method} {path}: {resp.status_code}"
        need = ACTIONS[HTTP_ROUTES[(method, path)]]
        assert f"needs the role {need}" in resp.json()["detail"]


def test_an_unknown_token_is_401_and_no_token_is_401(client: Caller) -> None:
    assert client.get("/jobs", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/jobs").status_code == 401


def test_state_changing_calls_are_in_the_audit_log_with_their_actor_and_outcome(client: Caller) -> None:
    viewer = {"Authorization": f"Bearer {TOKENS['viewer']}"}
    admin = {"Authorization": f"Bearer {TOKENS['admin']}"}
    assert client.request("POST", "/mmi/services/demo/pause", headers=viewer).status_code == 403
    client.request("DELETE", "/schedules/nightly", headers=admin)
    page = client.get("/audit?limit=1000", headers=admin).json()
    rows = [(e["actor"], e["action"], e["target"], e["status"]) for e in page["items"]]
    assert ("viewer", "POST /mmi/services/{service}/pause", "/mmi/services/demo/pause", 403) in rows
    assert any(a == "admin" and act == "DELETE /schedules/{sid}" and t == "/schedules/nightly" for a, act, t, _ in rows)
    assert client.get("/audit?actor=viewer", headers=admin).json()["total"] >= 1
    assert _refused_by_role(client.get("/audit", headers=viewer))


def test_show_broker_names_only_services_in_a_scoped_callers_scope() -> None:
    from zfab.core.access import scoped_broker

    answer = {"workers": 3, "workers_purged": {"demo": 1, "other": 2}, "paused_services": ["demo", "other"]}
    scoped = scoped_broker(Grant.of("s", "viewer", scope=("demo",)), answer)
    assert scoped == {"workers": 3, "workers_purged": {"demo": 1}, "paused_services": ["demo"]}
    assert scoped_broker(Grant.of("a", "admin"), answer) is answer


def test_a_scoped_key_subscribes_only_to_prefixes_that_name_a_whole_service_in_its_scope() -> None:
    from zfab.core.access import may_subscribe

    scoped = Grant.of("s", "viewer", scope=("demo",))
    assert may_subscribe(scoped, b"job.demo.") and may_subscribe(scoped, b"job.demo.echo.completed")
    assert not may_subscribe(scoped, b"job.") and not may_subscribe(scoped, b"job.demo")
    assert not may_subscribe(scoped, b"job.other.") and not may_subscribe(scoped, b"")
    assert may_subscribe(Grant.of("a", "viewer"), b"") and not may_subscribe(None, b"job.demo.")
    assert not may_subscribe(Grant.of("w", "viewer", register=("*",), client=False), b"job.demo.")
