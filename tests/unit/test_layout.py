"""The package map holds: imports run one way, and nobody imports what it must not (docs/architecture.md).

Walks the source with `ast` (nothing is imported), counting every import that runs: at module
level and inside functions alike, since a lazy import that closes a circle is still a circle. Only
imports under `if TYPE_CHECKING:` are left out: they never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Each source folder and the name it installs under (pyproject.toml maps them into `zfab`).
FOLDERS = {"service": "zfab", "api": "zfab.api", "apiclient": "zfab.apiclient"}
PACKAGES = tuple(FOLDERS.values())

# The order the layers of api/ may import in: a package may import its own modules, any top-level
# base module of api/ and the packages after it in this list, never one before it.
API_LAYERS = tuple(f"zfab.api.{p}" for p in ("http", "schedules", "replicas", "store", "jobs"))
API_BASE = {f"zfab.api.{m}" for m in ("settings", "models", "errors", "fabric", "state")}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([FOLDERS[parts[0]], *parts[1:]])


def imports_of(path: Path, mod: str) -> set[str]:
    """Every module name an import in `path` may load (a `from x import y` counts x and x.y)."""
    tree = ast.parse(path.read_text(), str(path))
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for orelse in child.orelse:
                    visit(orelse)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    pkg = base[: len(base) - child.level + 1]
                    target = ".".join([*pkg, *([child.module] if child.module else [])])
                else:
                    target = child.module or ""
                if child.module or not child.level:
                    found.add(target)
                found.update(f"{target}.{a.name}" for a in child.names)
            visit(child)

    visit(tree)
    return found


def modules() -> dict[str, Path]:
    return {module_of(p): p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: {i for i in imports_of(p, m) if i in mods and i != m} for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> Iterator[list[str]]:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def dfs(n: str) -> Iterator[list[str]]:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            # A package's __init__ is imported by its own children as a side effect, not an edge back.
            if state.get(m) == 1 and not n.startswith(m + "."):
                yield [*stack[stack.index(m) :], m]
            elif m not in state:
                yield from dfs(m)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            yield from dfs(n)


def test_the_walker_sees_lazy_imports_and_skips_type_checking(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nfrom . import sib\nif TYPE_CHECKING:\n    from .typed import T\n"
        "def f():\n    from ..up import x\n"
    )
    assert imports_of(src, "pkg.sub.m") == {"typing", "typing.TYPE_CHECKING", "pkg.sub.sib", "pkg.up", "pkg.up.x"}
    assert list(cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}})) == [["a", "b", "c", "a"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    g = graph()
    found = [" -> ".join(c) for c in cycles(g) if package_of(c[0]) == package]
    assert not found, found


def package_of(mod: str) -> str:
    """The installed package a module belongs to: zfab.api.x is the API's, zfab.x the fabric's."""
    return next(p for p in sorted(PACKAGES, key=len, reverse=True) if mod == p or mod.startswith(p + "."))


def layer_of(mod: str) -> str | None:
    return next((layer for layer in API_LAYERS if mod == layer or mod.startswith(layer + ".")), None)


def test_api_layers_import_one_way() -> None:
    wrong = []
    for mod, targets in graph().items():
        if not mod.startswith("zfab.api."):
            continue
        here = layer_of(mod)
        for t in targets:
            there = layer_of(t)
            if here is None:
                # A base module of api/ (settings, models, errors, fabric, state) imports no layer at all.
                if mod in API_BASE and there is not None:
                    wrong.append(f"{mod} -> {t}")
            elif there is not None and there != here and API_LAYERS.index(there) < API_LAYERS.index(here):
                wrong.append(f"{mod} -> {t}")
            elif there is None and t.startswith("zfab.api.") and t not in API_BASE and here != "zfab.api.http":
                wrong.append(f"{mod} -> {t} (only the HTTP app imports the composition modules)")
    assert not wrong, wrong


def test_top_level_of_api_stays_small() -> None:
    flat = sorted(p.name for p in (ROOT / "api").glob("*.py"))
    assert len(flat) <= 10, flat


def test_the_job_layer_reaches_replicas_only_through_its_interface() -> None:
    g = graph()
    for mod, targets in g.items():
        if mod.startswith("zfab.api.jobs"):
            assert not {t for t in targets if t.startswith(("zfab.api.replicas", "zfab.api.store", "zfab.api.http"))}, (
                mod
            )


def test_api_never_imports_the_cli_commands_and_service_never_imports_api() -> None:
    for mod, path in modules().items():
        names = imports_of(path, mod)
        names = {n for n in names if n.startswith("zfab")}
        if package_of(mod) == "zfab.api":
            assert not {n for n in names if package_of(n) == "zfab.apiclient"}, mod
        if package_of(mod) == "zfab":
            assert not {n for n in names if package_of(n) != "zfab"}, mod


def test_the_cli_commands_do_not_load_the_server() -> None:
    for mod, path in modules().items():
        if package_of(mod) == "zfab.apiclient":
            names = imports_of(path, mod)
            heavy = {n for n in names if n.split(".")[0] in ("fastapi", "uvicorn", "pydantic")}
            heavy |= {n for n in names if n.startswith("zfab") and package_of(n) == "zfab.api"}
            assert not heavy, (mod, heavy)


def test_one_import_name_nothing_named_service_or_api_is_installed(tmp_path: Path) -> None:
    """Given a user project with its own service.py and api/ package, `from zfab import Client` and
    `zfab.api` still load ours, and `service`, `api` and `apiclient` are that project's (or nothing)."""
    import subprocess
    import sys

    (tmp_path / "service.py").write_text("MINE = 'service'\n")
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "__init__.py").write_text("MINE = 'api'\n")
    code = (
        "import importlib.util, service, api\n"
        "from zfab import Client, Worker, task, Job, Backoff\n"
        "import zfab.api, zfab.apiclient\n"
        "assert service.MINE == 'service' and api.MINE == 'api'\n"
        "assert importlib.util.find_spec('apiclient') is None\n"
        "print(zfab.api.__name__, Client.__module__.split('.')[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60, env={"PATH": ""}
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["zfab.api", "zfab"]


def test_no_two_test_files_share_a_name() -> None:
    """pytest imports test files by their base name (no __init__.py here): a second file of the same
    name in another folder stops the whole collection with "import file mismatch"."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py") if "norfab_suite" not in p.parts]
    assert sorted({n for n in names if names.count(n) > 1}) == []


@pytest.mark.parametrize(
    "module", ["core/protocol.py", "core/jsoncodec.py", "transport/wire.py", "transport/sending.py"]
)
def test_the_wire_modules_stay_under_450_lines(module: str) -> None:
    """Issue 40's size fact, for the modules of its speed item (the other scopes add theirs)."""
    lines = len((ROOT / "service" / module).read_text().splitlines())
    assert lines <= 450, f"service/{module} has {lines} lines"
