"""Same-host shared memory: a process's blocks (made, reused, counted, freed) and its view of a peer's.

A sender whose payload is over ZFAB_SHM_THRESHOLD copies it into a block of its own in
ZFAB_SHM_DIR (a tmpfs, /dev/shm) and sends a handle (core/shmhandle.py) in its place; the receiver
maps the block read-only and parses straight from the mapping. Every step that fails (the cap, a
full tmpfs, a block that cannot be opened) leaves the payload to the sockets, counted.

Blocks are reused, and stay mapped: taking fresh tmpfs pages for every 10 MB payload (and giving
them back) costs more than the copy into them, pwrite into tmpfs costs 5x a memcpy into a mapping,
and mapping a block afresh costs a page fault per 4 KiB. So a creator keeps its blocks mapped (all
their pages allocated up front, so a full tmpfs is an error at the start, never a SIGBUS), a reader
keeps its last MAP_CACHE mappings of peers' blocks, a block whose payload was read goes back to its
creator's pool, and the next payload gets a new token, which an old handle no longer matches. Who
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
from collections import OrderedDict
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
MAP_CACHE = 8  # mappings of peers' blocks a reader keeps (a block is reused, so is its mapping)
MAP_CACHE_BYTES = 256 << 20
MAX_BLOCKS = 256  # blocks held at once (each keeps a file descriptor open); past it, the sockets
GRAIN = 1 << 20  # block sizes are rounded up to this, so a block fits the next payload of about its size
OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC  # read-write: a result's reader gives it back
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
        self._ns = _pid_namespace()
        self._pid = os.getpid()
        self._prefix = f"zfab-{self._ns}-{self._pid}-{_start_time(self._pid) or 0}-"
        self._lock = threading.Lock()
        self._blocks: dict[str, _Block] = {}
        self.bytes = 0  # of every block held, busy or free (what the cap bounds)
        self.counts: dict[str, int] = {
            "sent": 0,  # payloads that left as a handle
            "received": 0,  # handles mapped and read
            "fallbacks": 0,  # payloads that went through the sockets: cap reached, tmpfs full, unreadable
            "refused": 0,  # handles refused: forged, stale, wrong token, out of bounds
            "expired": 0,  # result blocks nobody gave back in time, unlinked
            "reclaimed": 0,  # blocks of dead processes unlinked
        }
        self._maps: OrderedDict[str, tuple[mmap.mmap, int, int]] = OrderedDict()  # name -> (map, inode, size)
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
            "shm_peer_blocks_mapped": len(self._maps),  # peers' blocks this process keeps mapped
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
        # refuses what it read (ShmMapping.verify) rather than pass on a torn payload.
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
            given = b.mm[RELEASED_AT : RELEASED_AT + TOKEN_BYTES]
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
        if not self._blocks and not self._maps and now - self._reclaimed_at < RECLAIM_SECONDS:
            return
        if not force and now - self._swept < SWEEP_SECONDS:
            return
        self._swept = now
        self._take_back()
        self._forget_gone_maps()
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
        """Unlink every block this process holds (a closing client's; a stopped worker's) and let
        go of its mappings of peers' blocks."""
        with self._lock:
            for b in list(self._blocks.values()):
                self._unlink_locked(b)
            maps, self._maps = list(self._maps.values()), OrderedDict()
        for mm, _, _ in maps:
            with contextlib.suppress(BufferError):
                mm.close()

    # ---- the receiver's side ---------------------------------------------------------

    @contextlib.contextmanager
    def mapped(self, handle_frame: Frame, *, give_back: bool = False, keep: bool = True) -> Iterator[ShmMapping]:
        """Map the block a handle names, read-only, for the payload's bytes (ShmMapping.view).
        Refused with HandleError (counted) for a forged, stale or out-of-bounds handle, before any
        byte of the payload is read; the view covers the payload the handle names and nothing
        else, inside the block. `give_back` (a result's reader): the block returns to its creator
        afterwards. `keep`: the mapping is kept for the block's next payload (MAP_CACHE)."""
        try:
            handle = shmhandle.decode_handle(handle_frame)
            fd, mm, kept = self._open(handle, keep)
        except HandleError:
            self.counts["refused"] += 1
            raise
        m = ShmMapping(handle, fd, memoryview(mm)[HEADER_BYTES : HEADER_BYTES + handle.length])
        try:
            yield m
            self.counts["received"] += 1
        finally:
            m.view.release()
            if not kept:
                with contextlib.suppress(BufferError):  # a caller that kept a slice: the GC unmaps it
                    mm.close()
            if give_back:
                with contextlib.suppress(OSError):
                    os.pwrite(fd, handle.token, RELEASED_AT)
            os.close(fd)

    def _mapping(self, name: str, fd: int, st: os.stat_result, keep: bool) -> tuple[mmap.mmap, bool]:
        """This block's mapping: the one kept from its last payload when it is the same file, else a
        new one of the whole block (kept, the oldest let go past MAP_CACHE)."""
        with self._lock:
            known = self._maps.get(name)
            if known is not None and known[1] == st.st_ino and known[2] == st.st_size:
                self._maps.move_to_end(name)
                return known[0], True
        mm = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)
        if not keep:
            return mm, False
        with self._lock:
            old = self._maps.pop(name, None)
            self._maps[name] = (mm, st.st_ino, st.st_size)
            drop = [old[0]] if old is not None else []
            while len(self._maps) > MAP_CACHE or sum(v[2] for v in self._maps.values()) > MAP_CACHE_BYTES:
                drop.append(self._maps.popitem(last=False)[1][0])
        for d in drop:
            with contextlib.suppress(BufferError):
                d.close()
        return mm, True

    def _forget_gone_maps(self) -> None:
        """Let go of mappings of blocks their creator unlinked (they would keep its pages)."""
        with self._lock:
            names = list(self._maps)
        for name in names:
            try:
                ino = os.stat(os.path.join(self.dir, name)).st_ino
            except OSError:
                ino = -1
            with self._lock:
                known = self._maps.get(name)
                if known is None or known[1] == ino:
                    continue
                del self._maps[name]
            with contextlib.suppress(BufferError):
                known[0].close()

    def _open(self, handle: Handle, keep: bool) -> tuple[int, mmap.mmap, bool]:
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
            shmhandle.check_block(handle, os.pread(fd, HEADER_BYTES, 0), st.st_size)
            mm, kept = self._mapping(handle.name, fd, st, keep)
            return fd, mm, kept
        except HandleError:
            os.close(fd)
            raise
        except (OSError, ValueError) as exc:
            os.close(fd)
            raise HandleError("open", f"shared-memory block {handle.name} cannot be read: {exc}") from None

    def read(self, handle_frame: Frame) -> bytes:
        """The payload a handle names, copied (the broker's fallback for a peer on another host)."""
        with self.mapped(handle_frame, keep=False) as m:
            data = bytes(m.view)
            m.verify()
            return data


class ShmMapping:
    """A peer's block, mapped: `view` is the payload; verify() after parsing it."""

    __slots__ = ("_fd", "handle", "view")

    def __init__(self, handle: Handle, fd: int, view: memoryview) -> None:
        self.handle = handle
        self.view = view
        self._fd = fd

    def verify(self) -> None:
        """HandleError unless the block still holds the handle's payload: its creator reuses a block
        it took back (a job that ended while its worker was still reading), with a new token."""
        if os.pread(self._fd, TOKEN_BYTES, 8) != self.handle.token:
            raise HandleError("stale", f"shared-memory block {self.handle.name} was reused while it was read")
