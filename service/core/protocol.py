"""NFP, the NorFab protocol, as zfab speaks it: frame constants, encoders and decoders.

Pure code: no sockets, no threads, nothing imported from outside `core`. `docs/protocol.md` is the
spec this module implements; every decoder raises `ProtocolError` with a short,
bounded `reason` (used as a metric label) and never anything else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from .errors import ProtocolError as ProtocolError  # re-exported: callers catch nfp.ProtocolError
from .jsoncodec import decode
from .jsoncodec import dumps as dumps  # re-exported: JSON as NFP carries it is nfp.dumps/nfp.loads everywhere
from .jsoncodec import loads as loads

# A frame. What a loop receives is bytes, except that a frame of 64 KiB or more (COPY_LIMIT in
# transport/wire.py) comes as a memoryview onto ZeroMQ's own buffer, which the view keeps alive:
# the broker forwards a large body or result without copying it; the worker and the client copy
# it where they keep it. Never hashed or used as a key (a writable view is not hashable).
Frame = bytes | memoryview

CLIENT: Final = b"NFPC01"
WORKER: Final = b"NFPW01"
BROKER: Final = b"NFPB01"

OPEN: Final = b"0x00"
READY: Final = b"0x01"
KEEPALIVE: Final = b"0x02"
DISCONNECT: Final = b"0x03"
POST: Final = b"0x04"
RESPONSE: Final = b"0x05"
GET: Final = b"0x06"
DELETE: Final = b"0x07"
EVENT: Final = b"0x08"
STREAM: Final = b"0x09"
PUT: Final = b"0x10"
MMI: Final = b"0x11"

COMMAND_NAMES: Final[dict[bytes, str]] = {
    OPEN: "OPEN",
    READY: "READY",
    KEEPALIVE: "KEEPALIVE",
    DISCONNECT: "DISCONNECT",
    POST: "POST",
    RESPONSE: "RESPONSE",
    GET: "GET",
    DELETE: "DELETE",
    EVENT: "EVENT",
    STREAM: "STREAM",
    PUT: "PUT",
    MMI: "MMI",
}

# Commands a client may send. KEEPALIVE is a zfab extension (the broker answers it
# so clients know the broker is alive); NorFab clients never send it.
CLIENT_COMMANDS: Final = frozenset({OPEN, DISCONNECT, POST, GET, DELETE, PUT, MMI, KEEPALIVE})
# Commands a worker may send that carry a job reply.
WORKER_REPLY_COMMANDS: Final = frozenset({RESPONSE, EVENT, STREAM, MMI})
WORKER_CONTROL_COMMANDS: Final = frozenset({READY, KEEPALIVE, DISCONNECT})
# Commands the broker routes to a worker with a client envelope.
BROKER_JOB_COMMANDS: Final = frozenset({POST, GET, DELETE, PUT, MMI})
BROKER_TO_CLIENT_COMMANDS: Final = frozenset({RESPONSE, EVENT, STREAM, MMI, KEEPALIVE})

MMI_SERVICE: Final = b"mmi.service.broker"

# Status codes (ASCII digits on the wire).
ST_OK: Final = b"200"
ST_WORKER_ACCEPTED: Final = b"201"
ST_DISPATCHED: Final = b"202"
ST_WAITING_INPUT: Final = b"102"
ST_PENDING: Final = b"300"
ST_QUEUED: Final = b"301"  # zfab: admitted by the broker, waiting in its queue
ST_BAD_REQUEST: Final = b"400"
ST_NOT_FOUND: Final = b"404"
ST_WORKER_LOST: Final = b"410"  # zfab: the worker running the job was purged
ST_ERROR: Final = b"500"
ST_BUSY: Final = b"503"  # zfab: no capacity; retry later
ST_CANCELLED: Final = b"499"  # zfab: the job was cancelled by DELETE
ST_EXPIRED: Final = b"408"  # zfab: the job's deadline passed at the broker (queued, or no answer in time)
KNOWN_STATUSES: Final = frozenset(
    {
        ST_OK,
        ST_WORKER_ACCEPTED,
        ST_DISPATCHED,
        ST_WAITING_INPUT,
        ST_PENDING,
        ST_QUEUED,
        ST_EXPIRED,
        ST_BAD_REQUEST,
        ST_NOT_FOUND,
        ST_WORKER_LOST,
        ST_ERROR,
        ST_BUSY,
        ST_CANCELLED,
    }
)
FINAL_STATUSES: Final = frozenset({ST_OK, ST_ERROR, ST_NOT_FOUND, ST_BAD_REQUEST, ST_CANCELLED})

DEFAULT_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
MAX_NAME_BYTES: Final = 256
MAX_UUID_BYTES: Final = 128
MAX_DETAIL: Final = 512  # characters of a DISCONNECT's detail a worker takes (it logs it)


@dataclass(slots=True)
class ClientRequest:
    """client → broker: [b"", NFPC01, CMD, service, target, uuid, body, (flags)]."""

    command: bytes
    service: bytes
    target: bytes
    uuid: bytes
    body: Frame  # forwarded as received
    flags: dict[str, Any]


@dataclass(slots=True)
class WorkerControl:
    """worker → broker: [b"", NFPW01, READY|KEEPALIVE|DISCONNECT, service, (stats)]."""

    command: bytes
    service: bytes
    stats: dict[str, Any] | None


@dataclass(slots=True)
class WorkerReply:
    """worker → broker: [b"", NFPW01, RESPONSE|EVENT|STREAM|MMI, client, b"", uuid, status, payload, (trace)]."""

    command: bytes
    client: bytes
    uuid: bytes
    status: bytes
    payload: Frame  # forwarded as received
    trace: Frame | None = None  # zfab: a final RESPONSE's hop trace (core/hoptrace.py)


@dataclass(slots=True)
class BrokerJob:
    """broker → worker, as the worker's DEALER sees it: [b"", NFPB01, CMD, client, b"", uuid, body, (meta)]."""

    command: bytes
    client: bytes
    uuid: bytes
    body: Frame  # parsed from the frame itself: a 10 MB body is not copied first
    meta: dict[str, Any] | None = None  # zfab: what the broker adds to a POST (deadline left, time queued)


@dataclass(slots=True)
class BrokerControl:
    """broker → worker: [b"", NFPB01, KEEPALIVE|DISCONNECT, service, (reason)]."""

    command: bytes
    service: bytes
    reason: str | None = None  # zfab: why a DISCONNECT (purged, replaced, name_taken, declaration_conflict)
    detail: str | None = None  # zfab: the broker's sentence for a refusal (name_taken), at most MAX_DETAIL
    retry_after: float | None = None  # zfab: seconds the broker suggests waiting before a new READY
    epoch: int | None = None  # zfab: the broker's term on a lease (KEEPALIVE; docs/failover.md)
    bundle: bool = False  # zfab: the broker reads bundles (KEEPALIVE; transport/bundle.py)


@dataclass(slots=True)
class BrokerReply:
    """broker → client, as the client's DEALER sees it: [b"", NFPB01, CMD, service, uuid, status, payload, (trace)]."""

    command: bytes
    service: bytes
    uuid: bytes
    status: bytes
    payload: Frame  # parsed from the frame itself; a file chunk is copied to bytes for its reader
    trace: Frame | None = None  # zfab: a final RESPONSE's hop trace, the worker's and the broker's


_FRAME_TYPES = (bytes, bytearray, memoryview)  # a tuple: `bytes | ...` would build a UnionType per frame
_FRAME_TYPE_SET = frozenset(_FRAME_TYPES)

# Each decoder runs once per message in every role, so a well-formed message passes one condition
# of C-level checks (types against a set, sizes by one sum, the command against the role's set);
# any other takes _check_head and the rest in the spec's order, for the first reason it fails.


def _check_sizes(frames: list[Frame], max_bytes: int) -> bool:
    """True, or it raises (so a fast path's condition can hold it)."""
    if not _FRAME_TYPE_SET.issuperset(map(type, frames)):  # a subclass of bytes is a frame too
        for f in frames:
            if not isinstance(f, _FRAME_TYPES):
                raise ProtocolError("type", f"frame of type {type(f).__name__}")
    total = sum(map(len, frames))
    if total > max_bytes:
        raise ProtocolError("oversize", f"{total} bytes > limit {max_bytes}")
    return True


def _check_head(frames: list[Frame], header: bytes, min_len: int, max_len: int, max_bytes: int) -> bytes:
    n = len(frames)
    if n < 3:
        raise ProtocolError("frame_count", f"{n} frames, need at least 3")
    _check_sizes(frames, max_bytes)
    if frames[0] != b"":
        raise ProtocolError("delimiter", "first frame must be empty")
    if frames[1] != header:
        raise ProtocolError("header", f"header {bytes(frames[1][:16])!r}, expected {header!r}")
    command = bytes(frames[2])  # bytearray and writable memoryview frames are not hashable
    if command not in COMMAND_NAMES:
        raise ProtocolError("command", f"unknown command {command[:16]!r}")
    if not min_len <= n <= max_len:
        raise ProtocolError("frame_count", f"{COMMAND_NAMES[command]} with {n} frames, need {min_len}..{max_len}")
    return command


def _check_name(value: Frame, what: str, limit: int = MAX_NAME_BYTES) -> None:
    if len(value) > limit:
        raise ProtocolError("field", f"{what} longer than {limit} bytes")


def _json_object(raw: Frame, what: str) -> dict[str, Any]:
    try:
        obj = decode(raw)  # not loads(): one call less, the same sentences
    except (msgspec.DecodeError, TypeError, UnicodeDecodeError) as exc:
        raise ProtocolError("json", f"{what} is not JSON: invalid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("json", f"{what} is not JSON: invalid JSON: nested too deep") from None
    if type(obj) is not dict:
        raise ProtocolError("json", f"{what} must be a JSON object, got {type(obj).__name__}")
    return obj


def decode_client(frames: list[Frame], max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> ClientRequest:
    """Decode what a client sent, without the ROUTER identity frame."""
    n = len(frames)
    command: Any = frames[2] if n >= 3 else b""  # bytes once the fast path's checks hold
    if not (
        (n == 7 or n == 8)
        and _check_sizes(frames, max_bytes)
        and frames[0] == b""
        and frames[1] == CLIENT
        and type(command) is bytes
        and command in CLIENT_COMMANDS
    ):
        command = _check_head(frames, CLIENT, 7, 8, max_bytes)
        if command not in CLIENT_COMMANDS:
            raise ProtocolError("command", f"{COMMAND_NAMES[command]} is not a client command")
    service, uuid = frames[3], frames[5]
    _check_name(service, "service")
    _check_name(uuid, "uuid", MAX_UUID_BYTES)
    flags = _json_object(frames[7], "flags frame") if n == 8 else {}
    return ClientRequest(command, bytes(service), bytes(frames[4]), bytes(uuid), frames[6], flags)


def decode_worker(frames: list[Frame], max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> WorkerControl | WorkerReply:
    """Decode what a worker sent, without the ROUTER identity frame."""
    n = len(frames)
    command: Any = frames[2] if n >= 3 else b""  # bytes once the fast path's checks hold
    if not (  # a job's reply (RESPONSE, EVENT, STREAM, MMI); only a RESPONSE carries a trace
        (n == 8 or (n == 9 and command == RESPONSE))
        and _check_sizes(frames, max_bytes)
        and frames[0] == b""
        and frames[1] == WORKER
        and type(command) is bytes
        and command in WORKER_REPLY_COMMANDS
    ):
        command = _check_head(frames, WORKER, 4, 9, max_bytes)
        if command in WORKER_CONTROL_COMMANDS:
            if n > 5:
                raise ProtocolError("frame_count", f"{COMMAND_NAMES[command]} with {n} frames")
            _check_name(frames[3], "service")
            stats = _json_object(frames[4], "keepalive stats") if n == 5 else None
            return WorkerControl(command, bytes(frames[3]), stats)
        if command not in WORKER_REPLY_COMMANDS:
            raise ProtocolError("command", f"{COMMAND_NAMES[command]} is not a worker command")
        if n != 8 and not (n == 9 and command == RESPONSE):
            raise ProtocolError("frame_count", f"{COMMAND_NAMES[command]} with {n} frames, need 8")
    if frames[4] != b"":
        raise ProtocolError("delimiter", "frame 4 must be empty")
    _check_name(frames[5], "uuid", MAX_UUID_BYTES)
    trace = frames[8] if n == 9 else None
    return WorkerReply(command, bytes(frames[3]), bytes(frames[5]), bytes(frames[6]), frames[7], trace)


def decode_broker_to_worker(frames: list[Frame], max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> BrokerJob | BrokerControl:
    """Decode what the broker sent to a worker (the worker's DEALER strips nothing)."""
    n = len(frames)
    command: Any = frames[2] if n >= 3 else b""  # bytes once the fast path's checks hold
    if not (  # a job: POST, GET, DELETE, PUT or MMI; a POST may carry the broker's meta frame
        (n == 7 or n == 8)
        and _check_sizes(frames, max_bytes)
        and frames[0] == b""
        and frames[1] == BROKER
        and type(command) is bytes
        and command in BROKER_JOB_COMMANDS
    ):
        command = _check_head(frames, BROKER, 4, 8, max_bytes)
        if command in (KEEPALIVE, DISCONNECT):
            if n > 5:
                raise ProtocolError("frame_count", f"{COMMAND_NAMES[command]} with {n} frames, need 4 or 5")
            if n < 5:
                return BrokerControl(command, bytes(frames[3]))
            why = _json_object(frames[4], "disconnect reason")
            reason, detail, after = why.get("reason"), why.get("detail"), why.get("retry_after")
            epoch = why.get("epoch")  # a KEEPALIVE's: the broker's term on a lease (docs/failover.md)
            return BrokerControl(
                command,
                bytes(frames[3]),
                reason if isinstance(reason, str) else None,
                detail[:MAX_DETAIL] if isinstance(detail, str) else None,
                float(after) if isinstance(after, int | float) and not isinstance(after, bool) and after >= 0 else None,
                epoch if type(epoch) is int and epoch >= 0 else None,
                why.get("bundle") == 1,
            )
        if command not in BROKER_JOB_COMMANDS:
            raise ProtocolError("command", f"{COMMAND_NAMES[command]} is not sent by a broker to a worker")
        if n < 7:
            raise ProtocolError("frame_count", f"{COMMAND_NAMES[command]} with {n} frames, need 7 or 8")
    if frames[4] != b"":
        raise ProtocolError("delimiter", "frame 4 must be empty")
    meta = _json_object(frames[7], "job meta frame") if n == 8 else None
    return BrokerJob(command, bytes(frames[3]), bytes(frames[5]), frames[6], meta)


def decode_broker_to_client(frames: list[Frame], max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> BrokerReply:
    """Decode what the broker sent to a client."""
    n = len(frames)
    command: Any = frames[2] if n >= 3 else b""  # bytes once the fast path's checks hold
    status: Any = frames[5] if n >= 6 else b""
    if not (
        (n == 7 or (n == 8 and command == RESPONSE))
        and _check_sizes(frames, max_bytes)
        and frames[0] == b""
        and frames[1] == BROKER
        and type(command) is bytes
        and type(status) is bytes
        and command in BROKER_TO_CLIENT_COMMANDS
        and (status in KNOWN_STATUSES or command == STREAM)
    ):
        command = _check_head(frames, BROKER, 7, 8, max_bytes)
        if command not in BROKER_TO_CLIENT_COMMANDS:
            raise ProtocolError("command", f"{COMMAND_NAMES[command]} is not sent by a broker to a client")
        if n == 8 and command != RESPONSE:
            raise ProtocolError("frame_count", f"{COMMAND_NAMES[command]} with 8 frames, need 7")
        status = bytes(frames[5])
        if command != STREAM and status not in KNOWN_STATUSES:
            raise ProtocolError("status", f"unknown status {status[:8]!r}")
    trace = frames[7] if n == 8 else None
    return BrokerReply(command, bytes(frames[3]), bytes(frames[4]), status, frames[6], trace)


# --- encoders: each returns the frames a DEALER sends, or (for the broker) the
# frames a ROUTER sends with the peer identity first.


def client_request(
    command: bytes, service: bytes, target: bytes, uuid: bytes, body: bytes, flags: bytes = b""
) -> list[Frame]:
    frames: list[Frame] = [b"", CLIENT, command, service, target, uuid, body]
    if flags:
        frames.append(flags)
    return frames


def worker_control(command: bytes, service: bytes, stats: bytes = b"") -> list[Frame]:
    frames: list[Frame] = [b"", WORKER, command, service]
    if stats:
        frames.append(stats)
    return frames


def worker_reply(command: bytes, client: bytes, uuid: bytes, status: bytes, payload: bytes) -> list[Frame]:
    return [b"", WORKER, command, client, b"", uuid, status, payload]


def broker_job(worker: bytes, command: bytes, client: bytes, uuid: bytes, body: Frame) -> list[Frame]:
    return [worker, b"", BROKER, command, client, b"", uuid, body]


def keepalive_facts(epoch: int | None) -> bytes:
    """The 5th frame of a broker's KEEPALIVE to a zfab worker: it reads bundles (Extensions 13) and, under
    a lease, its term (Extensions 12). A NorFab worker's keepalives stay NFP's four frames."""
    facts: dict[str, int] = {"bundle": 1}
    if epoch is not None:
        facts["epoch"] = epoch
    return dumps(facts)


def broker_control(worker: bytes, command: bytes, service: bytes) -> list[Frame]:
    return [worker, b"", BROKER, command, service]


def broker_reply(
    client: bytes, command: bytes, service: bytes, uuid: bytes, status: bytes, payload: Frame
) -> list[Frame]:
    return [client, b"", BROKER, command, service, uuid, status, payload]


_KEYWORDS: Final = {b"any": "any", b"all": "all"}


def parse_target(target: bytes) -> str | list[str]:
    """`any`, `all`, one worker name, or a JSON list of names."""
    word = _KEYWORDS.get(target)  # nearly every POST: no decode, the same str each time
    if word is not None:
        return word
    if target.startswith(b"["):
        try:
            names = json.loads(target)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ProtocolError("target", "target list is not JSON") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ProtocolError("target", "target list must be a JSON list of names")
        return names
    try:
        return target.decode()
    except UnicodeDecodeError:
        raise ProtocolError("target", "target is not UTF-8") from None
