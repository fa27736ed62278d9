"""Same-host shared memory: a process's blocks (made, reused, counted, freed) and its view of a peer's.

A sender whose payload is over ZFAB_SHM_THRESHOLD copies it into a block of its own in
ZFAB_SHM_DIR (a tmpfs, /dev/shm) and sends a handle (core/shmhandle.py) in its place; the receiver
copies the payload out with pread and parses the copy. Every step that fails (the cap, a full
tmpfs, a block that cannot be opened) leaves the payload to the sockets, counted.

A peer's block is never mapped. Its creator (any process of the same user, which may be hostile)
can truncate the file at any moment, and a read of a mapping past the new end faults with SIGBUS,
which kills the reader; so can a read of a sparse block's hole on a full tmpfs. pread returns short
(or zeros for a hole) instead, and a short read is a refused handle. A block is read only when it
is a regular file of this process's own user (checked on the opened file: root would otherwise
read any user's block), and only as many bytes as a message may carry (ZFAB_MAX_MESSAGE_BYTES),
checked before anything is read. The copy costs about 2 ms per 10 MB.

Blocks are reused, and stay mapped by their creator: taking fresh tmpfs pages for every 10 MB
payload (and giving them back) costs more than the copy into them, and pwrite into tmpfs costs 5-10x
a memcpy into a mapping. So a creator keeps its blocks mapped (all their pages allocated up front,
so a full tmpfs is an error at the start, never a SIGBUS), a block whose payload was read goes back
to its creator's pool, and the next payload gets a new token, which an old handle no longer matches. Who
gives a block back: a request's client when its job ends; a result's reader (the client) by writing
the token it read into the block's header (shmhandle.RELEASED_AT), or its worker RESULT_LINGER
seconds after it was sent (then unlinked, never reused: a late reader keeps its pages). Free blocks
idle for POOL_IDLE seconds are unlinked. Blocks of a process that died are unlinked by the next zfab
process of its pid namespace that looks (at its start and every RECLAIM_SECONDS): a block's name
says who made it. docs/protocol.md, "Same-host shared memory (zfab)", is the spec.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import secrets
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core import shmhandle
from ..core.protocol import Frame
from ..core.shmhandle import HEADER_BYTES, RELEASED_AT, TOKEN_BYTES, Handle, HandleError
from ..settings import Settings

log = logging.getLogger(__name__)

RESULT_LINGER = 60.0  # seconds a worker keeps a result block its client has not given back
RECLAIM_SECONDS = 30.0  # how often a long-lived process looks for dead creators' blocks
SWEEP_SECONDS = 1.0  # how often a creator looks at its blocks (given back, expired, idle)
POOL_IDLE = 10.0  # seconds a free block is kept for the next payload before it is unlinked
POOL_BLOCKS = 16  # free blocks kept at most
MAX_BLOCKS = 256  # blocks held at once (each keeps a file descriptor open); past it, the sockets
GRAIN = 1 << 20  # block sizes are rounded up to this, so a block fits the next payload of about its size
# Read-write: a result's reader gives it back. O_NONBLOCK: a FIFO named like a block does not hang the open.
OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def host_id(shm_dir: str) -> str | None:
    """An id equal in two processes only where `shm_dir` is the same directory of the same kernel
    and they run as the same user: the boot id, the device and inode of the directory (a container
    with a private /dev/shm has a tmpfs of its own, so another device), and the uid (blocks are
    0600: another user could not open them, so it gets bytes). None where there is no directory."""
    try:
        st = os.stat(shm_dir)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    return hashlib.sha256(f"{boot}:{st.st_dev}:{st.st_ino}:{os.getuid()}".encode()).hexdigest()[:32]


def _pid_namespace() -> str:
    try:
        return f"{os.stat('/proc/self/ns/pid').st_ino & 0xFFFFFFFF:08x}"
    except OSError:
        return "00000000"


def _start_time(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


@dataclass(slots=True, eq=False)
class _Block:
    name: str
    fd: int
    mm: mmap.mmap  # kept mapped by its creator: the next payload is a memcpy, not a pwrite
    capacity: int  # the file's size (it never shrinks, so a reader's mapping stays inside it)
    token: bytes = b""
    busy: bool = False
    returns: bool = False  # a result: its reader gives it back by writing the token at RELEASED_AT
    until: float = 0.0  # monotonic: busy, when it is taken back; free, when it is unlinked


class ShmArena:
    """One process's shared-memory tier: its host id, the blocks it made, its counters.

    Thread-safe: a client makes blocks on its callers' threads and frees them on its owner, a
    worker makes them on pool threads and sweeps on its owner. The lock is never held over a copy."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.dir = settings.shm_dir
        self.cap = settings.shm_bytes
        self.host = host_id(self.dir) if settings.shm else None
        # Off (or no tmpfs): no payload is ever this large, so the hot path's one comparison says no.
        self.threshold = settings.shm_threshold if self.host is not None else sys.maxsize
        self.clock = clock
        self.max_payload = settings.max_message_bytes  # a handle may claim no more than a message carries
        self._uid = os.geteuid()
        self._ns = _pid_namespace()
        self._pid = os.getpid()
        self._prefix = f"zfab-{self._ns}-{self._pid}-{_start_time(self._pid) or 0}-"
        self._lock = threading.Lock()
        self._blocks: dict[str, _Block] = {}
        self.bytes = 0  # of every block held, busy or free (what the cap bounds)
        self.counts: dict[str, int] = {
            "sent": 0,  # payloads that left as a handle
            "received": 0,  # handles read
            "fallbacks": 0,  # payloads that went through the sockets: cap reached, tmpfs full, unreadable
            "refused": 0,  # handles refused: forged, stale, wrong token, out of bounds, another user's
            "expired": 0,  # result blocks nobody gave back in time, unlinked
            "reclaimed": 0,  # blocks of dead processes unlinked
        }
        self._swept = 0.0
        self._reclaimed_at = -RECLAIM_SECONDS

    @property
    def enabled(self) -> bool:
        return self.host is not None

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    def stats(self) -> dict[str, int]:
        busy = sum(b.capacity for b in list(self._blocks.values()) if b.busy)
        return {
            "shm_bytes": self.bytes,
            "shm_busy_bytes": busy,
            "shm_blocks": len(self._blocks),
            "shm_bytes_capacity": self.cap,
        } | {f"shm_{k}": v for k, v in self.counts.items()}

    # ---- the sender's side ---------------------------------------------------------

    def put(self, payload: Frame, *, ttl: float, worker: str | None = None) -> bytes | None:
        """Copy `payload` into a block (a free one of this process, or a new one) and return the
        handle frame to send in its place, or None (counted) when it must go through the sockets:
        over the cap, or the tmpfs refused. With `worker` (a result) the reader gives it back."""
        need = HEADER_BYTES + len(payload)
        blk = self._take(need)
        if blk is None:
            return None  # counted
        token = secrets.token_bytes(TOKEN_BYTES)
        # The header first: a reader still holding the previous handle sees the token change and
        # refuses what it copied (ShmArena._copy) rather than pass on a torn payload.
        blk.mm[:HEADER_BYTES] = shmhandle.header(token, len(payload))
        blk.mm[HEADER_BYTES:need] = payload
        with self._lock:
            blk.token, blk.returns, blk.until = token, worker is not None, self.clock() + ttl
        self.counts["sent"] += 1
        return shmhandle.encode_handle(Handle(blk.name, len(payload), token, worker))

    def free(self, handle_frame: Frame) -> None:
        """The creator is done with a block it made (its job ended): back to the pool."""
        try:
            handle = shmhandle.decode_handle(handle_frame)
        except HandleError:
            return
        with self._lock:
            blk = self._blocks.get(handle.name)
            if blk is None or not blk.busy or blk.token != handle.token:
                return
            blk.busy, blk.until = False, self.clock() + POOL_IDLE

    def _take(self, need: int) -> _Block | None:
        """A free block that fits `need` (not more than twice as large), or a new one within the
        cap; None (counted as a fallback) when there is neither."""
        self._take_back()
        with self._lock:
            fits = [b for b in self._blocks.values() if not b.busy and need <= b.capacity <= 2 * need + GRAIN]
            if fits:
                blk = min(fits, key=lambda b: b.capacity)
                # Busy, and no longer waiting for the token of its last payload: another thread's
                # _take_back must not see that token given back and free it while it is written.
                blk.busy, blk.returns, blk.token = True, False, b""
                return blk
            size = -(-need // GRAIN) * GRAIN
            # Room for a new block: free blocks that do not fit go first.
            for b in sorted((b for b in self._blocks.values() if not b.busy), key=lambda b: b.until):
                if self.bytes + size <= self.cap:
                    break
                self._unlink_locked(b)
            if self.bytes + size > self.cap or len(self._blocks) >= MAX_BLOCKS:
                self.counts["fallbacks"] += 1  # the cap: the sockets take it, as they always could
                return None
            self.bytes += size
        name = self._prefix + secrets.token_hex(8)
        try:
            fd = os.open(os.path.join(self.dir, name), CREATE_FLAGS, 0o600)
        except OSError as exc:
            with self._lock:
                self.bytes -= size
            self._fallback("could not make a shared-memory block", exc)
            return None
        try:
            # Every page now: a full tmpfs is ENOSPC here, not a SIGBUS when the mapping is written.
            os.posix_fallocate(fd, 0, size)
            blk = _Block(name, fd, mmap.mmap(fd, size), size, busy=True)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, name))
            with self._lock:
                self.bytes -= size
            self._fallback("could not size a shared-memory block", exc)
            return None
        with self._lock:
            self._blocks[name] = blk
        return blk

    def _take_back(self) -> None:
        """Busy result blocks whose reader wrote their token back are free again."""
        with self._lock:
            waiting = [b for b in self._blocks.values() if b.busy and b.returns]
        for b in waiting:
            try:
                # pread, not the mapping: a same-user peer may have cut the file, and a read past
                # its end through the mapping would fault.
                given = os.pread(b.fd, TOKEN_BYTES, RELEASED_AT)
            except OSError:
                continue
            with self._lock:
                if b.busy and b.token == given:
                    b.busy, b.until = False, self.clock() + POOL_IDLE

    def _unlink_locked(self, blk: _Block) -> None:
        if self._blocks.pop(blk.name, None) is None:
            return
        self.bytes -= blk.capacity
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.dir, blk.name))
        blk.mm.close()
        with contextlib.suppress(OSError):
            os.close(blk.fd)

    def _fallback(self, what: str, exc: OSError) -> None:
        self.counts["fallbacks"] += 1
        if self.counts["fallbacks"] <= 3 or self.counts["fallbacks"] % 1000 == 0:
            log.warning("%s in %s (%s); the payload goes through the socket", what, self.dir, exc)

    def sweep(self, *, force: bool = False) -> None:
        """Take back given-back results, unlink results past their linger and free blocks idle past
        POOL_IDLE (or past POOL_BLOCKS); now and then unlink blocks whose creator died. Cheap when
        nothing is due (one clock reading)."""
        now = self.clock()
        if not self._blocks and now - self._reclaimed_at < RECLAIM_SECONDS:
            return
        if not force and now - self._swept < SWEEP_SECONDS:
            return
        self._swept = now
        self._take_back()
        with self._lock:
            free = sorted((b for b in self._blocks.values() if not b.busy), key=lambda b: b.until)
            extra = len(free) - POOL_BLOCKS
            for b in list(self._blocks.values()):
                if b.busy and not b.returns:
                    continue  # a request: its client gives it back when the job ends
                if b.busy and now >= b.until:
                    self.counts["expired"] += 1
                    self._unlink_locked(b)  # never reused: a reader that comes late keeps its pages
                elif not b.busy and (now >= b.until or (extra > 0 and b in free[:extra])):
                    self._unlink_locked(b)
        if now - self._reclaimed_at >= RECLAIM_SECONDS:
            self._reclaimed_at = now
            self.reclaim()

    def reclaim(self) -> int:
        """Unlink the blocks of dead creators in this pid namespace (a reused pid has another start
        time); a block of another namespace is left to the processes that can tell."""
        if self.host is None:
            return 0
        try:
            names = os.listdir(self.dir)
        except OSError:
            return 0
        n = 0
        ours = f"zfab-{self._ns}-"
        for name in names:
            if not name.startswith(ours) or name.startswith(self._prefix):
                continue
            m = shmhandle.NAME.fullmatch(name)
            if m is None:
                continue
            if _start_time(int(m.group(2))) == m.group(3):
                continue  # its creator is alive
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, name))
                n += 1
        self.counts["reclaimed"] += n
        if n:
            log.info("unlinked %d shared-memory blocks of processes that died", n)
        return n

    def close(self) -> None:
        """Unlink every block this process holds (a closing client's; a stopped worker's)."""
        with self._lock:
            for b in list(self._blocks.values()):
                self._unlink_locked(b)

    # ---- the receiver's side ---------------------------------------------------------

    @contextlib.contextmanager
    def payload(self, handle_frame: Frame, *, give_back: bool = False) -> Iterator[ShmPayload]:
        """The payload a handle names, copied out of its block (ShmPayload.data). Refused with
        HandleError (counted) for a forged, stale, oversized, another user's or out-of-bounds handle
        before any byte of the payload is read, and for a block that shrank or was reused while it
        was read. `give_back` (a result's reader): the block returns to its creator afterwards."""
        try:
            handle = shmhandle.check_claim(handle_frame, self.max_payload)
            fd = self._open(handle)
            try:
                data = self._copy(handle, fd)
            except BaseException:
                os.close(fd)
                raise
        except HandleError:
            self.counts["refused"] += 1
            raise
        try:
            yield ShmPayload(handle, data)
            self.counts["received"] += 1
        finally:
            if give_back:
                with contextlib.suppress(OSError):
                    os.pwrite(fd, handle.token, RELEASED_AT)
            os.close(fd)

    def _open(self, handle: Handle) -> int:
        """The block's file, opened and checked: a regular file of this user, holding the handle's
        header and at least its length (only the 64-byte header is read)."""
        if self.host is None:
            raise HandleError("off", "shared memory is off in this process")
        try:
            fd = os.open(os.path.join(self.dir, handle.name), OPEN_FLAGS)
        except FileNotFoundError:
            why = f"shared-memory block {handle.name} is gone (freed, or its creator died)"
            raise HandleError("stale", why) from None
        except OSError as exc:
            raise HandleError("open", f"shared-memory block {handle.name} cannot be opened: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise HandleError("name", f"shared-memory block {handle.name} is not a plain file")
            if st.st_uid != self._uid:
                raise HandleError(
                    "owner",
                    f"shared-memory block {handle.name} belongs to uid {st.st_uid}, not this process's "
                    f"uid {self._uid}: refused",
                )
            shmhandle.check_block(handle, os.pread(fd, HEADER_BYTES, 0), st.st_size)
            return fd
        except HandleError:
            os.close(fd)
            raise
        except OSError as exc:
            os.close(fd)
            raise HandleError("open", f"shared-memory block {handle.name} cannot be read: {exc}") from None

    @staticmethod
    def _copy(handle: Handle, fd: int) -> bytes:
        """The payload, copied with pread: a block cut short meanwhile reads short (refused), never
        faults; a block whose token changed meanwhile (its creator reused it) is refused as stale,
        so a torn payload is never passed on."""
        try:
            data = os.pread(fd, handle.length, HEADER_BYTES)
            token = os.pread(fd, TOKEN_BYTES, 8)
        except OSError as exc:
            raise HandleError("open", f"shared-memory block {handle.name} cannot be read: {exc}") from None
        if len(data) != handle.length:
            raise HandleError(
                "bounds",
                f"shared-memory block {handle.name} was cut to {HEADER_BYTES + len(data)} bytes while it was read: "
                "refused",
            )
        if token != handle.token:
            raise HandleError("stale", f"shared-memory block {handle.name} was reused while it was read")
        return data

    def read(self, handle_frame: Frame) -> bytes:
        """The payload a handle names, copied (the broker's fallback for a peer that cannot take a handle)."""
        with self.payload(handle_frame) as p:
            return p.data


@dataclass(frozen=True, slots=True)
class ShmPayload:
    """A peer's payload, copied out of its block and checked whole: `data` is the payload's bytes."""

    handle: Handle
    data: bytes
