"""Objects made on first use: most jobs never need their condition or cancel event, and a
threading.Condition costs more to make than the rest of a job."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_LOCK = threading.Lock()  # creation is rare: one lock for every lazily made attribute


def lazy(obj: Any, attr: str, make: Callable[[], T]) -> T:
    """`obj.<attr>`, made with `make()` the first time it is asked for (once, from any thread)."""
    value: T | None = getattr(obj, attr)
    if value is None:
        with _LOCK:
            value = getattr(obj, attr)
            if value is None:
                value = make()
                setattr(obj, attr, value)
    return value
