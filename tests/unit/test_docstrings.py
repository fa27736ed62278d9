"""The public face's docstrings say what each argument is, what comes back, what is raised, and show an
example (issue 43): every argument a docstring's Args section names is one the callable takes, every one it
takes is named, and each has an Example. They are written where the code is (the size limits of
tests/unit/test_layout.py count code, not docstrings), so what `help()` shows is what the source says."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import zfab
from zfab import Backoff, Client, Job, JobFuture, Subscriber, Worker, task

# The public face and its methods a user calls; each is checked for Args against its signature.
DOCUMENTED: list[tuple[str, Callable[..., Any]]] = [
    ("Client", Client),
    *[
        (f"Client.{name}", getattr(Client, name))
        for name in (
            "submit",
            "run_job",
            "recover",
            "subscribe",
            "mmi",
            "cancel",
            "events",
            "job_events",
            "send_input",
            "open_stream",
            "fetch_file",
        )
    ],
    ("JobFuture.result", JobFuture.result),
    ("Worker", Worker),
    ("Worker.stop", Worker.stop),
    ("task", task),
    ("Job.event", Job.event),
    ("Job.request_input", Job.request_input),
    ("Job.stream", Job.stream),
    ("Subscriber", Subscriber),
    ("Subscriber.start", Subscriber.start),
    ("Subscriber.get", Subscriber.get),
    ("Backoff", Backoff),
]
WITH_EXAMPLE = [
    Client,
    Client.submit,
    Client.run_job,
    JobFuture,
    Worker,
    task,
    Job,
    Job.check,
    Job.event,
    Backoff,
    Subscriber,
    zfab.ZfabError,
    zfab.JobError,
    zfab.NoWorkersError,
    zfab.BusyError,
    zfab.BadRequestError,
    zfab.JobTimeoutError,
    zfab.WorkerLostError,
    zfab.BrokerUnavailableError,
]


def args_section(doc: str) -> set[str]:
    m = re.search(r"^Args:\n((?:(?:    .*)?\n)+)", doc + "\n", re.M)
    return set(re.findall(r"^    (\*{0,2}\w+):", m.group(1), re.M)) if m else set()


def parameters(fn: Callable[..., Any]) -> set[str]:
    target = fn.__init__ if isinstance(fn, type) else fn  # type: ignore[misc]
    names = set()
    for p in inspect.signature(target).parameters.values():
        if p.name == "self":
            continue
        names.add(("**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else "") + p.name)
    return names


@pytest.mark.parametrize(("name", "fn"), DOCUMENTED, ids=[n for n, _ in DOCUMENTED])
def test_every_argument_is_documented_and_every_documented_one_is_real(name: str, fn: Callable[..., Any]) -> None:
    doc = inspect.getdoc(fn) or ""
    named = args_section(doc)
    params = parameters(fn)
    assert named, f"{name}: no Args section"
    assert not named - params, f"{name}: Args names {sorted(named - params)}, which it does not take"
    assert not params - named, f"{name}: Args does not name {sorted(params - named)}"


@pytest.mark.parametrize("obj", WITH_EXAMPLE, ids=lambda o: getattr(o, "__qualname__", str(o)))
def test_the_public_face_shows_an_example(obj: object) -> None:
    doc = inspect.getdoc(obj) or ""
    assert re.search(r"^Example:\n    ```python\n", doc, re.M), f"{obj}: no Example section with code"


def test_the_sections_are_in_the_source_where_the_code_is() -> None:
    """What `help()` and the Python reference show is the docstring in client.py and worker.py as written:
    nothing is appended at import, and no section is there twice."""
    for cls in (Client, Worker):
        tree = ast.parse(Path(inspect.getfile(cls)).read_text())
        (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
        methods = [f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
        written = {"": ast.get_docstring(node)} | {f.name: ast.get_docstring(f) for f in methods}
        for name, source_doc in written.items():
            loaded = (getattr(cls, name) if name else cls).__doc__
            assert (inspect.cleandoc(loaded) if loaded else None) == source_doc, (
                f"{cls.__name__}.{name}: its docstring is not the one its source has"
            )
    assert (Client.submit.__doc__ or "").count("Args:") == 1
    assert (Worker.__doc__ or "").count("Example:") == 1
