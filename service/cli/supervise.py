"""`zfab up`'s supervisor: it starts the stack's processes, restarts one that dies, and stops them in order.

- A child that dies is started again after a backoff (0.5 s, doubling, 8 s at most), one log line
  each time; one that keeps dying (RestartPolicy.max_streak deaths in a row, each within
  `stable_after` seconds of its start) is reported and left down.
- Children run in a process group of their own, so a Ctrl-C at the terminal reaches `zfab up`
  alone and it stops them in order (`stop`): workers first, which drain their running jobs to a
  broker still there, then the broker, then the API, each stage with a deadline and SIGKILL only
  past it. Each child also gets SIGTERM from the kernel when `zfab up` dies (PR_SET_PDEATHSIG),
  so none outlives a killed supervisor.
- Everything runs on the caller's thread: the parent-death signal follows the thread that
  forked a child, and a signal handler only sets an event.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from ..core.retries import Backoff

log = logging.getLogger("zfab")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
HURRIED_SECONDS = 1.0  # what each stage still gets after a second Ctrl-C: the broker and API stop cleanly


class Stage(IntEnum):
    """The order a stack stops in: workers first (their jobs need the broker), the API last."""

    WORKERS = 0
    BROKER = 1
    API = 2


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When a dead child is started again. Pure arithmetic (tested with a fake clock)."""

    backoff: Backoff = field(default_factory=lambda: Backoff(base=0.5, factor=2.0, cap=8.0, jitter=0.0))
    max_streak: int = 5
    """Deaths in a row (each soon after its start) after which a child is left down."""
    stable_after: float = 30.0
    """Seconds of life after which a death starts a new streak instead of extending one."""

    def streak_after(self, streak: int, lived: float) -> int:
        """The streak once a child that lived `lived` seconds has died."""
        return 1 if lived >= self.stable_after else streak + 1

    def delay(self, streak: int) -> float | None:
        """Seconds before the next start, or None when the child keeps dying and is left down."""
        return None if streak >= self.max_streak else self.backoff.delay(streak)


@dataclass(slots=True)
class Child:
    """One process of the stack, as the supervisor knows it."""

    name: str  # "broker", "worker demo-1", "api": what the log lines call it
    stage: Stage
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    streak: int = 0
    restart_at: float | None = None  # set while it waits out its backoff
    given_up: bool = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def exit_text(code: int) -> str:
    """`code 3` or `killed by SIGKILL` for a Popen return code."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"code {code}"


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that has the kernel send the child SIGTERM when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before prctl: no one would send it
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class Supervisor:
    """Starts, watches, restarts and stops the stack's children (see the module's docstring)."""

    def __init__(
        self,
        command: Sequence[str],
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.command = list(command)
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.children: list[Child] = []
        self.preexec = _die_with_parent()

    def add(self, name: str, stage: Stage, args: list[str], env: dict[str, str]) -> Child:
        child = Child(name, stage, args, env)
        self.children.append(child)
        self.start(child)
        return child

    def start(self, child: Child) -> None:
        child.proc = subprocess.Popen(
            self.command + child.args,
            env=child.env,
            stdin=subprocess.DEVNULL,
            process_group=0,  # a terminal's Ctrl-C is for the supervisor, which stops the stack in order
            preexec_fn=self.preexec,
        )
        child.started_at = self.clock()
        child.restart_at = None

    def watch(self) -> list[Child]:
        """Notice deaths and start the children whose backoff is over; the children just given up."""
        now = self.clock()
        gave_up = []
        for child in self.children:
            if child.given_up:
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restarts += 1
                    try:
                        self.start(child)
                    except OSError as exc:  # no more processes, a full disk: not worth a loop
                        log.error("zfab up: cannot start %s again: %s; leaving it down", child.name, exc)
                        child.given_up, child.restart_at = True, None
                        gave_up.append(child)
                continue
            if child.proc is None or child.proc.poll() is None:
                continue
            lived = now - child.started_at
            child.streak = self.policy.streak_after(child.streak, lived)
            wait = self.policy.delay(child.streak)
            how = exit_text(child.proc.returncode)
            if wait is None:
                child.given_up = True
                gave_up.append(child)
                log.error(
                    "zfab up: %s exited (%s) %d times in a row soon after starting; not restarting it",
                    child.name,
                    how,
                    child.streak,
                )
                continue
            child.restart_at = now + wait
            log.warning(
                "zfab up: %s exited (%s) after %.1f s; restarting it in %g s (restart %d)",
                child.name,
                how,
                lived,
                wait,
                child.restarts + 1,
            )
        return gave_up

    def stop(self, deadlines: dict[Stage, float], hurry: threading.Event) -> None:
        """Stop the children stage by stage: SIGTERM, then wait up to the stage's deadline (at most
        HURRIED_SECONDS once `hurry` is set: a second Ctrl-C) before SIGKILL. Children waiting to
        restart stay down."""
        for child in self.children:
            child.restart_at = None
        for stage in Stage:
            group = [c for c in self.children if c.stage == stage and c.running]
            for child in group:
                assert child.proc is not None
                child.proc.send_signal(signal.SIGTERM)
            until = self.clock() + deadlines[stage]
            while any(c.running for c in group):
                now = self.clock()
                if hurry.is_set():
                    until = min(until, now + HURRIED_SECONDS)
                if now >= until:
                    break
                if hurry.is_set():
                    time.sleep(0.05)
                else:
                    hurry.wait(0.05)  # wakes at once on a second Ctrl-C
            for child in group:
                if child.running:
                    assert child.proc is not None
                    why = "after a second Ctrl-C" if hurry.is_set() else f"after {deadlines[stage]:g} s"
                    log.warning("zfab up: %s had not stopped %s; killing it", child.name, why)
                    child.proc.kill()
                    child.proc.wait(5)

    def restarts(self) -> int:
        return sum(c.restarts for c in self.children)
