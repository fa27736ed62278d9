"""Every fenced Python and shell example of the README and docs/ runs here against one real stack (a broker,
two demo workers and the API on ephemeral ports), unless it says why not (tools/docs/examples.py): a wrong
example fails the suite.

The examples are written for `make run`'s addresses; the stack's own are put in their place. A shell
example runs in bash with `zfab` on the PATH and the "set them once" variables (docs/guides/index.md)
set; it fails when a command in it exits with anything but 0, 1 (a job that ended otherwise, a grep
that found nothing) or 3 (a job not finished within its wait): a usage mistake (2), a command not
found (127), a jq filter that does not fit the answer (5) or a refused connection (curl's 7) all fail.
A page's Python examples run in order in one interpreter, as a reader would paste them, so a later
one may use what an earlier one made; `client` is a started Client of the stack where a block uses
one it did not make, as the guides' fragments do. The public face's docstring examples (which the Python
reference shows) run too, each in a namespace of its own, unless DOCSTRING_NOT_RUN says why not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fabric import ROOT, Fabric, free_port, wait_for

sys.path.insert(0, str(ROOT / "tools" / "docs"))
from examples import Example, all_examples

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = all_examples()
RUN = [e for e in EXAMPLES if e.not_run is None]
BROKER, API = "tcp://127.0.0.1:5555", "http://127.0.0.1:8000"
ALLOWED_EXITS = {0, 1, 3}
BLOCK_TIMEOUT = 60.0

SHELL_PRELUDE = """\
set -o pipefail
API={api}; TOKEN=${{ZFAB_API_TOKEN:-none}}; AUTH="Authorization: Bearer $TOKEN"; JSON="Content-Type: application/json"
trap 'rc=$?; case $rc in 1|3) ;; *) echo "example failed: exit $rc from: $BASH_COMMAND" >&2; exit 99;; esac' ERR
"""

PYTHON_RUNNER = """\
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
ns = {{"__name__": "__docs__"}}
exec("from zfab import *", ns)  # the guides' fragments name zfab's classes without importing them
if {needs_client}:
    exec("client = Client(broker={broker!r}, name='docs').start()", ns)
for where, code in blocks:
    try:
        exec(compile(code, where, "exec"), ns)
    except BaseException:
        traceback.print_exc()
        print("example failed:", where, file=sys.stderr)
        sys.exit(99)
if "client" in ns and hasattr(ns["client"], "close"):
    ns["client"].close()
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    tmp = tmp_path_factory.mktemp("docs")
    f = Fabric(tmp, interval=0.5, multiplier=4)
    try:
        f.broker("broker")
        f.worker("w1", "demo")
        f.worker("w2", "demo")
        api_port = free_port()
        f.start("api", "api", "--port", str(api_port), env={"ZFAB_API_DB": ""})
        f.api = f"http://127.0.0.1:{api_port}"  # type: ignore[attr-defined]
        api = httpx.Client(base_url=f.api, timeout=10)  # type: ignore[attr-defined]
        wait_for(
            lambda: api.post("/jobs?wait=5", json={"service": "demo", "task": "echo"}).status_code == 200,
            30,
            what="a demo job through the API",
        )
        api.close()
        yield f
    finally:
        f.stop()


def localise(code: str, f: Fabric) -> str:
    return code.replace(BROKER, f.endpoint).replace(API, f.api)  # type: ignore[attr-defined]


def env_for(f: Fabric) -> dict[str, str]:
    env = dict(f.env)
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        ZFAB_API_URL=f.api,  # type: ignore[attr-defined]
        ZFAB_API_DB="",
        COLUMNS="120",
    )
    env.pop("ZFAB_API_TOKEN", None)
    return env


def test_every_example_runs_or_says_why_not() -> None:
    unmarked = [e.id for e in EXAMPLES if e.not_run is not None and len(e.not_run) < 10]
    assert not unmarked, f"examples marked not run without a reason: {unmarked}"
    assert len(RUN) >= 30, f"only {len(RUN)} examples run: most of the docs' examples should"


def need_shell_tools() -> None:
    missing = [tool for tool in ("bash", "curl", "jq") if shutil.which(tool) is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the docs' shell examples need {missing}: .ci/run installs them")
        pytest.skip(f"the docs' shell examples need {missing} (Debian packages of those names)")


@pytest.mark.parametrize("example", [e for e in RUN if e.lang == "sh"], ids=lambda e: e.id)
def test_shell_example(example: Example, stack: Fabric, tmp_path: Path) -> None:
    need_shell_tools()
    script = SHELL_PRELUDE.format(api=stack.api) + localise(example.code, stack)  # type: ignore[attr-defined]
    r = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env_for(stack),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode in ALLOWED_EXITS, (
        f"{example.id}: exit {r.returncode}\n--- stderr\n{r.stderr[-2000:]}\n--- stdout\n{r.stdout[-1000:]}"
    )
    assert "example failed" not in r.stderr, f"{example.id}:\n{r.stderr[-2000:]}"


def python_pages() -> list[str]:
    return sorted({e.page for e in RUN if e.lang == "python"})


@pytest.mark.parametrize("page", python_pages())
def test_python_examples_of_page(page: str, stack: Fabric, tmp_path: Path) -> None:
    blocks = [(e.id, localise(e.code, stack)) for e in RUN if e.lang == "python" and e.page == page]
    code = "\n".join(c for _, c in blocks)
    needs_client = "client." in code and "client =" not in code and "as client" not in code
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    runner = PYTHON_RUNNER.format(needs_client=needs_client, broker=stack.endpoint)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(runner), str(tmp_path / "blocks.json")],
        cwd=tmp_path,
        env=env_for(stack),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT * len(blocks),
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, f"{page}: exit {r.returncode}\n--- stderr\n{r.stderr[-3000:]}"


def test_a_wrong_example_fails(stack: Fabric, tmp_path: Path) -> None:
    """The runner catches what a wrong example does: a flag zfab does not have, a bad jq path."""
    need_shell_tools()
    for wrong in ("zfab run demo echo --no-such-flag", "curl -s $API/jobs/nope | jq '.title + 1'"):
        script = SHELL_PRELUDE.format(api=stack.api) + wrong + "\n"  # type: ignore[attr-defined]
        r = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=env_for(stack), capture_output=True, text=True, timeout=30
        )
        assert r.returncode not in ALLOWED_EXITS, f"{wrong!r} passed: {r.stderr}"


# The public face's docstring examples (the Python reference shows them): each runs against the stack,
# in a namespace of its own with `client` a started Client, unless it says here why not.
DOCSTRING_NOT_RUN = {
    "Client.subscribe": "iterates the events until they stop, and the stack has no event publisher",
    "Client.recover": "needs a job a restarted client lost (`uuid`)",
    "Client.job_events": "needs an earlier example's job (`fut`)",
    "Client.fetch_file": "needs a files worker",
    "Client.open_stream": "needs a files worker",
    "Worker.start": "a fragment: starts the class of the Worker example, which is not defined here",
    "Worker.stop": "a fragment: stops a worker made elsewhere",
    "Job.check": "a fragment of a task's body (`job`, `items`)",
    "Job.event": "a fragment of a task's body (`job`)",
    "Job.request_input": "a fragment of a task's body (`job`)",
    "Subscriber": "iterates the events until they stop, and the stack has no event publisher",
}
DOCSTRING_RUNNER = """\
import inspect, json, re, sys, time, traceback
import zfab
from zfab import *
from zfab.errors import *

FENCE = re.compile(r"^Example:\\n    ```python\\n(.*?)^    ```", re.S | re.M)
not_run = json.loads(sys.argv[1])
objects = {{}}
for name in ("Client", "JobFuture", "Worker", "Job", "Backoff", "Subscriber", "task", *zfab.errors.__all__):
    obj = getattr(zfab, name)
    objects[name] = obj
    for attr in vars(obj) if isinstance(obj, type) else ():
        if not attr.startswith("_") and callable(getattr(obj, attr, None)):
            objects[f"{{name}}.{{attr}}"] = getattr(obj, attr)
client = Client(broker={broker!r}, name="docstrings").start()
ran = 0
for where, obj in objects.items():
    for m in FENCE.finditer(inspect.getdoc(obj) or ""):
        if where in not_run:
            continue
        code = "\\n".join(line[4:] for line in m.group(1).splitlines()).replace({default!r}, {broker!r})
        try:
            began = time.monotonic()
            exec(compile(code, where, "exec"), {{"__name__": "__docs__", **globals()}})
            print(f"{{where}}: {{time.monotonic() - began:.2f}} s", file=sys.stderr)  # which one is slow
            ran += 1
        except BaseException:
            traceback.print_exc()
            print("example failed:", where, file=sys.stderr)
            sys.exit(99)
client.close()
print("ran", ran)
"""


def test_the_public_faces_docstring_examples_run(stack: Fabric, tmp_path: Path) -> None:
    runner = DOCSTRING_RUNNER.format(broker=stack.endpoint, default=BROKER)
    r = subprocess.run(
        [sys.executable, "-c", runner, json.dumps(DOCSTRING_NOT_RUN)],
        cwd=tmp_path,
        env=env_for(stack),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split("ran ")[-1]) >= 15, r.stdout
