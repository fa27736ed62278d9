"""The fenced Python and shell examples of the README and docs/: which run in the test suite and which do
not, and why. One place for the rule, read by tests/integration/test_doc_examples.py (which runs them
against one shared stack) and tests/unit/test_readme_examples.py (which parses their zfab commands).

A block runs unless the line before its fence says why not, as an HTML comment the site does not show:

    <!-- not run: starts a stack in the foreground until Ctrl-C -->

or its page is in NOT_RUN_PAGES below, with the reason for the whole page (pages other work owns, whose
examples need what a test here does not have: a Docker engine, a cluster, a PostgreSQL server).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LANGS = {"python": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
FENCE = re.compile(
    r"(?:<!--\s*not run:(?P<reason>[^>]*?)-->[ \t]*\n)?"  # the reason it does not run, if it says one
    r"^(?P<indent>[ \t]*)```(?P<lang>\w+)[ \t]*\n(?P<code>.*?)^(?P=indent)```",
    re.S | re.M,
)
NOT_RUN_PAGES = {
    "docs/architecture.md": "a map of the code for contributors; its blocks are layouts, not commands",
    "docs/benchmarks.md": "benchmarks take minutes each and belong to `make bench`, not to the suite",
    "docs/contributors/performance.md": "benchmark commands: minutes each, `make bench`",
    "docs/contributors/benchmark-log.md": "benchmark commands and their history: minutes each, `make bench`",
    "docs/contributors/development.md": "the suite, lint and benchmarks themselves",
    "docs/broker-memory.md": "a measurement write-up; its flood runs in tests/integration/test_broker_flood.py",
    "docs/deploy.md": "Docker Compose on a Docker engine and hosts of their own (tests/compose runs the stack)",
    "docs/operations/compose.md": "Docker Compose on a Docker engine (tests/compose runs the stack)",
    "docs/kubernetes.md": "a Kubernetes cluster (tests/integration/test_kubernetes.py renders and validates it)",
    "docs/postgres.md": "a PostgreSQL server (tests/integration/test_postgres*.py start one)",
    "docs/operations/postgres-replicas.md": "a PostgreSQL server and API replicas on hosts of their own",
    "docs/protocol.md": "wire-level sketches; the protocol's tests are tests/unit/test_protocol*.py",
    "docs/console.md": "a browser (tests/integration/test_console.py drives one)",
}


@dataclass(frozen=True, slots=True)
class Example:
    page: str  # relative to the repository, e.g. docs/guides/retries.md
    line: int  # of its opening fence
    lang: str  # "python" or "sh"
    code: str
    not_run: str | None  # why it does not run, or None when it runs

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples(page: Path) -> list[Example]:
    text = page.read_text()
    rel = page.relative_to(ROOT).as_posix()
    out = []
    for m in FENCE.finditer(text):
        lang = LANGS.get(m.group("lang"))
        if lang is None:
            continue
        indent = len(m.group("indent"))
        code = "\n".join(line[indent:] for line in m.group("code").splitlines()) + "\n"
        reason = m.group("reason")
        not_run = reason.strip() if reason is not None else NOT_RUN_PAGES.get(rel)
        line = text.count("\n", 0, m.start("lang")) + 1
        out.append(Example(rel, line, lang, code, not_run))
    return out


def all_examples() -> list[Example]:
    return [e for page in pages() for e in examples(page)]
