"""A throwaway PostgreSQL server for tests: Debian's `postgresql` binaries, a cluster in a temporary
directory, listening on 127.0.0.1 on a free port, run as a non-root user as PostgreSQL requires.

PostgreSQL refuses to run as root, and tests run as root here and in CI: the cluster then belongs
to a system user (the package's `postgres`, else one made with useradd) and its tools run through
runuser. Authentication is `trust` on 127.0.0.1 only; fsync is off (a test cluster need not
survive a power cut, and fsyncs would dominate the suite's time).
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SUPERUSER = "zfab"
SYSTEM_USERS = ("postgres", "zfabpg")


def postgres_bin() -> Path | None:
    """The newest /usr/lib/postgresql/*/bin (Debian's layout), else a PATH holding initdb and pg_ctl."""

    def version(path: str) -> int:
        m = re.search(r"/postgresql/(\d+)/bin/", path)
        return int(m.group(1)) if m else 0

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb and (Path(os.path.realpath(initdb)).parent / "pg_ctl").exists():
        return Path(os.path.realpath(initdb)).parent
    return None


def require_postgres() -> Path:
    """PostgreSQL's bin directory; skip when it is missing, except under CI=true, where it must exist."""
    path = postgres_bin()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL (Debian package 'postgresql') is required under CI=true (.ci/run installs it)")
        pytest.skip("PostgreSQL not installed (Debian package 'postgresql' provides initdb and pg_ctl)")
    return path


def _system_user() -> str | None:
    """None when not root (the cluster runs as whoever we are); else a non-root user to run it as."""
    if os.geteuid() != 0:
        return None
    for name in SYSTEM_USERS:
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    useradd = ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"]
    subprocess.run(
        [*useradd, SYSTEM_USERS[-1]],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return SYSTEM_USERS[-1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One cluster; `start()`, `url(db)`, `create_database()`, `stop()` / `start()` again (same port)."""

    def __init__(self, bindir: Path, *, also: str | None = None, peer: str | None = None) -> None:
        """`also`: one more address to listen on, and `peer` one more that may connect (the host's and the
        namespace's side of a test's veth pair, tests/integration/netns.py)."""
        self.bin = bindir
        self.also, self.peer = also, peer
        self.user = _system_user()
        # Under /tmp: a TMPDIR that only root may enter would lock the cluster's user out.
        base = "/tmp" if self.user and os.path.isdir("/tmp") else None
        self.dir = Path(tempfile.mkdtemp(prefix="zfab-pg-", dir=base))
        if self.user:
            pw = pwd.getpwnam(self.user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        os.chmod(self.dir, 0o700)
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.port = _free_port()
        self.running = False
        self._databases = 0

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = (["runuser", "-u", self.user, "--"] if self.user else []) + list(args)
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=self.dir, stdin=subprocess.DEVNULL
        )

    def init(self) -> None:
        r = self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8",
            "--locale=C", "-N", timeout=120,
        )  # fmt: skip
        if r.returncode:
            raise RuntimeError(f"initdb failed: {r.stdout[-500:]} {r.stderr[-500:]}")
        for addr in (self.also, self.peer):  # trust both sides of the veth pair too
            if addr:
                self._run("sh", "-c", f"echo 'host all all {addr}/32 trust' >> {self.data / 'pg_hba.conf'}")

    def start(self) -> None:
        hosts = f"127.0.0.1,{self.also}" if self.also else "127.0.0.1"
        opts = (
            f"-h {hosts} -p {self.port} -k {self.dir} -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=100"
        )
        r = self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "40", "-o", opts, "start"
        )
        if r.returncode:
            raise RuntimeError(f"pg_ctl start failed: {self.log_tail()}")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        if self.running:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "stop", "-m", mode, "-w", "-t", "30")
            self.running = False

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{db}"

    def create_database(self, prefix: str = "t") -> str:
        """A new, empty database; its URL. Each test gets its own, so none sees another's rows."""
        import psycopg

        self._databases += 1
        name = f"{prefix}{self._databases}_{os.getpid()}"
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def sql(self, url: str, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """Run one statement (autocommit) and return its rows (none for statements without)."""
        import psycopg

        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(query.encode(), params)  # bytes: a literal query, no LiteralString check
            return list(cur.fetchall()) if cur.description else []


def serving() -> Iterator[PgServer]:
    """A test module's PostgreSQL (its `pg` fixture yields from this): started, then destroyed."""
    server = started()
    try:
        yield server
    finally:
        server.destroy()


def started(also: str | None = None, peer: str | None = None) -> PgServer:
    """A started cluster (skip or fail per require_postgres); destroy() it when done."""
    server = PgServer(require_postgres(), also=also, peer=peer)
    try:
        server.init()
        server.start()
    except BaseException:
        server.destroy()
        raise
    deadline = time.monotonic() + 20
    while True:  # pg_ctl -w waits for the postmaster; the first connection may still race its startup
        try:
            server.sql(server.url(), "SELECT 1")
            return server
        except Exception:
            if time.monotonic() > deadline:
                server.destroy()
                raise
            time.sleep(0.1)
