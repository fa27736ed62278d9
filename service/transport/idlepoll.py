"""Polling before sleeping: an owner loop that expects its next message within microseconds looks for
it a little while before it goes to sleep, as KVM polls a halted vCPU before it yields it
(`halt_poll_ns`). Only the broker's owner does it (`ZFAB_BROKER_IDLE_POLL_US`).

Why: on a sequential job's path every hop wakes a sleeping thread, and a thread woken onto an idle
(virtual) CPU waits for that CPU to wake, tens of microseconds a hop on the 2-core VMs zfab is
measured on. The broker sees four of a job's six messages; while it polls, its CPU stays awake and
the next message is taken the moment it lands. A sequential echo job's p50 fell by about 30 %
(0.85 → 0.60 ms, docs/contributors/benchmark-log.md, "A broker that polls before it sleeps").

What it costs: the broker's CPU while it polls. The window adapts as KVM's does, so it is spent only
when it pays:
- a wait that ended within the window leaves the window as it is;
- a longer wait that still ended within the limit widens it (doubling from 10 µs);
- a wait longer than the limit halves it, down to none: an idle broker, or one whose messages come
  further apart than the limit, sleeps at once again after a few waits;
- a poll that lost more than a millisecond to other work (it waited that long for its CPU: a busy
  host, where other runnable work takes whole time slices) closes the window, so a poller does not
  take a core that other work needs. Shorter losses do not: on an idle host the fabric's own
  threads, woken onto the poller's CPU, preempt it for tens of microseconds, and closing the window
  for those cost 30 µs of p50 and doubled its spread.
So the most a broker spends polling is about the limit per message received, and only while
messages come at least that close together.

The broker's own other threads (the lease keeper, the event publisher, the metrics server) are off a
job's path. While the owner polls it holds the GIL as a busy thread does, so one of them that wants it
waits until the window ends or, while polls keep finding work, for the interpreter's switch interval
(5 ms), as beside any busy thread.

Why not the worker's or the client's owner: each shares its process with Python threads that take a
job's next step (the worker's pool threads, the client's caller), and a polling owner takes the GIL
back after each look, so those threads wait for the window to end (measured: +60 µs for a polling
worker). And on two cores one poller is what pays: the broker and the worker both polling, each on
its own core, left the client none (+120 µs against the broker alone).
"""

from __future__ import annotations

from dataclasses import dataclass

GROW_START = 10e-6  # seconds: the first window once a wait shows that polling would have paid
BUSY_LOST = 1e-3  # seconds of a poll lost to other work that say the host is busy


@dataclass(slots=True)
class IdlePoll:
    """The adaptive window of one owner loop (what it found: LoopStats.idle_polls_*)."""

    limit: float  # seconds: the widest window
    window: float = 0.0  # seconds: how long the next idle wait polls before it sleeps
    busy_lost: float = BUSY_LOST  # a poll that lost more than this to other work closes the window

    def settle(self, waited: float, polled: float, ran: float) -> None:
        """After an idle wait of `waited` seconds, of which `polled` were spent polling with `ran` seconds
        of this thread's CPU: set the next window."""
        w = self.window
        if polled - ran > self.busy_lost:
            # Preempted for long while polling: a busy host, where polling takes a core from others.
            self.window = 0.0
        elif waited <= w:
            return  # the poll found it: keep the window
        elif waited > self.limit:
            w /= 2  # a long wait: polling would not have paid
            self.window = w if w >= GROW_START else 0.0
        else:
            self.window = min(self.limit, max(GROW_START, w * 2))  # a short sleep: a wider window would have caught it
