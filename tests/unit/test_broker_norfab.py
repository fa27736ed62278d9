"""What a NorFab 0.25 fabric relies on from its broker, on the stub transport: the inventory service
(sid.service.broker), NorFab's MMI tasks and refusals in the frames NFPClient.mmi() reads, the `all`
pseudo-service, results of either kind of worker reaching a client that collects by GET, and task
errors told to a NorFab client at once (docs/protocol.md, "NorFab peers")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from zfab import Broker, SecurityError, Settings
from zfab.core import protocol as nfp
from zfab.transport import FakeClock, StubLoop, StubTransport

SID = b"sid.service.broker"
TASKS = {"echo": {"type": "object"}}


def make_broker(clock: FakeClock, **settings: Any) -> Broker:
    base: dict[str, Any] = {"keepalive_interval": 1.0, "keepalive_multiplier": 3, "startup_grace": 0}
    b = Broker(
        Settings(**{**base, **settings}), endpoint="tcp://127.0.0.1:1", transport=StubTransport(clock), clock=clock
    )
    b.loop.start()
    stub(b).tick()
    return b


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(clock: FakeClock) -> Broker:
    return make_broker(clock)


def stub(b: Broker) -> StubLoop:
    assert isinstance(b.loop, StubLoop)
    return b.loop


def norfab_worker(b: Broker, name: bytes, service: bytes) -> None:
    """A NorFab worker's READY: its identity is its name, and it announces nothing."""
    stub(b).feed([name, b"", nfp.WORKER, nfp.READY, service])


def zfab_worker(b: Broker, ident: bytes, name: str, service: bytes = b"demo") -> None:
    ann = nfp.dumps({"v": 2, "name": name, "credits": 4, "tasks": TASKS})
    stub(b).feed([ident, b"", nfp.WORKER, nfp.READY, service, ann])


def norfab_request(b: Broker, cmd: bytes, service: bytes, target: bytes, uuid: bytes, body: Any) -> None:
    """What NorFab's NFPClient sends: no flags frame."""
    stub(b).feed([b"nfc", b"", nfp.CLIENT, cmd, service, target, uuid, json.dumps(body).encode()])


def answer(b: Broker, ident: bytes, uuid: bytes, status: bytes, payload: Any, client: bytes = b"nfc") -> None:
    stub(b).feed([ident, b"", nfp.WORKER, nfp.RESPONSE, client, b"", uuid, status, json.dumps(payload).encode()])


def to_client(frames: list[list[bytes]], to: bytes = b"nfc") -> list[tuple[bytes, bytes, bytes, Any]]:
    """(command, service, status, payload) of what the broker sent to `to`."""
    return [(f[3], f[4], f[6], json.loads(f[7])) for f in frames if f[0] == to and f[2] == nfp.BROKER]


def jobs_to_workers(frames: list[list[bytes]]) -> list[tuple[bytes, bytes]]:
    return [(f[0], f[3]) for f in frames if len(f) >= 8 and f[2] == nfp.BROKER and f[4] == b"nfc"]


def mmi(b: Broker, service: bytes, task: str, **kwargs: Any) -> list[tuple[bytes, bytes, bytes, Any]]:
    norfab_request(b, nfp.MMI, service, b"any", b"m1", {"task": task, "kwargs": kwargs, "args": []})
    return to_client(stub(b).take())


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "nornir").mkdir()
    (tmp_path / "nornir" / "common.yaml").write_text("service: nornir\nrunner:\n  plugin: RetryRunner\ntags: [a]\n")
    (tmp_path / "nornir" / "w1.yaml").write_text(
        "hosts:\n  r1: {platform: '{{ env.get(\"SUITE_PLATFORM\") }}'}\ntags: [b]\n"
    )
    (tmp_path / "inventory.yaml").write_text(
        "broker:\n  endpoint: tcp://127.0.0.1:5555\n"
        "topology:\n  broker: true\n  workers: [nornir-worker-1]\n"
        "workers:\n"
        "  nornir-*:\n    - nornir/common.yaml\n    - {watchdog_interval: 30}\n"
        "  nornir-worker-1:\n    - nornir/w1.yaml\n"
    )
    monkeypatch.setenv("SUITE_PLATFORM", "arista_eos")
    return tmp_path


def test_a_norfab_worker_gets_its_inventory_merged_as_norfab_lays_it_out(clock: FakeClock, inventory: Path) -> None:
    b = make_broker(clock, broker_inventory=str(inventory))  # a directory: its inventory.yaml
    answers = mmi(b, SID, "get_inventory", name="nornir-worker-1")
    # load_inventory() reads the MMI copy: both frames carry the answer, under NorFab's service
    assert [(cmd, svc, st) for cmd, svc, st, _ in answers] == [(nfp.RESPONSE, SID, b"200"), (nfp.MMI, SID, b"200")]
    inv = answers[1][3]
    assert inv == {
        "service": "nornir",
        "runner": {"plugin": "RetryRunner"},
        "tags": ["a", "b"],  # lists merge, in order
        "watchdog_interval": 30,
        "hosts": {"r1": {"platform": "arista_eos"}},  # files are Jinja2 templates with env
    }
    # a name no pattern matches gets null (200), as from NorFab's broker: the worker runs on {}
    assert [p for *_, p in mmi(b, SID, "get_inventory", name="other-1")] == [None, None]
    shown = mmi(b, nfp.MMI_SERVICE, "show_broker_inventory")[1][3]
    assert shown["broker"] == {"endpoint": "tcp://127.0.0.1:5555"}
    assert set(shown["workers"]) == {"nornir-*", "nornir-worker-1"}
    assert b.counts["inventory_served"] == 2


def test_without_an_inventory_a_worker_gets_null_at_once(broker: Broker) -> None:
    answers = mmi(broker, SID, "get_inventory", name="nornir-worker-1")
    assert [(cmd, st, p) for cmd, _, st, p in answers] == [(nfp.RESPONSE, b"200", None), (nfp.MMI, b"200", None)]
    assert mmi(broker, nfp.MMI_SERVICE, "show_broker_inventory")[1][3] == {}


def test_a_bad_inventory_is_refused_when_the_broker_is_made(clock: FakeClock, tmp_path: Path) -> None:
    (tmp_path / "inventory.yaml").write_text("workers:\n  w1: not-a-list\n")
    with pytest.raises(Exception, match="must map name patterns"):
        make_broker(clock, broker_inventory=str(tmp_path / "inventory.yaml"))


def test_get_stats_and_versions_have_the_keys_norfab_tools_read(broker: Broker) -> None:
    norfab_worker(broker, b"nornir-worker-1", b"nornir")
    stats = mmi(broker, nfp.MMI_SERVICE, "get_stats")[1][3]
    assert stats["role"] == "broker" and stats["schema_version"] == "1.0"
    assert set(stats["process"]) >= {"cpu_percent", "memory_rss_mbyte", "uptime_seconds", "threads"}
    assert set(stats["messaging"]) == {"sent", "received", "events_received", "send_failures", "receive_failures"}
    assert (stats["worker_count"], stats["service_count"], stats["keepalive_interval_ms"]) == (1, 1, 1000)
    (w,) = stats["workers"]
    assert (w["name"], w["service"], w["status"]) == ("nornir-worker-1", "nornir", "alive")
    version = mmi(broker, nfp.MMI_SERVICE, "show_broker_version")[1][3]
    assert {"norfab", "pyzmq", "pydantic", "python", "platform", "zfab"} <= set(version)
    # NorFab's tests and tools expect a version under "norfab": the NFP release zfab speaks
    assert version["norfab"] == "0.25.0"


def test_show_workers_has_norfabs_row_and_zfabs_typed_figures(broker: Broker) -> None:
    norfab_worker(broker, b"nornir-worker-1", b"nornir")
    (row,) = mmi(broker, nfp.MMI_SERVICE, "show_workers")[1][3]
    assert (row["name"], row["service"], row["status"]) == ("nornir-worker-1", "nornir", "alive")
    # NorFab's own test suite reads "holdtime" (test_mmi_show_workers): NorFab's strings stay
    assert (row["holdtime"], row["keepalives tx/rx"], row["alive (s)"]) == ("3.0", "0 / 0", "0")
    assert row["keepalives_received"] == 0 and row["alive"] is True and row["holdtime_left_s"] == 3.0


def test_an_mmi_request_to_a_service_without_workers_is_refused_in_both_frames(broker: Broker) -> None:
    answers = mmi(broker, b"nornir", "list_tasks")
    assert [(cmd, st) for cmd, _, st, _ in answers] == [(nfp.RESPONSE, b"404"), (nfp.MMI, b"404")]
    assert answers[1][3]["status"] == "FAILED" and answers[1][3]["errors"]


def test_the_all_pseudo_service_reaches_workers_of_every_service(broker: Broker) -> None:
    norfab_worker(broker, b"nornir-worker-1", b"nornir")
    norfab_worker(broker, b"nornir-worker-2", b"nornir")
    zfab_worker(broker, b"d1~00", "demo-1")
    stub(broker).take()
    body = {"task": "get_stats", "args": [], "kwargs": {}}
    norfab_request(broker, nfp.POST, b"all", b"all", b"j1", body)
    sent = stub(broker).take()
    ((cmd, svc, status, dispatched),) = to_client(sent)
    assert (cmd, svc, status) == (nfp.RESPONSE, b"all", b"202")
    assert sorted(dispatched["workers"]) == ["demo-1", "nornir-worker-1", "nornir-worker-2"]
    assert sorted(w for w, _ in jobs_to_workers(sent)) == [b"d1~00", b"nornir-worker-1", b"nornir-worker-2"]
    # `any`: one worker per service
    norfab_request(broker, nfp.POST, b"all", b"any", b"j2", body)
    ((_, _, _, dispatched),) = to_client(stub(broker).take())
    assert len(dispatched["workers"]) == 2 and "demo-1" in dispatched["workers"]
    # names across services
    norfab_request(broker, nfp.POST, b"all", b'["demo-1", "nornir-worker-2", "nobody"]', b"j3", body)
    ((_, _, _, dispatched),) = to_client(stub(broker).take())
    assert sorted(dispatched["workers"]) == ["demo-1", "nornir-worker-2"]
    # each worker answers under its own service; a GET of the job reaches the named worker
    answer(broker, b"nornir-worker-1", b"j1", b"200", {"nornir-worker-1": {"result": 1, "failed": False}})
    ((_, svc, status, _),) = to_client(stub(broker).take())
    assert (svc, status) == (b"nornir", b"200")
    norfab_request(broker, nfp.GET, b"all", b'["nornir-worker-2"]', b"j1", {"task": "get_stats"})
    assert jobs_to_workers(stub(broker).take()) == [(b"nornir-worker-2", nfp.GET)]
    # no worker matched: NorFab's 400
    norfab_request(broker, nfp.POST, b"all", b"nobody", b"j4", body)
    ((_, _, status, refusal),) = to_client(stub(broker).take())
    assert status == b"400" and refusal["workers"] is None


def test_a_norfab_workers_answer_to_a_get_reaches_the_client(broker: Broker) -> None:
    """D2: NorFab workers send no completion of their own; their answer to the client's GET is the
    result, and it frees the worker's credit."""
    norfab_worker(broker, b"nornir-worker-1", b"nornir")
    norfab_request(broker, nfp.POST, b"nornir", b"any", b"j1", {"task": "echo", "args": [], "kwargs": {}})
    stub(broker).take()
    answer(broker, b"nornir-worker-1", b"j1", b"201", {"worker": "nornir-worker-1", "status": "ACCEPTED"})
    norfab_request(broker, nfp.GET, b"nornir", b'["nornir-worker-1"]', b"j1", {"task": "echo"})
    stub(broker).take()
    answer(broker, b"nornir-worker-1", b"j1", b"200", {"nornir-worker-1": {"result": "hi", "failed": False}})
    ((_, _, status, result),) = to_client(stub(broker).take())
    assert status == b"200" and result["nornir-worker-1"]["result"] == "hi"
    assert broker.registry.workers[b"nornir-worker-1"].inflight == {} and not broker.registry.routes


def test_a_zfab_workers_failure_reaches_a_norfab_client_at_once_as_a_failed_entry(broker: Broker) -> None:
    """D5: an unknown task or bad arguments from a NorFab client: NorFab's workers answer a failed
    entry with 200, which NorFab's client keeps as the job's result (a 400 would fail it empty)."""
    zfab_worker(broker, b"d1~00", "demo-1")
    norfab_request(broker, nfp.POST, b"demo", b"any", b"j1", {"task": "echo", "args": [], "kwargs": {"x": 1}})
    stub(broker).take()
    entry = {"demo-1": {"result": None, "failed": True, "errors": ["unexpected argument x"], "messages": []}}
    answer(broker, b"d1~00", b"j1", b"400", entry)
    ((_, _, status, payload),) = to_client(stub(broker).take())
    assert status == b"200" and payload == entry


def test_a_zfab_workers_result_reaches_a_norfab_client_without_a_get(broker: Broker) -> None:
    zfab_worker(broker, b"d1~00", "demo-1")
    norfab_request(broker, nfp.POST, b"demo", b"any", b"j1", {"task": "echo", "args": [], "kwargs": {}})
    stub(broker).take()
    answer(broker, b"d1~00", b"j1", b"200", {"demo-1": {"result": 1, "failed": False}})
    sent = stub(broker).take()
    ((_, _, status, _),) = to_client(sent)
    assert status == b"200"
    # NorFab's frames only: the hop trace goes with pushed answers, which only zfab clients ask for
    assert [len(f) for f in sent if f[0] == b"nfc"] == [8]


def test_a_zfab_client_collecting_by_get_is_not_sent_the_completion(broker: Broker) -> None:
    zfab_worker(broker, b"d1~00", "demo-1")
    flags = nfp.dumps({"push": False, "ack": True, "task": "echo"})
    stub(broker).feed([b"zc", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", b"j1", b'{"task":"echo"}', flags])
    stub(broker).take()
    answer(broker, b"d1~00", b"j1", b"200", {"demo-1": {"result": 1, "failed": False}}, client=b"zc")
    assert to_client(stub(broker).take(), to=b"zc") == []


def test_a_get_answer_of_a_finished_part_is_not_dropped_while_another_part_is_open(broker: Broker) -> None:
    """D2b: in a two-worker job, the answer of a worker whose part ended (to the client's GET) is
    forwarded; a late answer of a job this worker never held, while it is in flight, is stale."""
    zfab_worker(broker, b"d1~00", "demo-1")
    zfab_worker(broker, b"d2~00", "demo-2")
    norfab_request(broker, nfp.POST, b"demo", b'["demo-1", "demo-2"]', b"j1", {"task": "echo"})
    stub(broker).take()
    answer(broker, b"d1~00", b"j1", b"200", {"demo-1": {"result": 1, "failed": False}})
    stub(broker).take()
    norfab_request(broker, nfp.GET, b"demo", b'["demo-1"]', b"j1", {"task": "echo"})
    stub(broker).take()
    answer(broker, b"d1~00", b"j1", b"200", {"demo-1": {"result": 1, "failed": False}})
    ((_, _, status, _),) = to_client(stub(broker).take())
    assert status == b"200" and broker.counts["stale_results"] == 0
    zfab_worker(broker, b"d3~00", "demo-3")
    answer(broker, b"d3~00", b"j1", b"200", {"demo-3": {"result": 1, "failed": False}})
    assert to_client(stub(broker).take()) == [] and broker.counts["stale_results"] == 1


def test_handover_with_curve_is_refused_at_start(clock: FakeClock, tmp_path: Path) -> None:
    """ROUTER_HANDOVER lets a peer that knows an identity take its route: never under CURVE, where
    identities are bound to keys."""
    s = Settings(curve_secret=str(tmp_path / "k"), curve_clients=str(tmp_path), broker_handover=True)
    b = Broker(s, endpoint="tcp://127.0.0.1:1", transport=StubTransport(clock), clock=clock)
    with pytest.raises(SecurityError, match="ZFAB_BROKER_HANDOVER"):
        b.start()
