"""Bundles (transport/bundle.py): several messages to one peer as one ZeroMQ message. Packed and unpacked
exactly, a malformed one refused whole; between real owner loops, what one step sends a peer that reads
them goes as one, arrives as the messages it carried (in order, with the sender's identity in front on a
ROUTER), and a broker answers in bundles only a peer that sent it one."""

from __future__ import annotations

import struct
import threading
from typing import Any

import pytest
import zmq
from conftest import wait_for

from zfab.core.logbudget import LogBudget
from zfab.core.lru import BoundedLRU
from zfab.transport import bundle
from zfab.transport.base import LoopStats
from zfab.transport.loop import OwnerLoop
from zfab.transport.sending import WireSender
from zfab.transport.wire import Frames


def packed(messages: list[Frames], prefix: Frames) -> Frames:
    p = bundle.Pending()
    for m in messages:
        assert p.add([*prefix, *m], len(prefix))
    return p.message(prefix)


def test_a_bundle_unpacks_into_the_messages_it_carried_with_the_routing_prefix_in_front() -> None:
    messages: list[Frames] = [[b"", b"NFPC01", b"0x04", b"demo", b"any", b"u1", b"{}"], [b"", b"x"], [b"", b"", b"yz"]]
    for prefix in ([], [b"peer-1"]):
        frames = packed(messages, prefix)
        assert len(frames) == 4 + len(prefix) and bundle.is_bundle(frames)
        assert bundle.unpack(frames) == [[*prefix, *m] for m in messages]


def test_a_lone_message_goes_as_itself_and_a_large_frame_is_never_bundled() -> None:
    p = bundle.Pending()
    lone: Frames = [b"", b"a"]
    assert p.add(lone, 0) and p.message([]) is lone
    assert not p.add([b"", b"x" * bundle.LARGE], 0)  # refused whole: it goes on its own
    assert p.count == 1 and p.lens == [2, 0, 1]

    def filled(frame_bytes: int) -> int:
        p = bundle.Pending()
        while not p.full():
            assert p.add([b"", b"y" * frame_bytes], 0)
        return p.count

    assert filled(100) == bundle.MAX_MESSAGES  # small messages: the count bound first (256 x 100 B < 32 KiB)
    assert filled(2000) == 17  # larger ones: the byte bound (16 x 2,000 B < 32 KiB <= 17 x 2,000 B)


class _Refusing:
    """A wire whose peer takes nothing at first (its high-water mark reached), then has room again."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.sent: list[Frames] = []

    def send(self, frames: Frames) -> None:
        if self.refusals:
            self.refusals -= 1
            raise zmq.Again()
        self.sent.append(frames)


def test_a_large_message_waits_behind_a_bundle_its_dealer_peer_could_not_take() -> None:
    s = WireSender()
    wire = _Refusing(refusals=1)
    s.name, s.stats, s._wire, s._drop_log = "t", LoopStats(), wire, LogBudget(burst=1, per_second=1)  # type: ignore[assignment]
    s._stalled, s._corking, s._pending, s._skip = None, True, {}, 0
    s._bundled = BoundedLRU(max_count=1)
    s._bundled.put(b"", True)
    assert s._send([b"", b"a"]) and s._send([b"", b"b"])  # gathered for one bundle
    # A large message flushes them first; the bundle is refused, and the large one must not overtake it
    # even though the peer would take it now.
    assert s._send([b"", b"x" * bundle.LARGE]) is False
    assert s._stalled is not None and bundle.unpack(s._stalled) == [[b"", b"a"], [b"", b"b"]]  # type: ignore[arg-type]
    assert wire.sent == [] and s.stats.send_dropped == 0


def _lengths(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)  # little-endian, as the wire is


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        ([b"x", bundle.MARK, _lengths([1, 1]), b"a"], "delimiter"),
        ([b"", bundle.MARK, b"\x01\x00\x00", b"a"], "multiple of 4"),
        ([b"", bundle.MARK, _lengths([2, 1]), b"a"], "frames"),
        ([b"", bundle.MARK, _lengths([0]), b""], "frames"),
        ([b"", bundle.MARK, _lengths([bundle.MAX_FRAMES + 1] + [0] * (bundle.MAX_FRAMES + 1)), b""], "frames"),
        ([b"", bundle.MARK, _lengths([1, 2]), b"a"], "add up"),
        ([b"", bundle.MARK, _lengths([1, 1]), b"abc"], "add up"),
        ([b"", bundle.MARK, b"", b""], "empty"),
        ([b"", bundle.MARK, _lengths([1, 0] * (bundle.RECEIVE_MAX + 1)), b""], "more than"),
    ],
)
def test_a_malformed_bundle_is_refused_whole_with_why(frames: Frames, why: str) -> None:
    with pytest.raises(bundle.BundleError, match=why):
        bundle.unpack(frames)


class Role:
    """A role on a real socket that records what it receives; a ROUTER one answers each message in the
    same receive step (as a broker does)."""

    loop: OwnerLoop  # the owner of its socket, set once made

    def __init__(self, kind: int, endpoint: str) -> None:
        self.kind, self.endpoint = kind, endpoint
        self.received: list[Frames] = []
        self.lock = threading.Lock()
        self.bound = ""

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        s = ctx.socket(self.kind)
        s.setsockopt(zmq.LINGER, 0)
        if self.kind == zmq.ROUTER:
            s.setsockopt(zmq.ROUTER_MANDATORY, 1)
            port = s.bind_to_random_port("tcp://127.0.0.1")
            self.bound = f"tcp://127.0.0.1:{port}"
        else:
            s.connect(self.endpoint)
        return s

    def on_connected(self) -> None:
        pass

    def on_frames(self, frames: Frames) -> None:
        with self.lock:
            self.received.append(frames)
        if self.kind == zmq.ROUTER:
            self.loop.send([frames[0], b"", b"re", frames[-1]])

    def on_batch_end(self) -> None:
        pass

    def on_timer(self, now: float) -> float | None:
        return None

    def on_closing(self) -> None:
        pass

    def got(self, n: int) -> bool:
        with self.lock:
            return len(self.received) >= n


@pytest.fixture
def pair() -> Any:
    server = Role(zmq.ROUTER, "")
    server.loop = OwnerLoop(server, name="server")
    server.loop.start()
    client = Role(zmq.DEALER, server.bound)
    client.loop = OwnerLoop(client, name="client")
    client.loop.start()
    yield server, client
    client.loop.stop()
    server.loop.stop()


def _send_in_one_step(loop: OwnerLoop, n: int) -> None:
    """n messages sent by the owner within one step (a queued call runs inside a drain)."""
    loop.call(lambda: [loop.send([b"", b"m", str(i).encode()]) for i in range(n)])


def test_what_one_step_sends_a_peer_that_reads_bundles_arrives_as_its_messages_and_is_answered_so(pair: Any) -> None:
    server, client = pair
    _send_in_one_step(client.loop, 1)  # (connected: the server has the client's identity)
    wait_for(lambda: server.got(1) and client.got(1), timeout=5)
    client.loop.call(lambda: client.loop.bundles(b""))  # its broker said it reads them
    _send_in_one_step(client.loop, 50)
    wait_for(lambda: client.got(51), timeout=5)
    ident = server.received[0][0]
    # in order, each with its identity first
    assert server.received[1:] == [[ident, b"", b"m", str(i).encode()] for i in range(50)]
    assert client.received[1:] == [[b"", b"re", str(i).encode()] for i in range(50)]
    assert client.loop.stats.bundles_sent >= 1 and server.loop.stats.bundles_received >= 1
    # The server answered in bundles: this peer sent it one, so it reads them.
    assert server.loop.stats.bundles_sent >= 1 and server.loop.bundle_peers() == 1
    assert client.loop.stats.bundles_received >= 1
    assert server.loop.stats.received == 51 and client.loop.stats.received == 51  # messages, not bundles


def test_a_peer_not_known_to_read_bundles_gets_each_message_alone(pair: Any) -> None:
    server, client = pair
    _send_in_one_step(client.loop, 20)
    wait_for(lambda: client.got(20), timeout=5)
    assert client.loop.stats.bundles_sent == 0 and server.loop.stats.bundles_received == 0
    assert server.loop.stats.bundles_sent == 0 and server.loop.bundle_peers() == 0
    assert [f[-1] for f in client.received] == [str(i).encode() for i in range(20)]


def test_a_malformed_bundle_is_counted_and_dropped_and_the_loop_goes_on(pair: Any) -> None:
    server, _ = pair
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, 5000)
    raw.connect(server.bound)
    try:
        raw.send_multipart([b"", bundle.MARK, _lengths([3, 1]), b"a"])  # three frames said, one given
        raw.send_multipart([b"", b"after"])
        assert raw.recv_multipart() == [b"", b"re", b"after"]
        assert server.loop.stats.bundles_rejected == 1
        assert [f[1:] for f in server.received] == [[b"", b"after"]]
        assert server.loop.bundle_peers() == 0  # a bundle refused teaches the server nothing
    finally:
        raw.close(0)
        ctx.term()


def test_a_large_message_goes_alone_after_what_was_gathered_before_it(pair: Any) -> None:
    server, client = pair
    _send_in_one_step(client.loop, 1)
    wait_for(lambda: client.got(1), timeout=5)
    client.loop.call(lambda: client.loop.bundles(b""))
    big = b"z" * (bundle.LARGE * 2)

    def step() -> None:
        client.loop.send([b"", b"m", b"a"])
        client.loop.send([b"", b"m", b"b"])
        client.loop.send([b"", b"m", big])
        client.loop.send([b"", b"m", b"c"])

    client.loop.call(step)
    wait_for(lambda: server.got(5), timeout=5)
    assert [f[-1] for f in server.received[1:]] == [b"a", b"b", big, b"c"]
