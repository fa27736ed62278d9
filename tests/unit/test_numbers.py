"""The number checks on the hot path (tuples, not `int | float`, since 79ea54b): what passes and what not."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from zfab.broker.admission import Refusal, read_job
from zfab.core import protocol as nfp
from zfab.core.payloads import read_post_body
from zfab.core.schemacheck import check


def _job(**flags: Any) -> Any:
    req = nfp.ClientRequest(nfp.POST, b"svc", b"any", b"u1", b"{}", flags)
    return read_job(b"client", req, now=100.0, seq=1, default_timeout=60.0)


@pytest.mark.parametrize("value", [2, 2.5])
def test_flag_seconds_take_ints_and_floats(value: float) -> None:
    job = _job(timeout=value, delay=value, notice=value)
    assert job.timeout == float(value)
    assert job.not_before == 100.0 + value
    assert job.notice == float(value)


@pytest.mark.parametrize("value", [True, "2", [2], math.nan, math.inf])
def test_flag_seconds_refuse_what_is_not_a_finite_number(value: Any) -> None:
    with pytest.raises(Refusal, match="timeout must be a number of seconds"):
        _job(timeout=value)


@pytest.mark.parametrize("value", [3, 0.5])
def test_a_post_body_timeout_takes_ints_and_floats(value: float) -> None:
    assert read_post_body(json.dumps({"task": "echo", "timeout": value}).encode()).timeout == value


@pytest.mark.parametrize("value", [True, "3", 0, -1])
def test_a_post_body_timeout_must_be_a_positive_number(value: Any) -> None:
    with pytest.raises(nfp.ProtocolError, match="timeout must be a positive number"):
        read_post_body(json.dumps({"task": "echo", "timeout": value}).encode())


def test_frames_must_be_bytes_like() -> None:
    good: list[Any] = [b"", nfp.CLIENT, nfp.POST, bytearray(b"svc"), memoryview(b"any"), b"u", b"{}"]
    assert nfp.decode_client(good).service == b"svc"
    with pytest.raises(nfp.ProtocolError) as exc:
        nfp.decode_client([b"", nfp.CLIENT, nfp.POST, "svc", b"any", b"u", b"{}"])  # type: ignore[list-item]
    assert exc.value.reason == "type"


def test_schema_bounds_apply_to_numbers_but_not_to_booleans() -> None:
    schema = {"type": "number", "minimum": 1}
    assert check(2, schema) is None
    assert check(0.5, schema) is not None
    assert check(0, {"type": "integer", "minimum": 1}) is not None
    assert check(True, {"type": "boolean", "minimum": 5}) is None
