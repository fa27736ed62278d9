"""How the threads zfab starts for its sockets are scheduled: SCHED_BATCH on Linux, when asked
(`ZFAB_SCHED_BATCH`, off by default).

Every hand-over on a job's path wakes a thread while the waker still runs: a sender wakes
ZeroMQ's I/O thread (the last frame of each message), another thread wakes an owner loop (its
eventfd), and an owner wakes a waiting thread while it holds the GIL. Under SCHED_OTHER the woken
thread preempts the waker on its CPU at once, and a Python thread woken so only finds the GIL
held and sleeps again: two context switches for nothing, several times a job. A SCHED_BATCH thread
is never woken into preemption: it runs once the waker sleeps (an owner going back to its poll,
a few microseconds later) or on an idle CPU. Its share of the CPU over time is unchanged (the
same CFS weight, its nice value kept); only wake-up preemption is given up. On an idle 2-core
machine a sequential echo job's p50 fell by about a fifth. But wake-up preemption is also what lets
a woken owner past CPU-bound work, and with two busy cores its p50 rose up to 6x and its p99 up to
4x (docs/contributors/benchmark-log.md, "Who preempts whom"). Hence off by default: it is for a host
given to the fabric.

Only threads zfab starts: an owner loop's thread (loop.py), and the threads it starts, which
inherit it: ZeroMQ starts a context's I/O threads when its first socket is made, on the owner's
thread. An event loop's thread (aioloop.py) is its application's, and is left as it is.
ZMQ_THREAD_SCHED_POLICY is not used: libzmq asserts (aborts the process) when the call fails,
where a refusal here is only a slower loop.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def batch_this_thread() -> bool:
    """Put the calling thread (and the threads it starts from now on) under SCHED_BATCH. False where
    there is no such policy (not Linux) or the system refused it (a seccomp profile, say): the
    thread then runs as it did, which costs latency, never correctness."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))  # 0: the calling thread (Linux schedules threads)
    except OSError as exc:
        log.debug("SCHED_BATCH refused for this thread: %s", exc)
        return False
    return True
