"""transport/wire.py: which frames go zero-copy, and that what arrives is what was sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from zfab.transport.wire import Wire


class RecordingSocket(zmq.Socket):  # type: ignore[type-arg]
    """Records the `copy` argument of every send."""

    copies: list[bool]

    def send(self, *a: Any, **k: Any) -> Any:
        type(self).copies.append(bool(k.get("copy", a[2] if len(a) > 2 else True)))
        return super().send(*a, **k)


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    RecordingSocket.copies = []
    ctx._socket_class = RecordingSocket
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    for s in (a, b):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 5000)
    a.bind("inproc://wire-test")
    b.connect("inproc://wire-test")
    yield a, b
    a.close()
    b.close()
    ctx.term()


def test_large_frames_go_zero_copy_wherever_they_stand(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    a, b = pair
    big = b"x" * (1024 * 1024)
    frames = [b"", b"NFPC01", b"0x03", b"demo", big, b'{"task":"echo"}', big + b"!"]

    Wire(a).send(frames)

    assert RecordingSocket.copies == [True, True, True, True, False, True, False]
    poller = zmq.Poller()
    poller.register(b, zmq.POLLIN)
    assert poller.poll(5000)
    assert Wire(b).recv() == frames


def test_large_frames_arrive_as_views_onto_zeromqs_buffer_and_small_ones_as_bytes(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    a, b = pair
    big = bytes(range(256)) * 1024  # 256 KiB
    poller = zmq.Poller()
    poller.register(b, zmq.POLLIN)
    Wire(a).send([b"", b"NFPW01", big])
    assert poller.poll(5000)
    first = Wire(b).recv()
    # the next message reuses nothing of the first: the view keeps its ZeroMQ message alive
    Wire(a).send([b"", b"NFPW01", b"y" * len(big)])
    assert poller.poll(5000)
    second = Wire(b).recv()

    assert [type(f) for f in first] == [bytes, bytes, memoryview]
    assert first[2] == big and second[2] == b"y" * len(big)
    # and it can be sent on as it is (the broker forwards a body so), zero-copy
    Wire(b).send(first)
    assert poller.poll(0) == [] and a.poll(5000) and a.recv_multipart() == [b"", b"NFPW01", big]
