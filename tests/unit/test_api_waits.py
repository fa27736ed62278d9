"""api/fabric.py's `wait_done`: how the event loop waits for a future the client's owner thread completes."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import Any

from zfab.api.fabric import await_result, wait_done


def test_a_future_completed_on_another_thread_ends_the_wait() -> None:
    fut: Future[Any] = Future()

    async def main() -> tuple[bool, float]:
        threading.Timer(0.05, fut.set_result, ("x",)).start()
        t0 = time.monotonic()
        done = await wait_done(fut, 5.0)
        return done, time.monotonic() - t0

    done, took = asyncio.run(main())
    assert done is True and took < 2.0


def test_a_wait_that_times_out_leaves_the_future_to_others() -> None:
    fut: Future[Any] = Future()

    async def main() -> bool:
        return await wait_done(fut, 0.05)

    assert asyncio.run(main()) is False
    assert not fut.cancelled() and not fut.done()
    fut.set_result(1)  # completing it later (the loop is gone) raises nothing
    assert fut.result() == 1


def test_a_caller_that_goes_away_does_not_cancel_the_future() -> None:
    fut: Future[Any] = Future()

    async def main() -> None:
        task = asyncio.ensure_future(wait_done(fut, 5.0))
        await asyncio.sleep(0)  # the task runs until it waits
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    assert not fut.cancelled()


def test_done_futures_answer_at_once_and_results_and_errors_come_through() -> None:
    ok: Future[Any] = Future()
    ok.set_result({"w1": 1})
    bad: Future[Any] = Future()
    bad.set_exception(ValueError("boom"))

    async def main() -> tuple[Any, str]:
        assert await wait_done(ok, 0) is True
        got = await await_result(ok, 1.0)  # type: ignore[arg-type]
        try:
            await await_result(bad, 1.0)  # type: ignore[arg-type]
        except ValueError as exc:
            return got, str(exc)
        return got, ""

    assert asyncio.run(main()) == ({"w1": 1}, "boom")


def test_await_result_times_out_with_timeout_error() -> None:
    fut: Future[Any] = Future()

    async def main() -> str:
        try:
            await await_result(fut, 0.05)  # type: ignore[arg-type]
        except TimeoutError:
            return "timeout"
        return "no"

    assert asyncio.run(main()) == "timeout"
