"""The Args, Returns, Raises and Example sections of `Client`'s docstrings, appended to them as the package is
imported, so `help(Client.submit)` and the Python reference (mkdocstrings) show them. They live here, beside
the class, because client.py keeps to its size (tests/unit/test_layout.py); what each method does is said in
its own docstring there, and this adds the details. tests/unit/test_docstrings.py checks that every argument
a section names is one the method takes."""

from __future__ import annotations

from ..core.docstrings import document
from .client import Client

SECTIONS: dict[str, str] = {
    "": """
        Args:
            broker: the broker's endpoint, e.g. `"tcp://127.0.0.1:5555"` (default: `ZFAB_BROKER`).
            name: the client's name, as the broker shows it (`show_clients`).
            settings: bounds and timings (default: `Settings()`, read from the `ZFAB_*` environment).
            acks: `False` skips the per-job 202/201 acknowledgements: faster, at the cost the wire protocol
                describes.
            push: `True` (default) has results pushed when ready; `False` polls for them.
            poll_after: seconds before a job with no news is asked about (default: two keepalive intervals).
            queued_notice: seconds a job may wait in the broker's queue before the broker says "queued".
            encoded_results: hold finished results as the JSON they came as, decoded at each `result()`.
            on_complete: callables run on the client's loop thread as each job ends.
            transport: for tests: a stub transport (`zfab.transport.stub`).
            clock: for tests: a fake clock.

        One `Client` may be shared by many threads: its socket is owned by its own loop, and each
        method here may be called from any thread.

        Example:
            ```python
            from zfab import Client

            with Client(broker="tcp://127.0.0.1:5555", name="me") as client:
                results = client.run_job("demo", "echo", kwargs={"data": "hi"})
                for worker, entry in results.items():
                    print(worker, entry["result"])             # demo-1 hi
            ```
    """,
    "submit": """
        Args:
            service: the service whose workers run it.
            task: the task's name.
            args: positional arguments, as JSON.
            kwargs: keyword arguments, as JSON; checked against the task's schema before it runs.
            workers: `"any"` (one worker), `"all"` (every worker of the service), a worker's name, or a
                list of names.
            timeout: seconds the job may take, end to end, counted from the end of its delay.
            on_event: called with each of the job's events as it arrives, on the client's loop thread.
            uuid: the job's id (default: a new one).
            retries: attempts after the first when the task raises or its worker is lost.
            priority: 0-9, higher first (default 5).
            delay: seconds the broker holds the job before it is sent.
            not_before: an epoch time before which it is not sent (instead of `delay`).
            resubmit: send again a job the broker admitted before (same uuid).
            backoff: the wait between attempts: seconds (doubling), or a `Backoff`.
            attempt: start it as this attempt.

        Returns:
            The job's `JobFuture`; its `result()` waits for `{worker name: result entry}`.

        Raises:
            ValueError: a timeout, priority, delay or retries out of range.
            BusyError: this client already holds `ZFAB_MAX_CLIENT_JOBS` jobs, or their bytes.
            PayloadTooLargeError: the request is over the message limit.
            ClosedError: the client is closing.

        Example:
            ```python
            futures = [client.submit("demo", "add", args=[i, i]) for i in range(10)]
            print([next(iter(f.result(10).values()))["result"] for f in futures])     # [0, 2, 4, ...]
            later = client.submit("demo", "echo", kwargs={"data": 1}, delay=2, priority=9, retries=2)
            ```
    """,
    "run_job": """
        Args:
            service: the service whose workers run it.
            task: the task's name.
            args: positional arguments, as JSON.
            kwargs: keyword arguments, as JSON.
            workers: `"any"`, `"all"`, a worker's name or a list of names.
            timeout: seconds the job may take.

        Returns:
            `{worker name: result entry}`; an entry has `result`, `failed`, `errors`, `messages`, `juuid`,
            `task`, `status`, `task_started`, `task_completed` and `service`. A task that raised is an entry
            with `failed: True` and its traceback in `errors`, not an exception.

        Raises:
            NoWorkersError: no live worker of the service matched `workers`.
            BadRequestError: an unknown task, or arguments its schema refuses.
            BusyError: a queue on the way is full; retry later.
            JobTimeoutError: the job did not finish within `timeout`.
            WorkerLostError: its worker was lost before it answered.
            BrokerUnavailableError: the broker did not answer within its hold time.

        Example:
            ```python
            results = client.run_job("demo", "add", kwargs={"a": 1, "b": 2})
            assert [entry["result"] for entry in results.values()] == [3]
            ```
    """,
    "recover": """
        Args:
            service: the job's service.
            uuid: the job's id.
            workers: the names of the workers that ran it.
            timeout: seconds to wait for their answers.
            attempt: the attempt to ask for.

        Returns:
            A `JobFuture` that resolves like `submit()`'s; it runs nothing again.

        Raises:
            ValueError: no worker names given.
            JobNotFoundError: (from the future) no worker knows the job.

        Example:
            ```python
            fut = client.recover("demo", uuid, ["demo-1"])
            print(fut.result(30))
            ```
    """,
    "subscribe": """
        Args:
            prefix: a topic prefix, e.g. `"job.demo."` (every state change of the demo service's jobs).
            endpoint: the broker's event publisher (default: `ZFAB_BROKER_EVENTS`).
            queue_size: events held for this subscriber before the oldest are dropped (counted).

        Returns:
            A started `Subscriber`: iterate it, and close it (or use it in a `with` block).

        Raises:
            ValueError: no events endpoint is configured.
            SubscriptionError: the publisher did not confirm the subscription in time.

        Example:
            ```python
            with client.subscribe("job.demo.") as events:
                for event in events:
                    print(event["topic"], event["state"])          # job.demo.echo.completed completed
            ```
    """,
    "mmi": """
        Args:
            task: `show_workers`, `show_services`, `show_broker`, `show_clients`, `show_limits`,
                `pause_service`, `resume_service`, `set_limit`...
            timeout: seconds to wait for the answer.
            **kwargs: the task's arguments, e.g. `service="demo"`.

        Returns:
            The broker's answer, as JSON (a list of workers, a dictionary...).

        Raises:
            BrokerUnavailableError: the broker did not answer within its hold time.
            BadRequestError: an unknown MMI task, or bad arguments.

        Example:
            ```python
            print([w["name"] for w in client.mmi("show_workers")])
            client.mmi("pause_service", service="demo")        # jobs queue, none is sent...
            client.mmi("resume_service", service="demo")       # ...until it resumes
            ```
    """,
    "cancel": """
        Args:
            uuid: the job's id (`future.uuid`).

        Returns:
            False when this client does not track the job, True once the cancel is sent. A queued job
            leaves the queue; a running one is asked to stop (its task sees it at `job.check()`).

        Example:
            ```python
            fut = client.submit("demo", "sleep", kwargs={"seconds": 30})
            client.cancel(fut.uuid)
            ```
    """,
    "events": """
        Args:
            fut: the job's future.
            timeout: seconds to follow it at most.

        Returns:
            An iterator of event dictionaries (`message`, `progress`, `event_type`, `worker`...).

        Example:
            ```python
            fut = client.submit("demo", "progress", kwargs={"steps": 3})
            for event in client.events(fut):
                print(event["message"], event.get("progress"))
            ```
    """,
    "job_events": """
        Args:
            service: the job's service.
            uuid: the job's id.
            worker: the worker that ran it.
            timeout: seconds to wait for the worker.

        Returns:
            The job's events, oldest first.

        Example:
            ```python
            events = client.job_events("demo", fut.uuid, "demo-1")
            ```
    """,
    "send_input": """
        Args:
            uuid: the job's id.
            value: the answer, as JSON; the worker checks it against the request's schema.
            input_id: which request it answers (default: the one open).
            timeout: seconds to wait for the worker to take it.

        Raises:
            JobNotFoundError: this client does not track the job.
            BadRequestError: the worker refused the answer (not what the schema asks, or no request open).

        Example:
            ```python
            fut = client.submit("demo", "ask", kwargs={"question": "name?"})
            for event in client.events(fut):
                if event.get("event_type") == "input_request":   # the task asks
                    client.send_input(fut.uuid, "Ada")
            print(fut.result(10))                              # {worker: {"result": {"answer": "Ada", ...}}}
            ```
    """,
    "open_stream": """
        Args:
            service: the files service.
            path: the file's path inside the worker's root.
            workers: `"any"` or one worker's name.
            offset: the byte to start from.
            chunk_size: bytes per chunk.
            window: chunks in flight at once.
            timeout: seconds the whole transfer may take.

        Returns:
            A `FileStream`: iterate it for the file's chunks, in order.

        Raises:
            ValueError: `workers` names more than one worker.

        Example:
            ```python
            with open("copy.csv", "wb") as out:
                for chunk in client.open_stream("files", "reports/2026.csv"):
                    out.write(chunk)
            ```
    """,
    "fetch_file": """
        Args:
            service: the files service (`zfab worker --service files --root DIR`).
            path: the file's path inside the worker's root.
            dest: where to write it.
            workers: `"any"` or one worker's name.
            resume: continue a partial `dest` instead of starting over.
            chunk_size: bytes per chunk.
            window: chunks in flight at once: a slow disk throttles the worker, memory stays bounded.
            timeout: seconds the whole transfer may take.

        Returns:
            The file's details from its worker (`path`, `size`, `sha256`...).

        Raises:
            ChecksumError: the download's sha256 differs from the worker's.
            BadRequestError: a path outside the worker's root, or no such file.

        Example:
            ```python
            details = client.fetch_file("files", "reports/2026.csv", "/tmp/2026.csv", resume=True)
            ```
    """,
}


document(Client, SECTIONS)
