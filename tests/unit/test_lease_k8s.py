"""The Kubernetes Lease backend (service/broker/lease_k8s.py) against a fake API server (fakek8s.py):
two contenders, renewal, expiry judged on the contender's own clock, the 409 race, release, the
active pod's label, and an API server that cannot be reached or refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeclock import FakeClock
from fakek8s import FakeApiServer

from zfab.broker.lease import LeaseUnavailable, open_lease
from zfab.broker.lease_k8s import ACTIVE_LABEL, K8sLease, parse_url

URL = "k8s://zfab/zfab-broker"
A, B = "tcp://zfab-broker-0.zfab-broker:5555", "tcp://zfab-broker-1.zfab-broker:5555"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(pods=("broker-a", "broker-b")) as server:
        yield server


def contender(api: FakeApiServer, pod: str, clock: FakeClock, account: Path) -> K8sLease:
    return K8sLease(URL, timeout=2.0, server=api.url, account=account, environ={"POD_NAME": pod}, clock=clock)


@pytest.fixture
def account(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("token-1\n")
    return tmp_path


def test_the_first_contender_creates_the_lease_at_epoch_1_and_labels_its_pod(api: FakeApiServer, account: Path) -> None:
    clock = FakeClock()
    a = contender(api, "broker-a", clock, account)
    state = a.acquire_or_renew(A, 2.0)
    assert (state.held, state.epoch, state.holder) == (True, 1, A)
    assert state.expires_in == pytest.approx(2.0)
    spec = api.lease()["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == (A, 2, 1)
    assert api.labels("broker-a") == {ACTIVE_LABEL: "active"}
    assert all(auth == "Bearer token-1" for _, _, auth in api.requests)


def test_a_second_contender_stands_by_while_the_holder_renews(api: FakeApiServer, account: Path) -> None:
    ca, cb = FakeClock(), FakeClock(5000.0)  # two hosts: their clocks have nothing in common
    a, b = contender(api, "broker-a", ca, account), contender(api, "broker-b", cb, account)
    a.acquire_or_renew(A, 2.0)
    seen = b.acquire_or_renew(B, 2.0)
    assert (seen.held, seen.epoch, seen.holder) == (False, 1, A)
    assert seen.expires_in == pytest.approx(2.0)
    for _ in range(5):  # the holder renews within its term; the standby's view keeps being refreshed
        ca.advance(1.0)
        cb.advance(1.5)
        assert a.acquire_or_renew(A, 2.0).held
        seen = b.acquire_or_renew(B, 2.0)
        assert (seen.held, seen.holder) == (False, A)
    assert api.labels("broker-b") == {}
    assert api.lease()["spec"]["leaseTransitions"] == 1


def test_a_renewal_is_one_round_trip(api: FakeApiServer, account: Path) -> None:
    a = contender(api, "broker-a", FakeClock(), account)
    a.acquire_or_renew(A, 2.0)
    before = len(api.requests)
    a.acquire_or_renew(A, 2.0)
    assert [m for m, _, _ in api.requests[before:]] == ["PUT"]


def test_the_standby_takes_over_an_expired_lease_with_the_next_epoch(api: FakeApiServer, account: Path) -> None:
    ca, cb = FakeClock(), FakeClock()
    a, b = contender(api, "broker-a", ca, account), contender(api, "broker-b", cb, account)
    a.acquire_or_renew(A, 2.0)
    assert not b.acquire_or_renew(B, 2.0).held
    cb.advance(1.9)  # the holder has stopped renewing, but its term is not over yet
    assert not b.acquire_or_renew(B, 2.0).held
    cb.advance(0.2)
    took = b.acquire_or_renew(B, 2.0)
    assert (took.held, took.epoch, took.holder) == (True, 2, B)
    assert api.labels("broker-b") == {ACTIVE_LABEL: "active"}
    # The deposed holder comes back: its renewal is refused (409), it sees B and unlabels its pod.
    back = a.acquire_or_renew(A, 2.0)
    assert (back.held, back.epoch, back.holder) == (False, 2, B)
    assert api.labels("broker-a") == {}
    assert api.lease()["spec"]["holderIdentity"] == B


def test_expiry_counts_from_when_the_record_was_seen_not_from_its_renew_time(api: FakeApiServer, account: Path) -> None:
    # A holder on a host whose clock is an hour behind: its renewTime looks stale, its lease is live.
    api.write_lease({
        "holderIdentity": A, "leaseDurationSeconds": 2, "leaseTransitions": 7,
        "renewTime": "2026-01-01T00:00:00.000000Z", "acquireTime": "2026-01-01T00:00:00.000000Z",
    })  # fmt: skip
    cb = FakeClock()
    b = contender(api, "broker-b", cb, account)
    seen = b.acquire_or_renew(B, 2.0)
    assert (seen.held, seen.epoch, seen.holder) == (False, 7, A)
    assert seen.expires_in == pytest.approx(2.0)
    cb.advance(1.0)
    api.write_lease({**api.lease()["spec"], "renewTime": "2026-01-01T00:00:01.000000Z"})  # it renews
    cb.advance(1.5)  # 2.5 s since it was first seen, but the renewal is seen only now: held
    assert not b.acquire_or_renew(B, 2.0).held
    cb.advance(2.1)
    assert b.acquire_or_renew(B, 2.0).epoch == 8


def test_a_contender_that_loses_the_write_race_stands_by(api: FakeApiServer, account: Path) -> None:
    ca, cb = FakeClock(), FakeClock()
    a, b = contender(api, "broker-a", ca, account), contender(api, "broker-b", cb, account)
    a.acquire_or_renew(A, 2.0)
    a_pod_before = api.labels("broker-a")
    cb.advance(0.0)
    b.acquire_or_renew(B, 2.0)
    cb.advance(3.0)  # A's term is over as B sees it; A renews just between B's read and B's write
    api.before_write = lambda: a.acquire_or_renew(A, 2.0) and None
    state = b.acquire_or_renew(B, 2.0)
    assert (state.held, state.holder, state.epoch) == (False, A, 1)
    assert state.expires_in == pytest.approx(2.0)  # A's renewal was just seen
    assert api.lease()["spec"]["holderIdentity"] == A
    assert api.labels("broker-b") == {} and api.labels("broker-a") == a_pod_before


def test_two_contenders_racing_to_create_the_lease_leave_one_holder(api: FakeApiServer, account: Path) -> None:
    ca, cb = FakeClock(), FakeClock()
    a, b = contender(api, "broker-a", ca, account), contender(api, "broker-b", cb, account)
    api.before_write = lambda: a.acquire_or_renew(A, 2.0) and None  # A creates it while B is about to
    state = b.acquire_or_renew(B, 2.0)
    assert (state.held, state.holder, state.epoch) == (False, A, 1)
    assert api.lease()["spec"]["holderIdentity"] == A


def test_a_released_lease_is_taken_at_once(api: FakeApiServer, account: Path) -> None:
    ca, cb = FakeClock(), FakeClock()
    a, b = contender(api, "broker-a", ca, account), contender(api, "broker-b", cb, account)
    a.acquire_or_renew(A, 2.0)
    assert not b.acquire_or_renew(B, 2.0).held
    a.release(A)
    assert api.labels("broker-a") == {}
    took = b.acquire_or_renew(B, 2.0)  # no wait for the old term: the holder said it is gone
    assert (took.held, took.epoch) == (True, 2)


def test_a_deposed_broker_that_stops_unlabels_its_pod(api: FakeApiServer, account: Path) -> None:
    a = contender(api, "broker-a", FakeClock(), account)
    assert a.acquire_or_renew(A, 2.0).held
    a.close()  # deposed (its term fenced itself): no release, the process ends
    assert api.labels("broker-a") == {}


def test_an_unreachable_api_server_is_lease_unavailable(api: FakeApiServer, account: Path) -> None:
    a = contender(api, "broker-a", FakeClock(), account)
    assert a.acquire_or_renew(A, 2.0).held
    api.stop()
    with pytest.raises(LeaseUnavailable):
        a.acquire_or_renew(A, 2.0)


@pytest.mark.parametrize("status", [403, 500])
def test_an_api_server_that_refuses_is_lease_unavailable(api: FakeApiServer, account: Path, status: int) -> None:
    a = contender(api, "broker-a", FakeClock(), account)
    api.fail_with = status
    with pytest.raises(LeaseUnavailable, match=str(status)):
        a.acquire_or_renew(A, 2.0)


def test_a_label_that_cannot_be_set_is_retried_and_does_not_cost_the_lease(api: FakeApiServer, account: Path) -> None:
    a = contender(api, "broker-gone", FakeClock(), account)  # no such pod: PATCH answers 404
    assert a.acquire_or_renew(A, 2.0).held
    assert a.label_errors == 1
    api.pods[("zfab", "broker-gone")] = {}
    assert a.acquire_or_renew(A, 2.0).held
    assert api.labels("broker-gone") == {ACTIVE_LABEL: "active"}


def test_lease_urls() -> None:
    assert parse_url("k8s://zfab/zfab-broker") == ("zfab", "zfab-broker")
    for bad in ("k8s://zfab", "k8s://Zfab/x", "k8s://a/b/c", "postgres://x/y"):
        with pytest.raises(ValueError):
            parse_url(bad)


def test_the_api_server_is_found_from_the_pod_environment() -> None:
    with pytest.raises(ValueError, match="KUBERNETES_SERVICE_HOST"):
        K8sLease(URL, timeout=1.0, environ={})
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    lease = K8sLease(URL, timeout=1.0, environ=env)
    assert lease.server == "https://10.0.0.1:443"
    lease.close()
    v6 = K8sLease(URL, timeout=1.0, environ={"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
    assert v6.server == "https://[fd00::1]:443"
    v6.close()


def test_open_lease_gives_a_k8s_url_to_this_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    lease = open_lease(URL, timeout=1.0)
    assert isinstance(lease, K8sLease) and (lease.namespace, lease.name) == ("zfab", "zfab-broker")
    lease.close()
