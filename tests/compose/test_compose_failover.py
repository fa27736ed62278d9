"""Two brokers on a PostgreSQL lease on a real Docker engine: `docker compose -f compose.yaml -f
deploy/compose.failover.yaml up` (PostgreSQL, broker and broker-b, two workers and the API given both
endpoints).

In order: the stack comes up with exactly one broker ready (its /readyz 200, the other's 503, both
alive); a queue paused through the API is kept in PostgreSQL; under a steady trickle of echo jobs over
REST, SIGKILL of the active broker's process (inside its container, as a crash): the standby becomes
ready, jobs complete again (times printed), every job the API accepted ends completed, a limit set at
run time before the kill is still set at the new active broker, and the killed broker comes back
(restart policy) as the standby. Twice, so each broker is killed once. `docker compose down -v` at the
end whatever happened; timings are printed.

Stand-ins: as in test_compose_real.py, plus PostgreSQL (tools/ci/images.sh builds Debian's postgresql
under the tag the overlay names). Test traffic goes only to 127.0.0.1 (published ports) and, through
`docker compose exec`, to each broker's own loopback. Where no engine can be had the test skips, except
under CI=true, where it fails.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from realstack import Engine, Project, free_port, poll, run, show_report

pytestmark = pytest.mark.compose

FILES = ("compose.yaml", "deploy/compose.failover.yaml")
IMAGE = "zfab-compose-failover-test:local"  # its own tag: the other compose tests' images stay untouched
BROKERS = ("broker", "broker-b")
FAILOVERS = 2
SERVE_AGAIN_BOUND = 60.0  # s: a failed takeover fails here; the figure itself is printed, not asserted
FINAL = {"completed", "failed", "cancelled", "expired", "lost"}


@dataclass
class Stack:
    project: Project
    timings: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = ["compose + deploy/compose.failover.yaml on a real engine: timings"]
        out += [f"  {what:<58} {seconds:6.1f} s" for what, seconds in self.timings]
        return out + [f"  {n}" for n in self.notes]


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    engine = Engine.acquire()
    project = Project.from_head(tmp_path_factory.mktemp("compose-failover"))
    project.ports["ZFAB_BROKER_B_PORT"] = free_port(set(project.ports.values()))
    project.env.update(
        COMPOSE_FILE=os.pathsep.join(FILES),
        COMPOSE_PATH_SEPARATOR=os.pathsep,
        ZFAB_IMAGE=IMAGE,
        ZFAB_BROKER_B_PORT=str(project.ports["ZFAB_BROKER_B_PORT"]),
        ZFAB_PG_PASSWORD="compose-" + os.urandom(6).hex(),
    )
    s = Stack(project)
    s.notes += engine.notes
    try:
        assert (project.src / FILES[1]).is_file(), f"{FILES[1]} is not in the committed tree (git archive HEAD)"
        engine.images(project.src / FILES[0], project.src / FILES[1])
        s.notes.append(engine.notes[-1])
        t = time.monotonic()
        project.compose("build", timeout=900)
        s.timings.append(("docker compose build", time.monotonic() - t))
        t = time.monotonic()
        project.compose("up", "-d", timeout=300)
        project.wait_healthy(2, timeout=240)
        poll("both brokers alive", 120, lambda: all(alive(project, b) for b in BROKERS) or None)
        s.timings.append(("up -d -> postgres, two brokers, 2 workers, api healthy", time.monotonic() - t))
        yield s
    finally:
        project.down()
        engine.release()
        show_report(request, engine.state / "compose-failover-report.txt", s.lines())


def _probe(p: Project, service: str, path: str) -> bool:
    r = p.compose(
        "exec", "-T", service, "zfab", "healthcheck", "--url", f"http://127.0.0.1:9100{path}", timeout=30, check=False
    )
    return r.returncode == 0


def alive(p: Project, service: str) -> bool:
    return _probe(p, service, "/healthz")


def active(p: Project) -> str | None:
    """The one broker whose /readyz says it serves, None while none (or both) do."""
    ready = [b for b in BROKERS if _probe(p, b, "/readyz")]
    return ready[0] if len(ready) == 1 else None


def broker_logs(p: Project) -> str:
    """The brokers' last lines, for a failure's message."""
    r = p.compose("logs", "--no-color", "--tail", "40", *BROKERS, timeout=60, check=False)
    return r.stdout[-6000:] + r.stderr[-1000:]


def container(p: Project, service: str) -> str:
    (c,) = p.containers(service)
    return str(c["ID"])


class Trickle:
    """Echo jobs over REST, one at a time, until stopped: what the API accepted (202/200), by uuid."""

    def __init__(self, p: Project) -> None:
        self.p = p
        self.accepted: list[str] = []
        self.completed: list[tuple[float, float]] = []  # monotonic: (sent, answered) of jobs answered completed
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trickle", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set() and n < 5000:  # bounded in count, and in time by the test
            n += 1
            sent = time.monotonic()
            r = self.p.call("POST", "/jobs?wait=5", {"service": "demo", "task": "echo", "kwargs": {"data": n}}, 20)
            job = r.json()
            if r.status in (200, 202) and isinstance(job, dict) and "uuid" in job:
                self.accepted.append(str(job["uuid"]))
                if job.get("state") == "completed":
                    self.completed.append((sent, time.monotonic()))
            else:
                self.refused += 1
                self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def final_state(p: Project, uuid: str, timeout: float = 90) -> str:
    def done() -> str | None:
        r = p.call("GET", f"/jobs/{uuid}?wait=10", timeout=25)
        job = r.json()
        state = job.get("state") if r.status == 200 and isinstance(job, dict) else None
        return str(state) if state in FINAL else None

    return poll(f"job {uuid} in a final state", timeout, done, interval=1.0)


def test_one_broker_is_active_and_the_other_stands_by(stack: Stack) -> None:
    p = stack.project
    first = poll("exactly one broker ready", 60, lambda: active(p))
    other = next(b for b in BROKERS if b != first)
    assert alive(p, other) and not _probe(p, other, "/readyz"), f"{other} must be alive and not ready"
    r = p.call("GET", "/mmi/broker")
    assert r.status == 200 and r.json()["role"] == "active", r.body[:300]
    assert r.json()["epoch"] >= 1


def test_a_paused_queue_is_kept_in_postgresql(stack: Stack) -> None:
    p = stack.project
    r = p.call("POST", "/mmi/services/demo/pause")
    assert r.status == 200 and r.json()["paused"] is True, r.body[:300]
    password = p.env["ZFAB_PG_PASSWORD"]
    rows = run(
        ["docker", "exec", "-e", f"PGPASSWORD={password}", container(p, "postgres"), "psql", "-h", "127.0.0.1",
         "-U", "zfab", "-d", "zfab", "-Atc", "SELECT doc::text FROM zfab_broker_kept WHERE kind = 'paused'"],
        timeout=30,
    )  # fmt: skip
    assert '"demo"' in rows.stdout, rows.stdout + rows.stderr
    assert p.call("POST", "/mmi/services/demo/resume").status == 200


def kill_9(p: Project, service: str) -> None:
    """SIGKILL the broker process inside its container, as a crash would: the container's init exits
    with it and the restart policy starts it again (a `docker kill` is a stop the policy respects)."""
    r = run(["docker", "exec", container(p, service), "sh", "-c", "kill -9 -1"], timeout=30)
    assert r.returncode in (0, 137), r.stdout + r.stderr


@pytest.mark.timeout(420)
@pytest.mark.parametrize("round_", range(FAILOVERS))
def test_kill_9_of_the_active_broker_and_the_standby_serves(stack: Stack, round_: int) -> None:
    p = stack.project
    was = poll("exactly one broker ready", 120, lambda: active(p))
    epoch = p.call("GET", "/mmi/broker").json()["epoch"]
    # a user's setting the next broker must start with (on a task the trickle does not use)
    assert p.call("PUT", "/mmi/services/demo/tasks/sleep/limits", {"concurrency": 3}).status == 200
    trickle = Trickle(p)
    try:
        poll("jobs completing before the kill", 60, lambda: len(trickle.completed) >= 3 or None)
        kill_9(p, was)
        killed_at = time.monotonic()  # after: a job sent while `docker exec` ran may still have gone through
        now = poll("the standby ready", SERVE_AGAIN_BOUND, lambda: active(p))
        assert now != was, broker_logs(p)  # keeper.py's newcomer rule: the restarted one waits for the standby
        ready_after = time.monotonic() - killed_at

        def after_kill() -> list[float]:  # answers to jobs sent once the broker was dead
            return [done for sent, done in trickle.completed if sent > killed_at]

        poll("a job sent after the kill completing", SERVE_AGAIN_BOUND, lambda: after_kill() or None)
        serving_after = min(after_kill()) - killed_at
        poll("jobs completing at the new broker", 60, lambda: len(after_kill()) >= 10 or None)
    finally:
        trickle.stop()
    # (ready: polled through `docker compose exec`, about a second a probe: a coarse figure)
    stack.timings.append((f"round {round_ + 1}: kill -9 {was} -> {now} ready", ready_after))
    stack.timings.append((f"round {round_ + 1}: kill -9 -> a job sent after it completed", serving_after))
    stack.notes.append(f"round {round_ + 1}: {len(trickle.accepted)} jobs accepted, {trickle.refused} refused")
    broker: dict[str, Any] = p.call("GET", "/mmi/broker").json()
    assert broker["role"] == "active" and broker["epoch"] > epoch, broker
    limits = {(row["service"], row["task"]): row for row in p.call("GET", "/mmi/limits").json()}
    kept = limits.get(("demo", "sleep"), {})
    assert kept.get("concurrency") == 3 and kept.get("source") == "set", f"the new active broker forgot it: {limits}"
    states = {uuid: final_state(p, uuid) for uuid in trickle.accepted}
    assert [u for u, st in states.items() if st != "completed"] == [], "accepted jobs not completed"
    # The killed one comes back (restart: unless-stopped) as the standby.
    poll(f"{was} back and alive", 120, lambda: alive(p, was) or None)
    assert active(p) == now
    assert p.call("DELETE", "/mmi/services/demo/tasks/sleep/limits").status == 200
