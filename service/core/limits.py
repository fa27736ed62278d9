"""Rate and concurrency limits of a task, as declared or set: the rule and its spelling. Pure.

`rate_limit="5/s"` lets at most 5 of the task's jobs start each second, spaced evenly (one every
0.2 s: no burst); `concurrency=2` lets at most 2 be dispatched at once; `limit_key="site"` applies
both to each value of the job's `site` argument on its own. The broker enforces a rule across all
the service's workers (service/broker/limits.py): a job over it waits in the queue, never fails.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .schemacheck import is_number

PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/|per\s+)\s*([a-z]+?)s?\s*$")
MAX_CONCURRENCY = 1_000_000
MAX_RATE = 1_000_000.0  # jobs per second
MAX_KEY_NAME = 128


def parse_rate(text: str) -> float:
    """Jobs per second of a rate such as `5/s`, `100/m`, `10 per minute`, `1/h`. ValueError otherwise."""
    m = _RATE.match(text.lower()) if isinstance(text, str) else None
    if m is None or m.group(2) not in PERIODS:
        raise ValueError(f"a rate looks like '5/s', '100/m' or '10 per hour', not {text!r}")
    count = float(m.group(1))
    per_second = count / PERIODS[m.group(2)]
    if not 0 < per_second <= MAX_RATE:
        raise ValueError(f"rate {text!r} must be more than 0 and at most {MAX_RATE:g} a second")
    return per_second


@dataclass(frozen=True, slots=True)
class Rule:
    """At most `rate` jobs a second start (evenly spaced), at most `concurrency` at once; per value
    of the `key` argument when given. `text` is the rate as written."""

    rate: float | None = None
    concurrency: int | None = None
    key: str | None = None
    text: str | None = None

    @property
    def interval(self) -> float:
        """Seconds between two starts (0 without a rate)."""
        return 1.0 / self.rate if self.rate else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"rate_limit": self.text, "concurrency": self.concurrency, "limit_key": self.key}


def read_rule(decl: Any) -> Rule | None:
    """The rule a declaration (`x-zfab`) or a set_limit request spells: `rate_limit`, `concurrency`,
    `limit_key`; None when it limits nothing. ValueError naming what is wrong."""
    if not isinstance(decl, dict):
        return None
    text, conc, key = decl.get("rate_limit"), decl.get("concurrency"), decl.get("limit_key")
    rate = parse_rate(text) if text is not None else None
    if conc is not None:
        if not is_number(conc) or (isinstance(conc, float) and not conc.is_integer()):
            raise ValueError(f"concurrency must be a whole number, not {conc!r}")
        if not 1 <= conc <= MAX_CONCURRENCY or not math.isfinite(conc):
            raise ValueError(f"concurrency must be from 1 to {MAX_CONCURRENCY}, not {conc!r}")
        conc = int(conc)
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_NAME):
        raise ValueError(f"limit_key must be an argument's name, not {key!r}")
    if rate is None and conc is None:
        if key is not None:
            raise ValueError("limit_key without rate_limit or concurrency limits nothing")
        return None
    return Rule(rate=rate, concurrency=conc, key=key, text=text.strip() if isinstance(text, str) else None)
