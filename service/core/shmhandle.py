"""Same-host shared memory: the handle a frame carries in place of a large payload, and the header
of the block it names (docs/protocol.md, "Same-host shared memory (zfab)").

Pure: what a handle and a block header look like and when they are acceptable. Creating, mapping
and unlinking blocks is transport/shm.py's. A handle is refused here (HandleError, with a reason
that is a bounded metric label and a sentence for the log and the job's error) before any file is
opened, so a forged one can name nothing but a zfab block in the shared-memory directory, and a
block is read only when its header carries the handle's token and the length fits inside it.
"""

from __future__ import annotations

import hmac
import re
import struct
from dataclasses import dataclass
from typing import Final

from . import sizes
from .protocol import Frame, dumps, loads

MARK: Final = b"\x00zfab-shm\x00"
"""What a handle frame starts with. JSON never starts with NUL, so no body or result is mistaken
for a handle, and the test costs one slice of a small frame."""

MAX_HANDLE_BYTES: Final = 512
"""A handle frame is at most this long: a longer frame is a payload, whatever it starts with."""

MAGIC: Final = b"ZFABSHM1"
HEADER: Final = struct.Struct("<8s16sQ")  # magic, token, payload length
HEADER_BYTES: Final = 64
"""The payload starts this far into the block (the header, padded): a reader parses from there."""
RELEASED_AT: Final = HEADER.size
"""Where a result's reader writes the token it read, to give the block back to its creator (who
writes a new token for the next payload, so an old handle to the block no longer matches)."""

TOKEN_BYTES: Final = 16

# zfab-<pid namespace, 8 hex>-<pid>-<start time of the pid, clock ticks>-<16 random hex>. The
# namespace and start time let a reclaimer tell a dead creator from a live one (and a reused pid).
NAME: Final = re.compile(r"zfab-([0-9a-f]{8})-([1-9][0-9]{0,9})-([0-9]{1,20})-[0-9a-f]{16}")
HOST_LENGTH: Final = 32
"""A host id is 32 hex digits: equal in two processes only where their shared-memory directory is one."""

MAX_LENGTH: Final = 1 << 40
MAX_ATTEMPT: Final = 10_000  # the highest attempt a job may reach (payloads.MAX_ATTEMPT is this)


class HandleError(Exception):
    """A handle or block that is refused: `reason` is a short label, the message says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Handle:
    """A payload of `length` bytes in block `name`, behind a header carrying `token`."""

    name: str
    length: int
    token: bytes
    worker: str | None = None  # a result's worker: the client asks it again (GET) if the block is unreadable
    attempt: int = 1  # a request's attempt (a retried job sends its block again: the body says attempt 1)


_MARK_LEN: Final = len(MARK)


def is_handle(frame: Frame) -> bool:
    """True for a frame that claims to be a handle (decode_handle says whether it is a good one).
    On every job's body and result: a JSON frame fails at its first byte, with nothing allocated."""
    return _MARK_LEN < len(frame) <= MAX_HANDLE_BYTES and frame[0] == 0 and frame[:_MARK_LEN] == MARK


def encode_handle(handle: Handle) -> bytes:
    fields: dict[str, object] = {"shm": handle.name, "len": handle.length, "tok": handle.token.hex()}
    if handle.worker is not None:
        fields["worker"] = handle.worker
    if handle.attempt > 1:
        fields["attempt"] = handle.attempt
    return MARK + dumps(fields)


def decode_handle(frame: Frame) -> Handle:
    """The handle a frame carries; HandleError for anything that is not a well-formed handle."""
    if not is_handle(frame):
        raise HandleError("handle", "not a shared-memory handle")
    try:
        fields = loads(frame[len(MARK) :])
    except (ValueError, RecursionError):
        raise HandleError("handle", "shared-memory handle is not JSON") from None
    if not isinstance(fields, dict):
        raise HandleError("handle", "shared-memory handle is not a JSON object")
    name, length, tok, worker = fields.get("shm"), fields.get("len"), fields.get("tok"), fields.get("worker")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        # Only our own pattern: no path separator, no "..", no other file in the directory.
        raise HandleError("name", f"shared-memory handle names {str(name)[:80]!r}, which is not a zfab block")
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= MAX_LENGTH:
        raise HandleError("length", "shared-memory handle has no valid length")
    if not isinstance(tok, str) or len(tok) != 2 * TOKEN_BYTES:
        raise HandleError("token", "shared-memory handle has no valid token")
    try:
        token = bytes.fromhex(tok)
    except ValueError:
        raise HandleError("token", "shared-memory handle has no valid token") from None
    if worker is not None and not isinstance(worker, str):
        raise HandleError("handle", "shared-memory handle names no valid worker")
    attempt = fields.get("attempt", 1)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= MAX_ATTEMPT:
        raise HandleError("handle", "shared-memory handle has no valid attempt")
    return Handle(name, length, token, worker, attempt)


def with_attempt(frame: Frame, attempt: int) -> bytes:
    """The same request handle, for attempt `attempt` of its job (the block is not rewritten)."""
    h = decode_handle(frame)
    return encode_handle(Handle(h.name, h.length, h.token, h.worker, attempt))


def check_claim(frame: Frame, limit: int) -> Handle:
    """The handle a frame carries, refused (HandleError) when malformed or when it claims more than
    `limit` bytes (ZFAB_MAX_MESSAGE_BYTES: what the payload could weigh as bytes on the wire), so a
    150-byte handle cannot make its reader allocate or copy more than a message would."""
    handle = decode_handle(frame)
    if not sizes.fits(handle.length, limit):  # the payload's own size, as if it came as bytes
        what = f"the payload of shared-memory handle {handle.name} (refused, nothing read)"
        raise HandleError("length", sizes.too_large(what, handle.length, limit))
    return handle


def header(token: bytes, length: int) -> bytes:
    """The first HEADER_BYTES of a block."""
    return HEADER.pack(MAGIC, token, length).ljust(HEADER_BYTES, b"\x00")


def check_block(handle: Handle, head: bytes, block_size: int) -> None:
    """Raise HandleError unless the block (its first bytes `head`, its size) is the one the handle
    names: our magic, the handle's token, its length, and the payload inside the block."""
    if HEADER_BYTES + handle.length > block_size:
        raise HandleError(
            "bounds",
            f"shared-memory block {handle.name} holds {max(0, block_size - HEADER_BYTES)} bytes, "
            f"the handle claims {handle.length}: refused, nothing read past the block",
        )
    if len(head) < HEADER.size:
        raise HandleError("header", f"shared-memory block {handle.name} has no header")
    magic, token, length = HEADER.unpack_from(head)
    if magic != MAGIC:
        raise HandleError("header", f"shared-memory block {handle.name} is not a zfab block")
    if not hmac.compare_digest(token, handle.token):
        raise HandleError("token", f"shared-memory handle for {handle.name} has the wrong token: refused")
    if length != handle.length:
        raise HandleError("length", f"shared-memory block {handle.name} holds {length} bytes, not {handle.length}")


def check_host(value: object) -> str | None:
    """A host id as a peer announced it, or None when it is absent or malformed. Only compared
    with other host ids and passed on as JSON, so its shape is all that is checked (per job: cheap)."""
    return value if isinstance(value, str) and len(value) == HOST_LENGTH else None
