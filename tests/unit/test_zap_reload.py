"""The broker's ZAP handler reads its clients directory again while it runs: a key added is
accepted, a key removed admits no new connection (no broker restart either way)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth
from zmq.utils import z85

from zfab.transport.security import ZapHandler, create_keys


def zap_request(public_file: Path) -> list[bytes]:
    """A ZAP request (RFC 27) for a CURVE handshake with this certificate's key."""
    public, _ = zmq.auth.load_certificate(public_file)
    return [b"1.0", b"1", b"", b"192.0.2.7", b"", b"CURVE", z85.decode(public)]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[ZapHandler, Path, Path, Path]]:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    old, _ = create_keys(tmp_path / "keys", "old", worker="demo-*")
    new, _ = create_keys(tmp_path / "keys", "new", worker="demo-hostb-*")
    (allowed / "old.key").write_bytes(old.read_bytes())
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    zap = ZapHandler(ctx, str(allowed))
    zap.RESCAN = 0.0  # no rate limit: each request looks at the directory
    zap.start()
    try:
        yield zap, allowed, old, new
    finally:
        zap.stop()
        ctx.term()


def status(zap: ZapHandler, public_file: Path) -> bytes:
    return zap.decide(zap_request(public_file))[2]


def test_a_key_added_while_running_is_accepted_and_the_old_one_still_is(
    setup: tuple[ZapHandler, Path, Path, Path],
) -> None:
    zap, allowed, old, new = setup
    assert status(zap, new) == b"400"
    (allowed / "new.key").write_bytes(new.read_bytes())
    assert status(zap, new) == b"200"
    assert status(zap, old) == b"200"
    assert zap.may_register(b"demo-hostb-1", b"new") and not zap.may_register(b"demo-1", b"new")


def test_a_key_removed_while_running_admits_no_new_connection(setup: tuple[ZapHandler, Path, Path, Path]) -> None:
    zap, allowed, old, new = setup
    (allowed / "new.key").write_bytes(new.read_bytes())
    assert status(zap, old) == b"200" and status(zap, new) == b"200"
    # When the operator removes the old key, with nothing unknown knocking in between
    (allowed / "old.key").unlink()
    # Then the next handshake with it is refused, the other key still admitted
    assert status(zap, old) == b"400"
    assert status(zap, new) == b"200"
    assert not zap.may_register(b"demo-1", b"old")  # a READY under the removed key's name too
