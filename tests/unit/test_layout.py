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
PACKAGES = ("service", "api", "apiclient")

# The order the layers of api/ may import in: a package may import its own modules, any top-level
# base module of api/ and the packages after it in this list, never one before it.
API_LAYERS = ("api.http", "api.schedules", "api.replicas", "api.store", "api.jobs")
API_BASE = {"api.settings", "api.models", "api.errors", "api.fabric", "api.state"}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


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
    return {module_of(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


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
    found = [" -> ".join(c) for c in cycles(g) if c[0].split(".")[0] == package]
    assert not found, found


def layer_of(mod: str) -> str | None:
    return next((layer for layer in API_LAYERS if mod == layer or mod.startswith(layer + ".")), None)


def test_api_layers_import_one_way() -> None:
    wrong = []
    for mod, targets in graph().items():
        if not mod.startswith("api."):
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
            elif there is None and t.startswith("api.") and t not in API_BASE and here != "api.http":
                wrong.append(f"{mod} -> {t} (only the HTTP app imports the composition modules)")
    assert not wrong, wrong


def test_top_level_of_api_stays_small() -> None:
    flat = sorted(p.name for p in (ROOT / "api").glob("*.py"))
    assert len(flat) <= 10, flat


def test_the_job_layer_reaches_replicas_only_through_its_interface() -> None:
    g = graph()
    for mod, targets in g.items():
        if mod.startswith("api.jobs"):
            assert not {t for t in targets if t.startswith(("api.replicas", "api.store", "api.http"))}, mod


def test_api_never_imports_the_cli_commands_and_service_never_imports_api() -> None:
    for mod, path in modules().items():
        names = imports_of(path, mod)
        if mod == "api" or mod.startswith("api."):
            assert not {n for n in names if n == "apiclient" or n.startswith("apiclient.")}, mod
        if mod.startswith("service"):
            assert not {n for n in names if n.split(".")[0] in ("api", "apiclient")}, mod


def test_the_cli_commands_do_not_load_the_server() -> None:
    for mod, path in modules().items():
        if mod.startswith("apiclient"):
            heavy = {n for n in imports_of(path, mod) if n.split(".")[0] in ("api", "fastapi", "uvicorn", "pydantic")}
            assert not heavy, (mod, heavy)
