"""NFP frames: every encoder round-trips through its decoder; bad input is a ProtocolError, never a crash."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import PurePosixPath
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zfab.core import protocol as nfp

REASONS = {"frame_count", "delimiter", "header", "command", "json", "oversize", "field", "status", "type"}

POST_BODY = nfp.dumps({"task": "echo", "args": [1], "kwargs": {"x": "y"}})


def reason_of(decoder: Any, frames: list[Any], **kw: Any) -> str:
    with pytest.raises(nfp.ProtocolError) as info:
        decoder(frames, **kw)
    return info.value.reason


# ---- round trips -------------------------------------------------------------------


def test_client_request_without_flags_round_trips_with_empty_flags() -> None:
    # Given a POST as a NorFab client sends it: seven frames, no flags frame
    frames = nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY)

    # When the broker decodes it
    req = nfp.decode_client(frames)

    # Then every field comes back and the flags are empty
    assert len(frames) == 7
    assert req == nfp.ClientRequest(nfp.POST, b"demo", b"any", b"job-1", POST_BODY, {})


def test_client_request_with_flags_round_trips_the_flags_object() -> None:
    frames = nfp.client_request(nfp.POST, b"demo", b"all", b"job-2", POST_BODY, nfp.dumps({"push": True, "ack": False}))

    req = nfp.decode_client(frames)

    assert len(frames) == 8
    assert req.flags == {"push": True, "ack": False}
    assert (req.command, req.service, req.target, req.uuid, req.body) == (
        nfp.POST,
        b"demo",
        b"all",
        b"job-2",
        POST_BODY,
    )


@pytest.mark.parametrize("command", [nfp.READY, nfp.KEEPALIVE, nfp.DISCONNECT])
def test_worker_control_without_stats_round_trips_with_no_stats(command: bytes) -> None:
    msg = nfp.decode_worker(nfp.worker_control(command, b"demo"))

    assert msg == nfp.WorkerControl(command, b"demo", None)


def test_worker_keepalive_with_stats_round_trips_the_stats_object() -> None:
    frames = nfp.worker_control(nfp.KEEPALIVE, b"demo", nfp.dumps({"queued": 3, "running": 1}))

    msg = nfp.decode_worker(frames)

    assert msg == nfp.WorkerControl(nfp.KEEPALIVE, b"demo", {"queued": 3, "running": 1})


@pytest.mark.parametrize("command", sorted(nfp.WORKER_REPLY_COMMANDS))
def test_worker_reply_round_trips(command: bytes) -> None:
    frames = nfp.worker_reply(command, b"client-a", b"job-1", nfp.ST_OK, b'{"w1":{"result":1}}')

    msg = nfp.decode_worker(frames)

    assert msg == nfp.WorkerReply(command, b"client-a", b"job-1", nfp.ST_OK, b'{"w1":{"result":1}}')


@pytest.mark.parametrize("command", sorted(nfp.BROKER_JOB_COMMANDS))
def test_broker_job_round_trips_as_the_workers_dealer_sees_it(command: bytes) -> None:
    # Given the frames the broker's ROUTER sends: the worker identity first
    frames = nfp.broker_job(b"w1", command, b"client-a", b"job-1", POST_BODY)
    assert frames[0] == b"w1"

    # When the worker's DEALER receives them (the identity is consumed by the ROUTER)
    msg = nfp.decode_broker_to_worker(frames[1:])

    # Then
    assert msg == nfp.BrokerJob(command, b"client-a", b"job-1", POST_BODY)


@pytest.mark.parametrize("command", [nfp.KEEPALIVE, nfp.DISCONNECT])
def test_broker_control_round_trips_as_the_workers_dealer_sees_it(command: bytes) -> None:
    frames = nfp.broker_control(b"w1", command, b"demo")

    msg = nfp.decode_broker_to_worker(frames[1:])

    assert frames[0] == b"w1"
    assert msg == nfp.BrokerControl(command, b"demo")


def test_a_name_taken_disconnect_carries_its_sentence_and_wait_and_nothing_odd_gets_through() -> None:
    why = {"reason": "name_taken", "detail": "d" * 1000, "retry_after": 5}
    msg = nfp.decode_broker_to_worker([b"", nfp.BROKER, nfp.DISCONNECT, b"demo", nfp.dumps(why)])
    assert isinstance(msg, nfp.BrokerControl)
    assert (msg.reason, msg.detail, msg.retry_after) == ("name_taken", "d" * nfp.MAX_DETAIL, 5.0)
    for odd in ({"reason": 1, "detail": 2, "retry_after": -1}, {"retry_after": True}, {"retry_after": "5"}):
        msg = nfp.decode_broker_to_worker([b"", nfp.BROKER, nfp.DISCONNECT, b"demo", nfp.dumps(odd)])
        assert isinstance(msg, nfp.BrokerControl) and (msg.reason, msg.detail, msg.retry_after) == (None, None, None)


@pytest.mark.parametrize("status", sorted(nfp.KNOWN_STATUSES))
def test_broker_reply_round_trips_as_the_clients_dealer_sees_it(status: bytes) -> None:
    frames = nfp.broker_reply(b"client-a", nfp.RESPONSE, b"demo", b"job-1", status, b"{}")

    msg = nfp.decode_broker_to_client(frames[1:])

    assert frames[0] == b"client-a"
    assert msg == nfp.BrokerReply(nfp.RESPONSE, b"demo", b"job-1", status, b"{}")


def test_stream_reply_may_carry_any_status_frame() -> None:
    # STREAM reuses the status frame for its own bookkeeping, so it is not checked
    frames = nfp.broker_reply(b"c", nfp.STREAM, b"demo", b"job-1", b"chunk-7", b"data")

    assert nfp.decode_broker_to_client(frames[1:]).status == b"chunk-7"


def test_decoders_accept_memoryview_frames_and_keep_only_what_the_broker_forwards_as_a_view() -> None:
    body = memoryview(bytearray(b"{}"))  # the wire hands a frame of 64 KiB or more over so
    frames = [memoryview(f) for f in nfp.worker_reply(nfp.RESPONSE, b"c", b"job-1", nfp.ST_OK, b"")[:-1]] + [body]

    msg = nfp.decode_worker(frames)

    assert isinstance(msg, nfp.WorkerReply)
    assert (msg.client, msg.uuid, msg.status, msg.payload) == (b"c", b"job-1", nfp.ST_OK, b"{}")
    # names and ids become bytes (they are compared, hashed and kept); the payload is the
    # frame itself, so a broker passes a large result on without a copy
    assert all(type(v) is bytes for v in (msg.client, msg.uuid, msg.status))
    assert msg.payload is body
    req = nfp.decode_client(
        [*[memoryview(f) for f in nfp.client_request(nfp.POST, b"s", b"any", b"u", b"")][:-1], body]
    )
    assert (type(req.service), type(req.uuid), req.body) == (bytes, bytes, body)


def test_the_worker_and_the_client_parse_a_body_from_its_frame() -> None:
    body = memoryview(bytearray(b"{}"))
    job = nfp.decode_broker_to_worker(
        [*[memoryview(f) for f in nfp.broker_job(b"w", nfp.POST, b"c", b"u", b"")[1:-1]], body]
    )
    reply = nfp.decode_broker_to_client(
        [*[memoryview(f) for f in nfp.broker_reply(b"c", nfp.RESPONSE, b"s", b"u", nfp.ST_OK, b"")[1:-1]], body]
    )

    assert isinstance(job, nfp.BrokerJob)
    # not copied first: a 10 MB body is parsed from ZeroMQ's buffer; the names are bytes
    assert job.body is body and (type(job.client), type(job.uuid)) == (bytes, bytes)
    assert reply.payload is body and (type(reply.service), type(reply.uuid), type(reply.status)) == (bytes,) * 3


# ---- malformed input: each has its reason --------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2])
def test_fewer_than_three_frames_are_rejected_by_every_decoder(n: int) -> None:
    frames = [b"", nfp.CLIENT][:n]
    for decoder in (nfp.decode_client, nfp.decode_worker, nfp.decode_broker_to_worker, nfp.decode_broker_to_client):
        assert reason_of(decoder, frames) == "frame_count"


def test_client_request_with_six_frames_is_rejected() -> None:
    frames = nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY)[:6]

    assert reason_of(nfp.decode_client, frames) == "frame_count"


def test_client_request_with_nine_frames_is_rejected() -> None:
    frames = [*nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY, b"{}"), b"extra"]

    assert reason_of(nfp.decode_client, frames) == "frame_count"


def test_client_request_without_empty_delimiter_is_rejected() -> None:
    frames = nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY)
    frames[0] = b"x"

    assert reason_of(nfp.decode_client, frames) == "delimiter"


def test_worker_frames_sent_to_the_client_decoder_are_rejected_by_header() -> None:
    frames = nfp.worker_reply(nfp.RESPONSE, b"c", b"job-1", nfp.ST_OK, b"{}")[:7]

    assert reason_of(nfp.decode_client, frames) == "header"


def test_unknown_command_is_rejected() -> None:
    frames = nfp.client_request(b"0x99", b"demo", b"any", b"job-1", POST_BODY)

    assert reason_of(nfp.decode_client, frames) == "command"


@pytest.mark.parametrize("command", [nfp.READY, nfp.RESPONSE, nfp.EVENT, nfp.STREAM])
def test_client_may_not_send_worker_commands(command: bytes) -> None:
    frames = nfp.client_request(command, b"demo", b"any", b"job-1", POST_BODY)

    assert reason_of(nfp.decode_client, frames) == "command"


def test_client_flags_frame_that_is_not_json_is_rejected() -> None:
    frames = nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY, b"{not json")

    assert reason_of(nfp.decode_client, frames) == "json"


def test_client_flags_frame_that_is_not_utf8_is_rejected() -> None:
    frames = nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY, b"\xff\xfe\xfd")

    assert reason_of(nfp.decode_client, frames) == "json"


def test_client_flags_frame_that_is_a_json_list_is_rejected() -> None:
    frames = nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY, b"[1,2]")

    assert reason_of(nfp.decode_client, frames) == "json"


def test_message_larger_than_the_limit_is_rejected_as_oversize() -> None:
    frames = nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", b"x" * 100)

    assert reason_of(nfp.decode_client, frames, max_bytes=99) == "oversize"
    assert nfp.decode_client(frames, max_bytes=200).body == b"x" * 100


def test_service_name_longer_than_the_limit_is_rejected() -> None:
    long_name = b"s" * (nfp.MAX_NAME_BYTES + 1)
    frames = nfp.client_request(nfp.POST, long_name, b"any", b"job-1", POST_BODY)

    assert reason_of(nfp.decode_client, frames) == "field"
    assert nfp.decode_client(nfp.client_request(nfp.POST, long_name[:-1], b"any", b"j", b"")).service == long_name[:-1]


def test_uuid_longer_than_the_limit_is_rejected() -> None:
    frames = nfp.client_request(nfp.POST, b"demo", b"any", b"u" * (nfp.MAX_UUID_BYTES + 1), POST_BODY)

    assert reason_of(nfp.decode_client, frames) == "field"


@pytest.mark.parametrize("bad", ["text", 42, None, ["nested"]])
def test_frame_that_is_not_bytes_is_rejected_by_type(bad: Any) -> None:
    frames: list[Any] = nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY)
    frames[6] = bad

    assert reason_of(nfp.decode_client, frames) == "type"


def test_worker_reply_without_empty_delimiter_is_rejected() -> None:
    frames = nfp.worker_reply(nfp.RESPONSE, b"c", b"job-1", nfp.ST_OK, b"{}")
    frames[4] = b"not-empty"

    assert reason_of(nfp.decode_worker, frames) == "delimiter"


def test_worker_reply_with_seven_frames_is_rejected() -> None:
    frames = nfp.worker_reply(nfp.RESPONSE, b"c", b"job-1", nfp.ST_OK, b"{}")[:7]

    assert reason_of(nfp.decode_worker, frames) == "frame_count"


def test_worker_control_with_extra_frames_is_rejected() -> None:
    frames = [*nfp.worker_control(nfp.KEEPALIVE, b"demo", b"{}"), b"extra"]

    assert reason_of(nfp.decode_worker, frames) == "frame_count"


def test_worker_ready_without_service_frame_is_rejected() -> None:
    assert reason_of(nfp.decode_worker, nfp.worker_control(nfp.READY, b"demo")[:3]) == "frame_count"


def test_worker_keepalive_stats_that_are_not_a_json_object_are_rejected() -> None:
    assert reason_of(nfp.decode_worker, nfp.worker_control(nfp.KEEPALIVE, b"demo", b"[1]")) == "json"
    assert reason_of(nfp.decode_worker, nfp.worker_control(nfp.KEEPALIVE, b"demo", b"{oops")) == "json"


def test_worker_ready_with_overlong_service_is_rejected() -> None:
    frames = nfp.worker_control(nfp.READY, b"s" * (nfp.MAX_NAME_BYTES + 1))

    assert reason_of(nfp.decode_worker, frames) == "field"


def test_worker_reply_with_overlong_uuid_is_rejected() -> None:
    frames = nfp.worker_reply(nfp.RESPONSE, b"c", b"u" * (nfp.MAX_UUID_BYTES + 1), nfp.ST_OK, b"{}")

    assert reason_of(nfp.decode_worker, frames) == "field"


@pytest.mark.parametrize("command", [nfp.POST, nfp.GET, nfp.OPEN])
def test_worker_may_not_send_client_commands(command: bytes) -> None:
    frames = [b"", nfp.WORKER, command, b"demo"]

    assert reason_of(nfp.decode_worker, frames) == "command"


def test_broker_keepalive_with_two_extra_frames_is_rejected() -> None:
    frames = [*nfp.broker_control(b"w1", nfp.KEEPALIVE, b"demo")[1:], b"{}", b"extra"]

    assert reason_of(nfp.decode_broker_to_worker, frames) == "frame_count"


def test_broker_disconnect_may_say_why_and_a_bad_reason_is_rejected() -> None:
    frames = [*nfp.broker_control(b"w1", nfp.DISCONNECT, b"demo")[1:], b'{"reason":"purged"}']
    msg = nfp.decode_broker_to_worker(frames)
    assert isinstance(msg, nfp.BrokerControl) and msg.reason == "purged"
    assert reason_of(nfp.decode_broker_to_worker, [*frames[:-1], b"[nested"]) == "json"


def test_broker_job_may_carry_a_meta_frame() -> None:
    frames = [*nfp.broker_job(b"w1", nfp.POST, b"c", b"job-1", POST_BODY)[1:], b'{"deadline":5,"queued":1}']
    msg = nfp.decode_broker_to_worker(frames)
    assert isinstance(msg, nfp.BrokerJob) and msg.meta == {"deadline": 5, "queued": 1}


def test_broker_job_missing_its_body_is_rejected() -> None:
    frames = nfp.broker_job(b"w1", nfp.POST, b"c", b"job-1", POST_BODY)[1:-1]

    assert reason_of(nfp.decode_broker_to_worker, frames) == "frame_count"


def test_broker_job_without_empty_delimiter_is_rejected() -> None:
    frames = nfp.broker_job(b"w1", nfp.POST, b"c", b"job-1", POST_BODY)[1:]
    frames[4] = b"x"

    assert reason_of(nfp.decode_broker_to_worker, frames) == "delimiter"


def test_broker_to_worker_with_a_reply_command_is_rejected() -> None:
    frames = nfp.broker_job(b"w1", nfp.RESPONSE, b"c", b"job-1", b"{}")[1:]

    assert reason_of(nfp.decode_broker_to_worker, frames) == "command"


def test_broker_to_worker_with_client_header_is_rejected() -> None:
    frames = nfp.broker_control(b"w1", nfp.KEEPALIVE, b"demo")[1:]
    frames[1] = nfp.CLIENT

    assert reason_of(nfp.decode_broker_to_worker, frames) == "header"


def test_broker_reply_with_unknown_status_is_rejected() -> None:
    frames = nfp.broker_reply(b"c", nfp.RESPONSE, b"demo", b"job-1", b"299", b"{}")[1:]

    assert reason_of(nfp.decode_broker_to_client, frames) == "status"


def test_broker_reply_with_a_job_command_is_rejected() -> None:
    frames = nfp.broker_reply(b"c", nfp.POST, b"demo", b"job-1", nfp.ST_OK, b"{}")[1:]

    assert reason_of(nfp.decode_broker_to_client, frames) == "command"


def test_broker_reply_with_six_frames_is_rejected() -> None:
    frames = nfp.broker_reply(b"c", nfp.RESPONSE, b"demo", b"job-1", nfp.ST_OK, b"{}")[1:-1]

    assert reason_of(nfp.decode_broker_to_client, frames) == "frame_count"


def test_protocol_error_message_carries_reason_and_detail() -> None:
    err = nfp.ProtocolError("header", "header b'XX', expected b'NFPC01'")

    assert (err.reason, err.detail) == ("header", "header b'XX', expected b'NFPC01'")
    assert str(err) == "header: header b'XX', expected b'NFPC01'"


# ---- inputs that must stay ProtocolErrors: known bugs ---------------------------------


def test_deeply_nested_flags_frame_is_rejected_as_json() -> None:
    frames = nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY, b"[" * 100_000)

    assert reason_of(nfp.decode_client, frames) == "json"


def test_deeply_nested_keepalive_stats_are_rejected_as_json() -> None:
    frames = nfp.worker_control(nfp.KEEPALIVE, b"demo", b'{"a":' * 100_000)

    assert reason_of(nfp.decode_worker, frames) == "json"


def test_bytearray_frames_decode_like_bytes() -> None:
    frames = [bytearray(f) for f in nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY)]

    req = nfp.decode_client(frames)  # type: ignore[arg-type]

    assert req.command == nfp.POST
    assert type(req.command) is bytes


# ---- parse_target and dumps ------------------------------------------------------------


@pytest.mark.parametrize(("raw", "parsed"), [(b"any", "any"), (b"all", "all"), (b"worker-1", "worker-1")])
def test_target_keyword_or_worker_name_parses_to_a_string(raw: bytes, parsed: str) -> None:
    assert nfp.parse_target(raw) == parsed


def test_target_json_list_parses_to_names() -> None:
    assert nfp.parse_target(b'["w1", "w2"]') == ["w1", "w2"]
    assert nfp.parse_target(b"[]") == []


@pytest.mark.parametrize("raw", [b"[w1, w2", b'["w1", 2]', b'[{"name": "w1"}]', b"[\xff]", b"\xff\xfe"])
def test_target_that_is_bad_json_or_not_names_or_not_utf8_is_rejected(raw: bytes) -> None:
    with pytest.raises(nfp.ProtocolError) as info:
        nfp.parse_target(raw)

    assert info.value.reason == "target"


def test_deeply_nested_target_list_is_rejected() -> None:
    with pytest.raises(nfp.ProtocolError) as info:
        nfp.parse_target(b"[" * 100_000)

    assert info.value.reason == "target"


def test_dumps_is_compact_json_that_round_trips_text() -> None:
    raw = nfp.dumps({"a": [1, 2], "name": "café"})

    assert raw.startswith(b'{"a":[1,2],"name":')
    assert json.loads(raw.decode("utf-8")) == {"a": [1, 2], "name": "café"}


def test_dumps_writes_datetimes_as_rfc_3339_bytes_as_base64_and_other_objects_as_their_str() -> None:
    when = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
    paris = dt.datetime(2024, 5, 1, 14, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))

    raw = nfp.dumps(
        {"when": when, "paris": paris, "path": PurePosixPath("/tmp/x"), "blob": b"\x00", "set": {3}, 7: "int key"}
    )

    assert json.loads(raw) == {
        "when": "2024-05-01T12:30:00Z",
        "paris": paris.isoformat(),
        "path": "/tmp/x",
        "blob": "AA==",
        "set": [3],
        "7": "int key",
    }
    assert dt.datetime.fromisoformat(json.loads(raw)["when"]) == when


def test_dumps_spells_keys_and_numbers_as_json_does() -> None:
    class Count(int):
        pass

    class Ratio(float):
        pass

    raw = nfp.dumps({True: 1, False: 2, None: 3, Count(4): Count(5), "r": Ratio(0.5), (1, 2): "tuple key"})

    assert raw == b'{"true":1,"false":2,"null":3,"4":5,"r":0.5,"(1, 2)":"tuple key"}'
    assert nfp.dumps({"nan": float("nan")}) == b'{"nan":null}'


def test_dumps_falls_back_to_the_stdlib_for_what_msgspec_refuses() -> None:
    assert json.loads(nfp.dumps({"big": 2**80})) == {"big": 2**80}
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        nfp.dumps(cycle)
    deep: list[Any] = []
    for _ in range(900):  # past orjson's 254 levels, within the stdlib's limit
        deep = [deep]
    assert nfp.loads(nfp.dumps(deep)) == deep


def test_dumps_from_several_threads_at_once_keeps_each_output_apart() -> None:
    """One encoder serves the worker's pool threads: a whole encode on another thread, run while
    this one is halfway through its own (held in a str() hook), leaves both outputs intact."""
    import threading

    inner_done = threading.Event()
    inner: list[bytes] = []

    def encode_inner() -> None:
        inner.append(nfp.dumps({"inner": [1, "b" * 500]}))
        inner_done.set()

    class Pause:
        def __str__(self) -> str:
            other = threading.Thread(target=encode_inner)
            other.start()
            assert inner_done.wait(timeout=10)  # the other encode ran inside this one
            other.join(timeout=10)
            return "paused"

    outer = nfp.dumps({"before": "a" * 500, "x": Pause(), "after": [2, 3]})

    assert json.loads(outer) == {"before": "a" * 500, "x": "paused", "after": [2, 3]}
    assert inner and json.loads(inner[0]) == {"inner": [1, "b" * 500]}


def test_loads_reads_what_dumps_writes_and_keeps_big_integers_exact() -> None:
    doc = {"big": 2**80, "neg": -(2**70), "f": 0.1, "s": "café\u0000", "n": None, "l": [True, False]}

    assert nfp.loads(nfp.dumps(doc)) == doc
    assert nfp.loads(b"9" * 400) == int("9" * 400)  # as the stdlib reads it, up to its 4,300 digits
    assert nfp.loads('{"a": 1}') == {"a": 1}  # str as well as bytes
    assert nfp.loads(memoryview(b"[1,2]")) == [1, 2]  # type: ignore[arg-type]  # a received frame's buffer


def test_loads_keeps_a_long_string_whole() -> None:
    data = "x" * (3 * 1024 * 1024) + "é"

    assert nfp.loads(nfp.dumps({"data": data})) == {"data": data}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"NaN",
        b"1e400",
        b"1" * 5000,
        b"\xef\xbb\xbf1",
        b"1 2",
        b"[1,]",
        b"{1:2}",
        b'"\\ud800"',
        b'"\xff"',
        b"[" * 100_000,
        b'{"a":' * 100_000,
    ],
)
def test_loads_refuses_what_is_not_json_with_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match="invalid JSON"):
        nfp.loads(raw)


@pytest.mark.parametrize("raw", [None, 12, ["[]"]])
def test_loads_refuses_what_is_not_bytes_or_str_with_a_value_error(raw: object) -> None:
    with pytest.raises(ValueError, match="invalid JSON"):
        nfp.loads(raw)  # type: ignore[arg-type]


# ---- property tests: any frames decode or raise ProtocolError --------------------------

# Frames a fuzzer should try at each position: the protocol's own tokens reach the deep branches.
TOKENS = st.sampled_from(
    [
        b"",
        nfp.CLIENT,
        nfp.WORKER,
        nfp.BROKER,
        *nfp.COMMAND_NAMES,
        *nfp.KNOWN_STATUSES,
        b"999",
        b"{}",
        b'{"push":true}',
        b"[1]",
        b"null",
        b"{",
        b"\xff",
        b"x" * (nfp.MAX_UUID_BYTES + 1),
        b"x" * (nfp.MAX_NAME_BYTES + 1),
    ]
)
ANY_FRAME = st.one_of(TOKENS, st.binary(max_size=32))
ODD_FRAME = st.one_of(st.text(max_size=4), st.integers(), st.none())

VALID = {
    "client": [
        nfp.client_request(nfp.POST, b"demo", b"any", b"job-1", POST_BODY),
        nfp.client_request(nfp.GET, b"demo", b'["w1"]', b"job-1", b"{}", b'{"ack":false}'),
        nfp.client_request(nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", b"", b""),
    ],
    "worker": [
        nfp.worker_control(nfp.READY, b"demo"),
        nfp.worker_control(nfp.KEEPALIVE, b"demo", b'{"queued":1}'),
        nfp.worker_reply(nfp.RESPONSE, b"c", b"job-1", nfp.ST_OK, b"{}"),
        nfp.worker_reply(nfp.EVENT, b"c", b"job-1", nfp.ST_OK, b"{}"),
    ],
    "broker_to_worker": [
        nfp.broker_job(b"w1", nfp.POST, b"c", b"job-1", POST_BODY)[1:],
        nfp.broker_control(b"w1", nfp.KEEPALIVE, b"demo")[1:],
        nfp.broker_control(b"w1", nfp.DISCONNECT, b"demo")[1:],
    ],
    "broker_to_client": [
        nfp.broker_reply(b"c", nfp.RESPONSE, b"demo", b"job-1", nfp.ST_DISPATCHED, b"{}")[1:],
        nfp.broker_reply(b"c", nfp.STREAM, b"demo", b"job-1", b"any", b"data")[1:],
        nfp.broker_reply(b"c", nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", nfp.ST_OK, b"")[1:],
    ],
}


@st.composite
def frames_near(draw: st.DrawFn, valid: list[list[bytes]]) -> list[Any]:
    """A valid message with some frames replaced, cut short or extended, or pure noise."""
    base = draw(st.sampled_from(valid))
    n = draw(st.one_of(st.just(len(base)), st.integers(0, 10)))  # mostly the right length
    frames: list[Any] = []
    for i in range(n):
        keep = i < len(base) and draw(st.integers(0, 5)) > 0  # mostly keep the valid frame
        frames.append(base[i] if keep else draw(ANY_FRAME))
    if draw(st.integers(0, 20)) == 0:
        frames.append(draw(ODD_FRAME))
    return frames


MAX_BYTES = st.integers(0, 4).flatmap(lambda k: st.integers(0, 300) if k == 0 else st.just(nfp.DEFAULT_MAX_FRAME_BYTES))
BOUNDED = settings(max_examples=300, deadline=None)


def decodes_or_raises_protocol_error(decoder: Any, frames: list[Any], max_bytes: int, types: tuple[type, ...]) -> None:
    try:
        msg = decoder(frames, max_bytes)
    except nfp.ProtocolError as exc:
        assert exc.reason in REASONS
    else:
        assert isinstance(msg, types)


@BOUNDED
@given(frames=frames_near(VALID["client"]), max_bytes=MAX_BYTES)
def test_any_frames_from_a_client_decode_or_raise_protocol_error(frames: list[Any], max_bytes: int) -> None:
    decodes_or_raises_protocol_error(nfp.decode_client, frames, max_bytes, (nfp.ClientRequest,))


@BOUNDED
@given(frames=frames_near(VALID["worker"]), max_bytes=MAX_BYTES)
def test_any_frames_from_a_worker_decode_or_raise_protocol_error(frames: list[Any], max_bytes: int) -> None:
    decodes_or_raises_protocol_error(nfp.decode_worker, frames, max_bytes, (nfp.WorkerControl, nfp.WorkerReply))


@BOUNDED
@given(frames=frames_near(VALID["broker_to_worker"]), max_bytes=MAX_BYTES)
def test_any_frames_from_the_broker_to_a_worker_decode_or_raise_protocol_error(
    frames: list[Any], max_bytes: int
) -> None:
    decodes_or_raises_protocol_error(nfp.decode_broker_to_worker, frames, max_bytes, (nfp.BrokerJob, nfp.BrokerControl))


@BOUNDED
@given(frames=frames_near(VALID["broker_to_client"]), max_bytes=MAX_BYTES)
def test_any_frames_from_the_broker_to_a_client_decode_or_raise_protocol_error(
    frames: list[Any], max_bytes: int
) -> None:
    decodes_or_raises_protocol_error(nfp.decode_broker_to_client, frames, max_bytes, (nfp.BrokerReply,))


@BOUNDED
@given(frames=st.lists(st.one_of(ANY_FRAME, ODD_FRAME), max_size=10))
def test_any_frames_at_all_never_escape_any_decoder_as_another_exception(frames: list[Any]) -> None:
    for decoder in (nfp.decode_client, nfp.decode_worker, nfp.decode_broker_to_worker, nfp.decode_broker_to_client):
        try:
            decoder(frames)
        except nfp.ProtocolError as exc:
            assert exc.reason in REASONS


def test_dumps_reserves_at_most_half_again_what_it_wrote() -> None:
    """Byte bounds count len(): what dumps hands back may reserve at most 1.5x that (msgspec's last
    growth step; the tail past len() is never written), never a growth buffer as orjson's was."""
    import tracemalloc

    data = "x" * 1_000_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = nfp.dumps({"w": {"result": data}})
        held = tracemalloc.get_traced_memory()[0] - before
        before = tracemalloc.get_traced_memory()[0]
        small = [nfp.dumps({"push": True, "task": "echo"}) for _ in range(1000)]
        held_small = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(out) > 1_000_000 and held <= len(out) * 1.5 + 1024  # orjson's: 13 MB
    assert len(small) == 1000 and held_small < 200_000  # orjson's untrimmed: 4 MB
