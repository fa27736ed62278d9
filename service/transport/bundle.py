"""Several messages to one peer as one ZeroMQ message (docs/protocol.md, Extensions 13).

Under a pipelined load the broker, a client and a worker each handle thousands of small messages a
second, and a message costs far more than its bytes: every frame is a libzmq message the receiver's
Python turns into an object (about 1.2 us a frame here), every message a pass of the I/O threads
and the owner's loop. A *bundle* carries what one owner sends one peer within one step of its loop
(a receive batch, a drain, a timer pass) as four frames:

    routing prefix (a ROUTER's: the peer's identity) + [b"", MARK, lengths, data]

`lengths` is little-endian uint32: for each message its frame count, then each frame's length;
`data` is every frame's bytes, concatenated. The receiving owner unpacks it into the messages it
would have received one by one (the routing prefix put back in front of each) and hands each to its
role, which checks it as any other; nothing above the transport sees a bundle.

Only what is small goes in one (no frame of LARGE bytes or more, at most BUNDLE_BYTES in all), so a
bundle is always far under every message limit and a large body still goes zero-copy on its own. A
bundle goes only to a peer known to read them: a broker, to a peer that sent it one; a client or a
worker, to a broker whose keepalive said `"bundle": 1`. NorFab peers never send or get one.
"""

from __future__ import annotations

import sys
from array import array

from .base import Frame, Frames

MARK = b"ZFAB-BUNDLE-1"
BUNDLE_BYTES = 32_768  # what one bundle carries at most (under COPY_LIMIT: it arrives as bytes)
LARGE = 4_096  # a message with a frame this large goes on its own
MAX_MESSAGES = 256  # what one bundle carries at most, by count; a receiver takes up to RECEIVE_MAX
RECEIVE_MAX = 1_024
MAX_FRAMES = 64  # frames of one message in a bundle (NFP's longest has 10)
PEERS = 16_384  # a broker's bound on the peers it remembers as taking bundles (an evicted one gets single messages)
_SWAP = sys.byteorder != "little"
assert array("I").itemsize == 4


class BundleError(ValueError):
    """A bundle that does not add up: dropped whole and counted, its sender's problem."""


def is_bundle(frames: Frames) -> bool:
    """A bundle as received: a DEALER's four frames, or a ROUTER's five (the identity in front)."""
    n = len(frames)
    return (n == 4 or n == 5) and frames[-3] == MARK


class Pending:
    """What one step of the owner has for one peer so far."""

    __slots__ = ("count", "first", "lens", "parts", "size")

    def __init__(self) -> None:
        self.first: Frames | None = None  # a lone message goes as it is
        self.lens: list[int] = []
        self.parts: list[Frame] = []
        self.count = 0
        self.size = 0

    def add(self, frames: Frames, skip: int) -> bool:
        """Take a message (its first `skip` frames are the routing prefix); False, taking nothing,
        when it has a large frame."""
        lens = self.lens
        mark = len(lens)
        lens.append(len(frames) - skip)
        size = 0
        for i in range(skip, len(frames)):
            n = len(frames[i])
            if n >= LARGE:
                del lens[mark:]
                return False
            lens.append(n)
            size += n
        self.parts.extend(frames[skip:] if skip else frames)
        if self.first is None:
            self.first = frames
        self.count += 1
        self.size += size
        return True

    def full(self) -> bool:
        return self.count >= MAX_MESSAGES or self.size >= BUNDLE_BYTES

    def message(self, prefix: Frames) -> Frames:
        """The one message to send: the lone message itself, or the bundle."""
        if self.count == 1 and self.first is not None:
            return self.first
        lens = array("I", self.lens)
        if _SWAP:
            lens.byteswap()
        return [*prefix, b"", MARK, lens.tobytes(), b"".join(self.parts)]


def unpack(frames: Frames) -> list[Frames]:
    """The messages of a received bundle (see is_bundle), each with the routing prefix in front."""
    prefix = frames[:-4]
    raw, data = frames[-2], frames[-1]
    if frames[-4] != b"":
        raise BundleError("no empty delimiter before the bundle mark")
    if len(raw) % 4:
        raise BundleError(f"lengths frame of {len(raw)} bytes, not a multiple of 4")
    if not isinstance(data, bytes):
        data = bytes(data)  # a large bundle (no zfab peer sends one) arrives as a view
    lens = array("I")
    lens.frombytes(raw)
    if _SWAP:
        lens.byteswap()
    out: list[Frames] = []
    i, n, pos = 0, len(lens), 0
    while i < n:
        k = lens[i]
        i += 1
        if not 0 < k <= MAX_FRAMES or i + k > n:
            raise BundleError(f"a message of {k} frames at length {i - 1} of {n}")
        msg = prefix.copy()
        for j in range(i, i + k):
            end = pos + lens[j]
            msg.append(data[pos:end])
            pos = end
        i += k
        out.append(msg)
        if len(out) > RECEIVE_MAX:
            raise BundleError(f"more than {RECEIVE_MAX} messages")
    if pos != len(data):
        raise BundleError(f"lengths add up to {pos} bytes, the data has {len(data)}")
    if not out:
        raise BundleError("an empty bundle")
    return out
