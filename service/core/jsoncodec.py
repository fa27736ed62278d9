"""JSON as NFP carries it: one encoder and one decoder (msgspec) for every frame's JSON, every thread.

Pure code, like core/protocol.py, which re-exports `dumps` and `loads` (callers write nfp.dumps).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec


def _as_json(obj: Any) -> Any:
    """What the encoder cannot write itself. A True, False or None dict key takes JSON's
    spelling, as the stdlib and orjson write it (msgspec would give its str(), "True"); an int
    or float subclass is its number; anything else is its str()."""
    if obj is None:  # only ever a dict key here: msgspec writes None, True and False values itself
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    return str(obj)


decode = msgspec.json.Decoder().decode  # raw: raises msgspec.DecodeError (loads() says ValueError)
_encode = msgspec.json.Encoder(enc_hook=_as_json).encode


def dumps(obj: Any) -> bytes:
    """JSON as NFP carries it: compact UTF-8; what neither JSON nor msgspec has a type for becomes its str().

    msgspec writes it (C): 0.2-0.3 µs for a job's flags or result entry, and a 10 MB string in
    4 ms, against orjson's 0.5-0.7 µs and 8.6 ms once its output was copied to size. That copy
    is gone: orjson returned its whole growth buffer (133 MB of address space for a 10 MB
    string), msgspec at most 1.5 times what it wrote, and the tail past len() is never
    written. Its own types: a set is an array, bytes are base64, a UTC datetime ends in "Z".
    What it refuses (a cycle, nesting past the interpreter's recursion limit) goes through the
    stdlib, which names a cycle; what the stdlib refuses raises as it always did. One encoder
    serves every thread (the worker's pool threads encode results at once)."""
    try:
        return _encode(obj)
    except (TypeError, msgspec.EncodeError, RecursionError):
        return json.dumps(obj, separators=(",", ":"), default=str).encode()


def loads(raw: bytes | memoryview | str) -> Any:
    """Parse JSON (bytes in, no decode step). Raises ValueError, nested-too-deep included.

    msgspec's decoder, not orjson's: the same answers for JSON, except that integers past
    64 bits stay exact ints, as the stdlib reads them (up to its 4,300 digits, its guard
    against quadratic parsing; orjson made them floats and refused past 1e308), and three
    times faster on long strings: a 10 MB string in 4-6 ms against 15-19,
    twice per 10 MB job in the worker and twice in its client. Small bodies are no slower
    (0.26 against 0.63 µs for a job's kwargs)."""
    try:
        return decode(raw)
    except msgspec.DecodeError as exc:  # (its ValidationError, a number out of range, is one too)
        raise ValueError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise ValueError("invalid JSON: nested too deep") from None
    except TypeError as exc:  # not bytes or str: orjson said so with a ValueError too
        raise ValueError(f"invalid JSON: {exc}") from None
