"""The one rule for the message size limit (ZFAB_MAX_MESSAGE_BYTES), on every side.

A message (all its frames, as the decoders in core/protocol.py count them) is refused when it is over
the limit; a sender that has not built its frames yet counts its payload and ENVELOPE_BYTES for them.
It is the payload's own size that counts, whether it travels as bytes or by a shared-memory handle
(the broker may have to send a handle's body as bytes, to a worker on another host), so the client,
the broker and the worker say the same sentence about it:

- the client refuses it before sending (PayloadTooLargeError), against the smaller of its own limit
  and the one the broker says in its keepalive answers (`"max"`);
- the broker answers a client's request over its limit with 400 and that sentence;
- the worker answers a job over its limit the same way, and turns a result over it into a failed entry.

Sockets take a little more than the limit (`socket_cap`): a peer set with a larger limit than the
receiver's is answered and counted, not silently disconnected by libzmq's MAXMSGSIZE, which drops the
connection of a peer that sends a frame over it. Past the cap it still is: the cap bounds what one
message can cost the receiver. Pure: no sockets here.
"""

from __future__ import annotations

SETTING = "ZFAB_MAX_MESSAGE_BYTES"
ENVELOPE_BYTES = 512  # the frames around a payload (identities, uuid, status, trace), with room to spare
CAP_FACTOR = 2  # a socket takes messages up to this many times the limit before it drops the connection


def fits(message_bytes: int, limit: int) -> bool:
    """A message of this many bytes (all its frames) may be sent under `limit`."""
    return message_bytes <= limit


def too_large(what: str, size: int, limit: int) -> str:
    """The sentence every side says: what, its size, the limit and the setting that sets it."""
    return (
        f"{what} is {size} bytes with its frames, over the message limit ({SETTING} = {limit} bytes, "
        f"{limit / 2**20:.1f} MiB); "
        f"send less, or raise {SETTING} on every process"
    )


def socket_cap(limit: int) -> int:
    """MAXMSGSIZE of a socket whose messages are bounded by `limit`."""
    return CAP_FACTOR * limit


def advertised_limit(value: object) -> int | None:
    """The limit a broker says in its keepalive answers, when it is one (a peer's word: bounded below)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024:
        return value
    return None
