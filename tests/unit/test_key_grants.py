"""Each CURVE key's grant at the broker's ZAP handler (transport/security.py with core/access.py): the access
file's entry, or its certificate's default; reloaded with the file; events refused to a key that may not read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth
from zmq.utils import z85

from zfab.core.access import AccessFile
from zfab.transport.security import EVENTS_DOMAIN, ZapHandler, create_keys


def zap_request(public_file: Path, domain: bytes = b"") -> list[bytes]:
    public, _ = zmq.auth.load_certificate(public_file)
    return [b"1.0", b"1", domain, b"192.0.2.7", b"", b"CURVE", z85.decode(public)]


@pytest.fixture
def zap(tmp_path: Path) -> Iterator[tuple[ZapHandler, Path, dict[str, Path]]]:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    keys = {
        "w1": create_keys(tmp_path / "keys", "w1", worker="w1")[0],
        "ops": create_keys(tmp_path / "keys", "ops")[0],
        "plain": create_keys(tmp_path / "keys", "plain")[0],
    }
    for name, public in keys.items():
        (allowed / f"{name}.key").write_bytes(public.read_bytes())
    access = tmp_path / "access.toml"
    access.write_text('[[key]]\nname = "ops"\nrole = "operator"\nscope = ["demo"]\n')
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    handler = ZapHandler(ctx, str(allowed), AccessFile(str(access)))
    try:
        yield handler, access, keys
    finally:
        handler._sock.close(0)
        ctx.term()


def test_each_key_has_its_entry_or_its_certificates_default(zap: tuple[ZapHandler, Path, dict[str, Path]]) -> None:
    handler, _, keys = zap
    w1, ops, plain = handler.grants[b"w1"], handler.grants[b"ops"], handler.grants[b"plain"]
    assert not w1.client and not w1.allows("read") and w1.may_register("anything")
    assert ops.role == "operator" and ops.allows("submit") and not ops.allows("pause") and not ops.sees("net")
    assert plain.role == "admin" and plain.allows("limits") and plain.everywhere
    assert handler.may_register(b"w1", b"w1", b"demo") and not handler.may_register(b"w2", b"w1", b"demo")
    # A key that may not read cannot subscribe to the event publisher; one that may, can.
    assert handler.decide(zap_request(keys["w1"], EVENTS_DOMAIN))[2] == b"400"
    assert handler.decide(zap_request(keys["ops"], EVENTS_DOMAIN))[2] == b"200"
    assert handler.decide(zap_request(keys["w1"]))[2] == b"200"  # its ROUTER connection, as a worker


def test_a_change_of_the_access_file_changes_the_keys_grants(zap: tuple[ZapHandler, Path, dict[str, Path]]) -> None:
    handler, access, _ = zap
    access.write_text('[[key]]\nname = "w1"\nregister = ["demo"]\n\n[[key]]\nname = "ops"\nrole = "admin"\n# v2\n')
    handler.access.RESCAN = 0.0  # type: ignore[union-attr]
    handler.rescan(10_000.0)
    assert handler.grants[b"ops"].allows("pause") and handler.grants[b"ops"].everywhere
    assert not handler.may_register(b"w1", b"w1", b"other") and handler.may_register(b"w1", b"w1", b"demo")
