"""API replicas sharing one PostgreSQL database: who is alive, who owns which job, and the
notifications and commands that pass between them.

Each replica's fabric client holds the futures of the jobs it submitted: only that replica (the
job's `owner`) can cancel them or answer their input requests, and only it learns their events and
results as they happen. The others go through the database:

- **LISTEN/NOTIFY**: one connection per replica listens on `zfab_jobs` (a job's row or events
  changed: GET ?wait= and SSE on another replica wake on it), `zfab_schedules` (a schedule changed:
  every replica's scheduler reloads it), `zfab_cmd` and `zfab_reply` (commands below). A payload
  names ids only; the rows say the rest, so a lost notification costs a wait, never a wrong answer:
  waiters also re-read at SAFETY_READ intervals, and everything is re-read after a reconnect.
- **commands**: DELETE and POST .../input for another replica's job become a `job_commands` row
  and a NOTIFY to its owner, which calls its own client (the same code as for its own requests)
  and writes the HTTP answer back into the row; the asking replica answers with it.
- **heartbeats**: every replica updates its `api_replicas` row every timeout/5 seconds; one silent
  for ZFAB_API_REPLICA_TIMEOUT is gone, and its unfinished jobs are adopted (one replica each, by
  an UPDATE that checks the owner is still silent) and recovered from their workers, as after a
  restart. A replica that stops cleanly deletes its row, so its jobs are adopted at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from ..jobs.record import JobRecord
from ..store.base import StoreError
from ..store.pgschedules import SCHEDULES_CHANNEL
from ..store.postgres import COLUMNS, JOBS_CHANNEL, PgDatabase, PgJobStore
from .remote import SAFETY_READ, CommandTimeout

log = logging.getLogger(__name__)

COMMANDS_CHANNEL = "zfab_cmd"
REPLIES_CHANNEL = "zfab_reply"
CHANNELS = (JOBS_CHANNEL, SCHEDULES_CHANNEL, COMMANDS_CHANNEL, REPLIES_CHANNEL)
COMMAND_TIMEOUT = 10.0  # how long a replica waits for a job's owner to answer a command
COMMANDS_AT_ONCE = 64  # commands an owner runs concurrently; more wait their turn
ADOPT_BATCH = 100  # unfinished jobs of gone replicas adopted per heartbeat
FORGET_REPLICAS = 3600.0  # a gone replica's row is deleted after this long (the table stays small)

CommandHandler = Callable[[str, str, dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]


def new_replica_id() -> str:
    """Unique per process start: a restarted replica is a new owner, and adopts what its predecessor left."""
    host = socket.gethostname().split(".")[0][:32] or "api"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


class Replicas:
    """This replica's side of the coordination (one per API process on PostgreSQL)."""

    def __init__(self, db: PgDatabase, jobs: PgJobStore, broker: str, timeout: float, replica_id: str) -> None:
        self.db = db
        self.jobs = jobs
        self.broker = broker
        self.timeout = timeout
        self.id = replica_id
        self.alive: set[str] = {replica_id}
        self.listening = False
        self.beats = 0
        self.adopted = 0
        self.on_command: CommandHandler | None = None
        self.on_schedules: Callable[[list[str] | None], None] | None = None  # None: reload them all
        self.on_adopted: Callable[[list[JobRecord]], Awaitable[None]] | None = None
        self.on_beat: Callable[[], Awaitable[None]] | None = None  # after each heartbeat (retries recoveries)
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._replies: dict[int, asyncio.Future[None]] = {}
        self._commands = asyncio.Semaphore(COMMANDS_AT_ONCE)
        self._tasks: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[None]] = set()
        self._listening = asyncio.Event()
        self._failing = False

    @property
    def ok(self) -> bool:
        """The database answers and notifications arrive (the /readyz `database` check)."""
        return self.db.ok and self.listening

    @property
    def interval(self) -> float:
        return max(0.2, self.timeout / 5)

    # ---- lifecycle ------------------------------------------------------------------------------

    async def start(self, wait: float = 10.0) -> None:
        await self._beat()
        self._tasks = [
            asyncio.create_task(self._listen(), name="api replicas listener"),
            asyncio.create_task(self._heartbeat(), name="api replicas heartbeat"),
        ]
        with suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._listening.wait()

    async def stop(self) -> None:
        self.wake_all()  # a GET ?wait= or an SSE stream waiting on another replica's job sees the stop now
        for task in [*self._tasks, *self._running]:
            task.cancel()
        for task in [*self._tasks, *self._running]:
            with suppress(asyncio.CancelledError, Exception):
                await task
        try:
            # Gone at once rather than after a timeout: the others adopt our unfinished jobs now.
            await self.db.fetch("DELETE FROM api_replicas WHERE id = %s", (self.id,))
        except StoreError as exc:
            log.warning("api replicas: could not deregister %s: %s", self.id, exc)

    # ---- who is alive --------------------------------------------------------------------------

    async def _beat(self) -> None:
        rows = await self.db.fetch(
            """WITH me AS (
                   INSERT INTO api_replicas (id, host, pid) VALUES (%s, %s, %s)
                   ON CONFLICT (id) DO UPDATE SET seen_at = now())
               SELECT id FROM api_replicas WHERE seen_at > now() - %s * interval '1 second'""",
            (self.id, socket.gethostname()[:255], os.getpid(), self.timeout),
        )
        self.alive = {str(r[0]) for r in rows} | {self.id}
        self.beats += 1

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._beat()
                if self._failing:
                    self._failing = False
                    log.info("api replicas: the database answers again")
                await self._adopt_orphans()
                if self.on_beat is not None:
                    await self.on_beat()
                if self.beats % 30 == 0:
                    await self._housekeeping()
            except StoreError as exc:
                if not self._failing:  # once per outage, not every beat
                    log.warning("api replicas: heartbeat failed (retrying): %s", exc)
                self._failing = True
            except Exception:
                log.exception("api replicas: heartbeat failed")

    async def _housekeeping(self) -> None:
        await self.db.fetch(
            "DELETE FROM api_replicas WHERE seen_at < now() - %s * interval '1 second'", (FORGET_REPLICAS,)
        )
        # Commands nobody collected (the asking replica died while it waited).
        await self.db.fetch("DELETE FROM job_commands WHERE created_at < now() - interval '5 minutes'")

    def owner_alive(self, owner: str) -> bool:
        """As of the last heartbeat (a replica that started since may be missing: see adopt)."""
        return owner in self.alive

    async def adopt(self, rec: JobRecord) -> bool:
        """Become the owner of an unfinished job whose owner is gone. False when its owner turns out
        alive (the database decides, not our cache) or another replica adopted it first."""
        rows = await self.db.fetch(
            """UPDATE jobs SET owner = %(me)s, updated_at = now()
               WHERE uuid = %(uuid)s AND owner = %(old)s AND NOT EXISTS (
                   SELECT 1 FROM api_replicas WHERE id = %(old)s AND seen_at > now() - %(t)s * interval '1 second')
               RETURNING uuid""",
            {"me": self.id, "uuid": rec.uuid, "old": rec.owner, "t": self.timeout},
        )
        if rows:
            rec.owner = self.id
            self.adopted += 1
            return True
        self.alive.add(rec.owner)
        return False

    async def _adopt_orphans(self) -> None:
        if self.on_adopted is None:
            return
        sql_text: LiteralString = (
            "UPDATE jobs SET owner = %(me)s, updated_at = now() WHERE uuid IN ("
            " SELECT uuid FROM jobs j WHERE state IN ('queued', 'running', 'waiting') AND broker = %(broker)s"
            " AND owner <> %(me)s AND NOT EXISTS (SELECT 1 FROM api_replicas r WHERE r.id = j.owner"
            "   AND r.seen_at > now() - %(t)s * interval '1 second')"
            " ORDER BY seq LIMIT %(n)s FOR UPDATE SKIP LOCKED) RETURNING " + COLUMNS
        )
        rows = await self.db.fetch(
            sql_text, {"me": self.id, "broker": self.broker, "t": self.timeout, "n": ADOPT_BATCH}
        )
        recs = [r for row in rows if (r := self.jobs.record(row)) is not None]
        if recs:
            self.adopted += len(recs)
            log.info("api replicas: adopted %d unfinished jobs of replicas that are gone", len(recs))
            await self.on_adopted(recs)

    # ---- notifications -------------------------------------------------------------------------

    async def _listen(self) -> None:
        backoff = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.db.url,
                    autocommit=True,
                    application_name=f"zfab-api {self.id} listener"[:63],
                    connect_timeout=5,
                ) as conn:
                    for channel in CHANNELS:
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.listening = True
                    self._listening.set()
                    backoff = 0.5
                    self._resync()
                    async for note in conn.notifies():
                        self._dispatch(note.channel, note.payload)
            except (psycopg.Error, OSError) as exc:
                if self.listening:
                    log.warning("api replicas: lost the notification connection: %s", str(exc).strip())
            self.listening = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _resync(self) -> None:
        """After (re)connecting: notifications may have been missed, so everyone re-reads."""
        for group in self._waiters.values():
            for ev in group:
                ev.set()
        for fut in self._replies.values():
            if not fut.done():
                fut.set_result(None)
        if self.on_schedules is not None:
            self.on_schedules(None)
        self._spawn(self._pending_commands())

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == JOBS_CHANNEL:
            for uuid in payload.split(","):
                for ev in self._waiters.get(uuid, ()):
                    ev.set()
        elif channel == SCHEDULES_CHANNEL:
            if self.on_schedules is not None:
                self.on_schedules([i for i in payload.split(",") if i])
        elif channel in (COMMANDS_CHANNEL, REPLIES_CHANNEL):
            replica, _, cid = payload.rpartition(":")
            if replica != self.id or not cid.isdigit():
                return
            if channel == COMMANDS_CHANNEL:
                self._spawn(self._run_command(int(cid)))
            elif (fut := self._replies.get(int(cid))) is not None and not fut.done():
                fut.set_result(None)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def listen(self, uuid: str) -> asyncio.Event:
        """An event set when the job's row or events change on any replica; give it back with unlisten."""
        ev = asyncio.Event()
        self._waiters.setdefault(uuid, set()).add(ev)
        return ev

    def unlisten(self, uuid: str, ev: asyncio.Event) -> None:
        group = self._waiters.get(uuid)
        if group is not None:
            group.discard(ev)
            if not group:
                del self._waiters[uuid]

    def wake_all(self) -> None:
        """The server is stopping: every waiter looks again (and sees it)."""
        for group in self._waiters.values():
            for ev in group:
                ev.set()

    # ---- commands ------------------------------------------------------------------------------

    async def command(
        self, owner: str, uuid: str, op: str, body: dict[str, Any], timeout: float = COMMAND_TIMEOUT
    ) -> tuple[int, dict[str, Any]]:
        """Ask the job's owner to run `op` on it; (HTTP status, answer body) as the owner answered."""
        rows = await self.db.fetch(
            """WITH c AS (INSERT INTO job_commands (replica, sender, job_uuid, op, body)
                          VALUES (%(owner)s, %(me)s, %(uuid)s, %(op)s, %(body)s) RETURNING id)
               SELECT id, pg_notify(%(channel)s, %(owner)s || ':' || id) FROM c""",
            {
                "owner": owner,
                "me": self.id,
                "uuid": uuid,
                "op": op,
                "body": json.dumps(body),
                "channel": COMMANDS_CHANNEL,
            },
        )
        cid = int(rows[0][0])
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._replies[cid] = fut
        deadline = time.monotonic() + timeout
        try:
            while True:
                with suppress(TimeoutError):
                    async with asyncio.timeout(min(SAFETY_READ, max(0.0, deadline - time.monotonic()))):
                        await asyncio.shield(fut)
                done = await self.db.fetch(
                    "SELECT status, answer FROM job_commands WHERE id = %s AND status IS NOT NULL", (cid,)
                )
                if done or time.monotonic() >= deadline:
                    break
                if fut.done():
                    fut = self._replies[cid] = asyncio.get_running_loop().create_future()
        finally:
            self._replies.pop(cid, None)
            with suppress(StoreError):
                await self.db.fetch("DELETE FROM job_commands WHERE id = %s", (cid,))
        if not done:
            raise CommandTimeout(f"replica {owner}, which runs job {uuid}, did not answer within {timeout:g} s")
        status, answer = done[0]
        parsed = json.loads(answer) if answer else {}
        return int(status), parsed if isinstance(parsed, dict) else {}

    async def _pending_commands(self) -> None:
        """Commands sent while our listener was away."""
        try:
            rows = await self.db.fetch(
                "SELECT id FROM job_commands WHERE replica = %s AND status IS NULL ORDER BY id", (self.id,)
            )
        except StoreError:
            return
        for (cid,) in rows:
            self._spawn(self._run_command(int(cid)))

    async def _run_command(self, cid: int) -> None:
        async with self._commands:
            try:
                rows = await self.db.fetch(
                    "SELECT job_uuid, op, body FROM job_commands WHERE id = %s AND status IS NULL", (cid,)
                )
                if not rows or self.on_command is None:
                    return
                uuid, op, body = rows[0]
                try:
                    parsed = json.loads(body)
                except ValueError:
                    parsed = {}
                status, answer = await self.on_command(str(op), str(uuid), parsed if isinstance(parsed, dict) else {})
                await self.db.fetch(
                    """WITH u AS (UPDATE job_commands SET status = %s, answer = %s WHERE id = %s RETURNING sender, id)
                       SELECT pg_notify(%s, sender || ':' || id) FROM u""",
                    (status, json.dumps(answer, default=str), cid, REPLIES_CHANNEL),
                )
            except StoreError as exc:
                log.warning("api replicas: command %d not answered: %s", cid, exc)
            except Exception:
                log.exception("api replicas: command %d failed", cid)
