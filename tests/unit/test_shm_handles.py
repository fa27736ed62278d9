"""Shared-memory handles: a forged, stale or out-of-bounds handle is refused with a clear error
before anything outside the block it names is read (core/shmhandle.py, transport/shm.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zfab import Settings
from zfab.core import protocol as nfp
from zfab.core import shmhandle
from zfab.core.shmhandle import HEADER_BYTES, Handle, HandleError
from zfab.transport.shm import ShmArena, host_id

pytestmark = pytest.mark.timeout(30)

PAYLOAD = b'{"task":"echo","args":[],"kwargs":{"data":"' + b"x" * 300_000 + b'"}}'


def arena(d: Path, **kw: object) -> ShmArena:
    return ShmArena(Settings(shm_dir=str(d), **kw))  # type: ignore[arg-type]


def forged(name: str, length: int = 10, token: bytes = b"\x00" * 16) -> bytes:
    return shmhandle.MARK + nfp.dumps({"shm": name, "len": length, "tok": token.hex()})


def refused(a: ShmArena, frame: bytes) -> HandleError:
    with pytest.raises(HandleError) as info, a.payload(frame):
        pass
    return info.value


def test_a_payload_goes_into_a_block_and_comes_out_unchanged(tmp_path: Path) -> None:
    sender, receiver = arena(tmp_path), arena(tmp_path)
    handle = sender.put(PAYLOAD, ttl=60)
    assert handle is not None and shmhandle.is_handle(handle) and len(handle) < shmhandle.MAX_HANDLE_BYTES
    with receiver.payload(handle) as p:
        assert p.data == PAYLOAD  # the payload, not the header and not the block's slack
        assert nfp.loads(p.data)["kwargs"]["data"] == "x" * 300_000
    assert sender.stats()["shm_blocks"] == 1 and sender.counts["sent"] == 1 and receiver.counts["received"] == 1


def test_a_json_body_is_never_taken_for_a_handle() -> None:
    assert not shmhandle.is_handle(PAYLOAD)
    assert not shmhandle.is_handle(b"")
    assert not shmhandle.is_handle(shmhandle.MARK + b"x" * shmhandle.MAX_HANDLE_BYTES)  # too long to be one


@pytest.mark.parametrize(
    "name",
    [
        "../../etc/passwd",
        "zfab-00000000-1-1-0123456789abcdef/../../etc/passwd",
        "/etc/passwd",
        "sem.zfab",
        "zfab-00000000-1-1-0123456789abcdeX",
        "",
    ],
)
def test_a_handle_naming_anything_but_a_zfab_block_is_refused_before_any_file_is_opened(
    tmp_path: Path, name: str
) -> None:
    err = refused(arena(tmp_path), forged(name))
    assert err.reason == "name" and "not a zfab block" in str(err)


def test_a_handle_with_the_wrong_token_is_refused(tmp_path: Path) -> None:
    sender, receiver = arena(tmp_path), arena(tmp_path)
    good = shmhandle.decode_handle(sender.put(PAYLOAD, ttl=60) or b"")
    err = refused(receiver, shmhandle.encode_handle(Handle(good.name, good.length, b"\x01" * 16)))
    assert err.reason == "token" and "wrong token" in str(err)
    assert receiver.counts["refused"] == 1


def test_a_length_past_the_block_is_refused_and_nothing_past_it_is_mapped(tmp_path: Path) -> None:
    sender, receiver = arena(tmp_path), arena(tmp_path)
    good = shmhandle.decode_handle(sender.put(PAYLOAD, ttl=60) or b"")
    size = os.stat(tmp_path / good.name).st_size
    err = refused(receiver, shmhandle.encode_handle(Handle(good.name, size, good.token)))
    assert err.reason == "bounds" and "nothing read past the block" in str(err)
    # A length inside the block but not the one its header says is refused too.
    err = refused(receiver, shmhandle.encode_handle(Handle(good.name, good.length - 1, good.token)))
    assert err.reason == "length"


def test_a_stale_handle_to_an_unlinked_block_is_refused(tmp_path: Path) -> None:
    sender, receiver = arena(tmp_path), arena(tmp_path)
    handle = sender.put(PAYLOAD, ttl=60) or b""
    sender.close()  # unlinks it
    err = refused(receiver, handle)
    assert err.reason == "stale" and "is gone" in str(err)


def test_a_handle_to_a_block_its_creator_reused_is_refused(tmp_path: Path) -> None:
    sender, receiver = arena(tmp_path), arena(tmp_path)
    first = sender.put(PAYLOAD, ttl=60) or b""
    sender.free(first)  # the job ended: the block is free for the next payload
    second = sender.put(PAYLOAD, ttl=60) or b""
    assert shmhandle.decode_handle(first).name == shmhandle.decode_handle(second).name  # the same block
    assert refused(receiver, first).reason == "token"
    with receiver.payload(second) as p:
        assert p.data == PAYLOAD


def test_a_reader_overtaken_by_a_reuse_refuses_what_it_copied(tmp_path: Path) -> None:
    sender, receiver = arena(tmp_path), arena(tmp_path)
    first = sender.put(PAYLOAD, ttl=60) or b""
    h = shmhandle.decode_handle(first)
    fd = receiver._open(h)  # the header checked...
    try:
        sender.free(first)
        sender.put(PAYLOAD, ttl=60)  # ...then the creator reuses the block before the copy is done
        with pytest.raises(HandleError, match="reused while it was read"):
            receiver._copy(h, fd)
    finally:
        os.close(fd)


def test_a_block_cut_short_while_it_is_read_is_refused_and_nothing_faults(tmp_path: Path) -> None:
    # Given a same-user peer's block that passed the checks on open
    sender, receiver = arena(tmp_path), arena(tmp_path)
    h = shmhandle.decode_handle(sender.put(PAYLOAD, ttl=60) or b"")
    fd = receiver._open(h)
    try:
        # When its creator cuts the file before the payload is copied (a mapping would SIGBUS here)
        os.truncate(tmp_path / h.name, HEADER_BYTES + 1000)
        # Then the read comes back short and the handle is refused with the reason
        with pytest.raises(HandleError, match="was cut to") as info:
            receiver._copy(h, fd)
        assert info.value.reason == "bounds"
    finally:
        os.close(fd)


def test_a_block_cut_after_the_copy_leaves_the_copy_whole(tmp_path: Path) -> None:
    sender, receiver = arena(tmp_path), arena(tmp_path)
    handle = sender.put(PAYLOAD, ttl=60) or b""
    with receiver.payload(handle) as p:
        os.truncate(tmp_path / shmhandle.decode_handle(handle).name, 0)
        assert nfp.loads(p.data)["kwargs"]["data"] == "x" * 300_000  # a private copy: nothing to fault on


def sparse_block(d: Path, claim: int) -> bytes:
    """A block of this user that claims `claim` bytes it never wrote (an empty sparse file), and its handle."""
    name = "zfab-00000000-1-1-0123456789abcdef"
    token = b"\x05" * 16
    with open(d / name, "wb") as f:  # (replaced if it is there)
        f.write(shmhandle.header(token, claim))
        f.truncate(HEADER_BYTES + claim)
    os.chmod(d / name, 0o600)
    return shmhandle.encode_handle(Handle(name, claim, token))


def test_a_handle_claiming_more_than_a_message_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    # Given a 150-byte handle to a sparse block claiming 320 MiB (a message carries 64 MiB at most)
    handle = sparse_block(tmp_path, 320 << 20)
    receiver = arena(tmp_path)
    err = refused(receiver, handle)
    # Then it is refused on its claim, naming the limit, and counted
    assert err.reason == "length" and "ZFAB_MAX_MESSAGE_BYTES" in str(err)
    assert receiver.counts["refused"] == 1
    with pytest.raises(HandleError, match="ZFAB_MAX_MESSAGE_BYTES"):
        shmhandle.check_claim(handle, 64 << 20)
    # and a lower ZFAB_MAX_MESSAGE_BYTES lowers the bound with it
    assert refused(arena(tmp_path, max_message_bytes=1 << 20), sparse_block(tmp_path, 2 << 20)).reason == "length"
    # A claim within the bound reads the holes as zeros: a copy, no mapping to fault on
    with arena(tmp_path).payload(sparse_block(tmp_path, 2 << 20)) as p:
        assert p.data == bytes(2 << 20)


def test_a_block_of_another_user_is_refused_on_the_opened_file(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user (CI runs as root)")
    sender, receiver = arena(tmp_path), arena(tmp_path)
    handle = sender.put(PAYLOAD, ttl=60) or b""
    os.chown(tmp_path / shmhandle.decode_handle(handle).name, 65534, 65534)  # nobody's now
    err = refused(receiver, handle)
    assert err.reason == "owner" and "belongs to uid 65534" in str(err)


def test_a_symlink_named_like_a_block_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 4096)
    name = "zfab-00000000-1-1-0123456789abcdef"
    (tmp_path / name).symlink_to(secret)
    err = refused(arena(tmp_path), forged(name))
    assert err.reason == "open"


def test_a_block_without_our_header_is_refused(tmp_path: Path) -> None:
    name = "zfab-00000000-1-1-0123456789abcdef"
    (tmp_path / name).write_bytes(b"\x00" * 4096)
    err = refused(arena(tmp_path), forged(name))
    assert err.reason == "header"


def test_a_result_block_given_back_by_its_reader_is_reused_by_its_creator(tmp_path: Path) -> None:
    worker, client = arena(tmp_path), arena(tmp_path)
    first = worker.put(PAYLOAD, ttl=60, worker="w1") or b""
    assert shmhandle.decode_handle(first).worker == "w1"
    with client.payload(first, give_back=True):
        pass
    second = worker.put(PAYLOAD, ttl=60, worker="w1") or b""
    assert shmhandle.decode_handle(first).name == shmhandle.decode_handle(second).name
    assert worker.stats()["shm_blocks"] == 1


def test_a_result_nobody_gave_back_is_unlinked_at_its_expiry(tmp_path: Path) -> None:
    now = [0.0]
    worker = ShmArena(Settings(shm_dir=str(tmp_path)), clock=lambda: now[0])
    handle = worker.put(PAYLOAD, ttl=60, worker="w1") or b""
    now[0] = 61.0
    worker.sweep()
    assert worker.counts["expired"] == 1 and worker.stats()["shm_bytes"] == 0
    assert refused(arena(tmp_path), handle).reason == "stale"


def test_over_the_cap_the_payload_is_left_to_the_socket_and_counted(tmp_path: Path) -> None:
    a = arena(tmp_path, shm_bytes=100_000)
    assert a.put(PAYLOAD, ttl=60) is None
    assert a.counts["fallbacks"] == 1 and a.stats()["shm_bytes"] == 0 and not list(tmp_path.iterdir())


def test_an_unwritable_directory_is_left_to_the_socket_and_counted(tmp_path: Path) -> None:
    a = arena(tmp_path)
    a.dir = str(tmp_path / "missing")  # the tmpfs went away, or is not ours to write
    assert a.put(PAYLOAD, ttl=60) is None
    assert a.counts["fallbacks"] == 1 and a.stats()["shm_bytes"] == 0


def test_off_means_no_handle_is_made_or_read(tmp_path: Path) -> None:
    a = arena(tmp_path, shm=False)
    assert not a.enabled and a.threshold == sys.maxsize
    err = refused(a, forged("zfab-00000000-1-1-0123456789abcdef"))
    assert err.reason == "off"


def test_host_ids_differ_for_different_directories_and_match_for_the_same(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert host_id(str(tmp_path / "a")) == host_id(str(tmp_path / "a")) is not None
    assert host_id(str(tmp_path / "a")) != host_id(str(tmp_path / "b"))
    assert host_id(str(tmp_path / "nowhere")) is None
    assert shmhandle.check_host(host_id(str(tmp_path / "a"))) is not None
    assert shmhandle.check_host("../x") is None and shmhandle.check_host(7) is None
    assert shmhandle.check_host(None) is None


def test_the_blocks_of_a_process_that_died_are_reclaimed_and_a_live_ones_are_not(tmp_path: Path) -> None:
    # Given a real process that made a block and was killed
    code = (
        "import sys; from zfab import Settings; from zfab.transport.shm import ShmArena; "
        f"a = ShmArena(Settings(shm_dir={str(tmp_path)!r})); a.put(b'x' * 300_000, ttl=60); "
        "print('made', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"made"
        mine = arena(tmp_path)
        mine.put(PAYLOAD, ttl=60)
        assert len(list(tmp_path.iterdir())) == 2
        assert mine.reclaim() == 0  # its creator is alive
        child.kill()
        child.wait(10)
        # When another zfab process looks
        assert mine.reclaim() == 1
        # Then only the live process's block is left
        assert [p.name for p in tmp_path.iterdir()] == [b.name for b in mine._blocks.values()]
        assert mine.counts["reclaimed"] == 1
    finally:
        child.kill()
        child.wait(10)


def test_a_malformed_handle_says_what_is_wrong() -> None:
    for frame, reason in [
        (shmhandle.MARK + b"{", "handle"),
        (shmhandle.MARK + b"[]", "handle"),
        (shmhandle.MARK + b'{"shm":"zfab-00000000-1-1-0123456789abcdef","len":-1,"tok":"00"}', "length"),
        (shmhandle.MARK + b'{"shm":"zfab-00000000-1-1-0123456789abcdef","len":1,"tok":"zz"}', "token"),
    ]:
        with pytest.raises(HandleError) as info:
            shmhandle.decode_handle(frame)
        assert info.value.reason == reason


def test_the_header_is_what_the_reader_checks() -> None:
    h = Handle("zfab-00000000-1-1-0123456789abcdef", 5, b"\x07" * 16)
    head = shmhandle.header(h.token, 5)
    assert len(head) == HEADER_BYTES
    shmhandle.check_block(h, head, HEADER_BYTES + 5)
    with pytest.raises(HandleError, match="nothing read past the block"):
        shmhandle.check_block(h, head, HEADER_BYTES + 4)


def test_a_retried_attempt_of_a_job_sent_by_handle_carries_its_attempt_in_the_handle() -> None:
    from zfab.core import payloads

    h = shmhandle.encode_handle(Handle("zfab-00000000-1-1-0123456789abcdef", 5, b"\x07" * 16))
    again = payloads.with_attempt(h, 3)
    got = shmhandle.decode_handle(again)
    assert (got.name, got.length, got.token, got.attempt) == ("zfab-00000000-1-1-0123456789abcdef", 5, b"\x07" * 16, 3)
    with pytest.raises(HandleError, match="attempt"):
        shmhandle.decode_handle(shmhandle.MARK + h[len(shmhandle.MARK) : -1] + b',"attempt":0}')


def test_a_body_the_broker_reads_for_a_worker_that_takes_no_handle_counts_against_its_byte_bound(
    tmp_path: Path,
) -> None:
    from test_broker_handlers import make_broker, ready, stub

    from zfab.transport import FakeClock

    # Given a client's block on the broker's host, and a worker that announced no host id
    broker = make_broker(FakeClock(), shm_dir=str(tmp_path), data_dir=str(tmp_path / "data"))
    ready(broker, b"w1")
    stub(broker).take()
    client = arena(tmp_path)
    handle = client.put(PAYLOAD, ttl=60) or b""
    flags = nfp.dumps({"push": True, "ack": True, "task": "echo", "timeout": 10, "host": client.host})
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", b"j1", handle, flags])
    # Then the worker got the bytes, and the broker counts them as held until the worker starts the job
    (post,) = [f for f in stub(broker).take() if f[0] == b"w1" and f[3] == nfp.POST]
    assert bytes(post[7]) == PAYLOAD
    facts = broker.mmi.show_broker()
    assert facts["dispatched_bytes"] >= len(PAYLOAD) and facts["counts"]["shm_materialized"] == 1
    accepted = nfp.dumps({"worker": "w1", "uuid": "j1", "status": "ACCEPTED"})
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_WORKER_ACCEPTED, accepted])
    assert broker.mmi.show_broker()["dispatched_bytes"] == 0
