"""The reference pages of the documentation site, generated from the code as the site builds (hooks.py),
so they cannot drift from it: every setting (the pydantic-settings classes), every environment variable
the code reads, every CLI command and flag (the argument parser), the REST API (the app's OpenAPI
schema) and every bound (the settings that are bounds, and the fixed ones).

tests/unit/test_docs_reference.py checks that each page names everything it should.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The folders and the import names they install as (setup.py's mapping)
PACKAGES = {"service": "zfab", "api": "zfab.api", "apiclient": "zfab.apiclient"}
ENV_NAME = re.compile(r"\bZFAB_[A-Z0-9_]*[A-Z0-9]\b")

# ZFAB_ variables the code reads outside the settings classes: what each means. A variable missing here
# is still listed (with the files that read it); tests/unit/test_docs_reference.py asks for a line.
OTHER_VARIABLES = {
    "ZFAB_API_URL": "The API the `zfab submit`, `status`, `result`, `jobs`, `schedules` ... commands talk to "
    "(`--api`; default `http://127.0.0.1:8000`)",
    "ZFAB_API_TOKEN": "The bearer token those commands send (`--token`); an API with `ZFAB_API_TOKENS` "
    "set answers 401 without one",
}

# Bounds fixed in the code: module-level constants named like one (MAX_..., ..._BYTES, ...), read from the
# source with the comment that says what each bounds, their values from the imported module.
CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]*)\s*(?::[^=]+)?=\s*([^#\n]+?)\s*(?:#\s*(.*))?$", re.M)
CONSTANT_NAME = re.compile(r"(^|_)MAX(_|$)|_BYTES$|_SIZE$|_LIMIT$|_WINDOW$|^MAX_|_CAP$")
BOUND_WORDS = re.compile(
    r"(size|bytes|max_|_hwm|queue|history|count|concurrency|share|buffer|streams|credits|"
    r"prefetch|retention|subscriptions|wait_max|timeout|grace|seconds)"
)


def _package_module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    folder, *rest = rel.parts
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([PACKAGES[folder], *rest])


def source_files() -> Iterator[Path]:
    for folder in PACKAGES:
        yield from sorted((ROOT / folder).rglob("*.py"))


def settings_classes() -> list[type[Any]]:
    """Every pydantic-settings class in the code, found by reading the source (so a new one joins by itself),
    base classes first."""
    from pydantic_settings import BaseSettings

    found: list[type[Any]] = []
    for path in source_files():
        text = path.read_text()
        if "Settings" not in text:
            continue
        for name in re.findall(r"^class (\w+)\(", text, re.M):
            module = importlib.import_module(_package_module(path))
            cls = getattr(module, name, None)
            if isinstance(cls, type) and issubclass(cls, BaseSettings) and cls not in found:
                found.append(cls)
    return sorted(found, key=lambda c: len(c.__mro__))


def env_prefix(cls: type[Any]) -> str:
    return str(cls.model_config.get("env_prefix", "")).upper()


def own_fields(cls: type[Any]) -> dict[str, Any]:
    """The fields a class adds to its bases (ApiSettings has every field of Settings too)."""
    inherited: set[str] = set()
    for base in cls.__mro__[1:]:
        inherited |= set(getattr(base, "model_fields", {}))
    return {k: v for k, v in cls.model_fields.items() if k not in inherited}


def variables_read() -> dict[str, list[str]]:
    """Every ZFAB_ name the code mentions, and the files that do (a prefix such as `ZFAB_` alone is none)."""
    names: dict[str, list[str]] = {}
    for path in source_files():
        for name in set(ENV_NAME.findall(path.read_text())):
            names.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    return names


def default_text(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        home = str(Path.home())
        return f"`{str(value).replace(home, '~')}` (computed)"
    if field.default is None:
        return "unset"
    if isinstance(field.default, bool):
        return f"`{str(field.default).lower()}`"
    return f"`{field.default}`"


def bounds_text(field: Any) -> str:
    found = []
    for meta in field.metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def type_text(field: Any) -> str:
    text = str(field.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
    return text.replace("NoneType", "None").replace(" | ", " or ")


def flags_by_dest() -> dict[str, str]:
    """Each settings field a flag sets (a flag's dest is the field's name): the flag, and the commands that
    have it (`--broker` on every command that talks to the broker)."""
    found: dict[str, dict[str, list[str]]] = {}
    for path, parser in commands():
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                long = max(action.option_strings, key=len)
                found.setdefault(action.dest, {}).setdefault(long, []).append(path.removeprefix("zfab "))
    out = {}
    for dest, flags in found.items():
        out[dest] = "; ".join(
            f"`{flag}`: " + (f"{len(cmds)} commands" if len(cmds) > 4 else ", ".join(f"`zfab {c}`" for c in cmds))
            for flag, cmds in flags.items()
        )
    return out


def cell(text: str) -> str:
    """Text for a table cell: one line, its pipes escaped, and `<...>` shown rather than taken for HTML."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def settings_page() -> str:
    flags = flags_by_dest()
    lines = [
        "# Settings",
        "",
        "Generated from the settings classes as the site builds (`tools/docs/reference.py`): every field is an",
        "environment variable, its name the class's prefix and the field's name in upper case. A flag, where a",
        "command has one, wins over the variable. Operations > Configuration says more about each.",
        "",
    ]
    classes = settings_classes()
    for cls in classes:
        fields = own_fields(cls)
        if not fields:
            continue
        qual = f"{_import_name(cls)}"
        lines += [f"## `{qual}`", "", cell((cls.__doc__ or "").strip()), ""]
        if len(cls.__mro__) > 2 and cls.__mro__[1] in classes:
            lines += [f"It reads every variable of `{_import_name(cls.__mro__[1])}` too, and these:", ""]
        lines += ["| variable | type | default | bounds | description | flags |", "|---|---|---|---|---|---|"]
        for name, field in fields.items():
            var = env_prefix(cls) + name.upper()
            lines.append(
                f"| `{var}` | `{cell(type_text(field))}` | {default_text(field)} | {bounds_text(field)} | "
                f"{cell(field.description or '')} | {flags.get(name, '')} |"
            )
        lines.append("")
    known = {env_prefix(c) + n.upper() for c in classes for n in c.model_fields}
    other = {k: v for k, v in variables_read().items() if k not in known}
    lines += [
        "## Other environment variables",
        "",
        "Read by the code outside the settings classes.",
        "",
        "| variable | meaning | read in |",
        "|---|---|---|",
    ]
    for name, files in sorted(other.items()):
        where = ", ".join(f"`{f}`" for f in sorted(files))
        lines.append(f"| `{name}` | {cell(OTHER_VARIABLES.get(name, ''))} | {where} |")
    return "\n".join(lines) + "\n"


def _import_name(cls: type[Any]) -> str:
    module = cls.__module__
    top = importlib.import_module(module.rsplit(".", 1)[0]) if "." in module else None
    if top is not None and getattr(top, cls.__name__, None) is cls:
        module = top.__name__
    return f"{module}.{cls.__name__}"


def parser() -> argparse.ArgumentParser:
    from zfab.cli import build_parser

    return build_parser()


def commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """`zfab` and each subcommand (and theirs), depth first, as (its command line, its parser)."""
    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(path: str, p: argparse.ArgumentParser) -> None:
        out.append((path, p))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(f"{path} {name}", child)

    walk("zfab", parser())
    return out


def _helps(p: argparse.ArgumentParser) -> dict[str, str]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def cli_page() -> str:
    os.environ.setdefault("COLUMNS", "100")
    lines = [
        "# CLI",
        "",
        "Generated from `zfab`'s argument parser as the site builds (`tools/docs/reference.py`), commands that",
        "installed packages add included (`zfab api`, the job commands). Every flag that names a setting is",
        "also its environment variable (Reference > Settings); a flag wins.",
        "",
    ]
    helps: dict[str, str] = {}
    for path, p in commands():
        for name, text in _helps(p).items():
            helps[f"{path} {name}"] = text
    lines += ["| command | what it does |", "|---|---|"]
    lines += [f"| [`{path}`](#{_anchor(path)}) | {cell(text)} |" for path, text in helps.items()]
    lines.append("")
    for path, p in commands():
        depth = path.count(" ")
        heading = "#" * min(2 + max(depth - 1, 0), 4)
        if depth:
            lines += [f"{heading} `{path}`", "", cell(helps.get(path, "")), ""]
        usage = p.format_usage().replace("usage: ", "").strip()
        lines += ["```text", usage, "```", ""]
        rows = []
        formatter = p._get_formatter()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            names = ", ".join(action.option_strings) or action.dest
            text = formatter._expand_help(action) if action.help else ""
            default = "" if action.default in (None, argparse.SUPPRESS, False) else f"`{action.default}`"
            kind = "flag" if action.option_strings else "argument"
            if isinstance(action, argparse._VersionAction):
                text = "print the version and exit"
            rows.append(f"| `{names}` | {kind} | {default} | {cell(text)} |")
        if rows:
            lines += ["| flag | kind | default | description |", "|---|---|---|---|", *rows, ""]
    return "\n".join(lines) + "\n"


def _anchor(path: str) -> str:
    """The id the toc extension gives a heading `` `zfab schedules add` ``."""
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def openapi() -> dict[str, Any]:
    from zfab.api.http.app import create_app
    from zfab.api.settings import ApiSettings

    app = create_app(ApiSettings(api_db=""))
    schema: dict[str, Any] = app.openapi()
    return schema


def rest_page() -> str:
    schema = openapi()
    lines = [
        "# REST API",
        "",
        f"Generated from the app's OpenAPI schema as the site builds (`tools/docs/reference.py`; "
        f"{schema['info'].get('title', '')} {schema['info'].get('version', '')}).",
        "A running API serves the same schema at `/openapi.json`, and Swagger UI at `/docs` (packaged: nothing",
        "fetched from elsewhere). Errors are `application/problem+json` with a `detail` that says why.",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for route, methods in schema.get("paths", {}).items():
        for method, op in methods.items():
            if not isinstance(op, dict):
                continue
            tag = (op.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((route, method.upper(), op))
    for tag, ops in by_tag.items():
        lines += [f"## {tag}", ""]
        for route, method, op in ops:
            lines += [f"### `{method} {route}`", ""]
            if op.get("summary"):
                lines += [cell(op["summary"]), ""]
            if op.get("description"):
                lines += [_demote(op["description"]), ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
                for prm in params:
                    sch = prm.get("schema", {})
                    typ = sch.get("type") or "/".join(s.get("type", "") for s in sch.get("anyOf", []))
                    lines.append(
                        f"| `{prm['name']}` | {prm['in']} | {typ} | {'yes' if prm.get('required') else ''} | "
                        f"{cell(prm.get('description', '') or sch.get('description', ''))} |"
                    )
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for ctype, spec in body.items():
                ref = spec.get("schema", {}).get("$ref", "")
                name = ref.rsplit("/", 1)[-1]
                lines += [f"Body: `{ctype}`" + (f", schema [`{name}`](#{_anchor(name)})" if ref else ""), ""]
            answers = [f"- `{code}` {cell(r.get('description', ''))}" for code, r in op.get("responses", {}).items()]
            if answers:
                lines += ["Answers:", "", *answers, ""]
    comps = schema.get("components", {}).get("schemas", {})
    if comps:
        lines += ["## Schemas", ""]
        for name, sch in sorted(comps.items()):
            lines += [f"### `{name}`", ""]
            if sch.get("description"):
                lines += [_demote(sch["description"]), ""]
            props = sch.get("properties", {})
            if props:
                required = set(sch.get("required", []))
                lines += ["| field | type | required | description |", "|---|---|---|---|"]
                for pname, p in props.items():
                    typ = (
                        p.get("type")
                        or "/".join(s.get("type", s.get("$ref", "").rsplit("/", 1)[-1]) for s in p.get("anyOf", []))
                        or p.get("$ref", "").rsplit("/", 1)[-1]
                    )
                    lines.append(
                        f"| `{pname}` | {typ} | {'yes' if pname in required else ''} | "
                        f"{cell(p.get('description', ''))} |"
                    )
                lines.append("")
    return "\n".join(lines) + "\n"


def _demote(text: str) -> str:
    """An operation's description as a paragraph of this page: its own headings would break the outline."""
    return "\n".join(re.sub(r"^#+\s*", "", line) for line in text.strip().splitlines())


def limits_page() -> str:
    lines = [
        "# Limits",
        "",
        "Nothing in zfab is unbounded: every queue, buffer, cache and table has a bound, its depth is a metric",
        "(Operations > Metrics), and a full one answers busy (`BusyError`, HTTP 503) or drops the oldest, as",
        "its row says. Generated as the site builds (`tools/docs/reference.py`): the settings that are bounds,",
        "from the settings classes, then the bounds fixed in the code.",
        "",
        "## Bounds you can set",
        "",
        "| bound | default | setting | what it bounds |",
        "|---|---|---|---|",
    ]
    for cls in settings_classes():
        for name, field in own_fields(cls).items():
            if not BOUND_WORDS.search(name) or field.annotation is bool:
                continue
            var = env_prefix(cls) + name.upper()
            lines.append(
                f"| {name.replace('_', ' ')} | {default_text(field)} | `{var}` | {cell(field.description or '')} |"
            )
    lines += [
        "",
        "## Bounds fixed in the code",
        "",
        "| constant | value | where | what it bounds |",
        "|---|---|---|---|",
    ]
    for module, name, value, why in fixed_bounds():
        lines.append(f"| `{name}` | `{value}` | `{module}` | {cell(why)} |")
    return "\n".join(lines) + "\n"


def fixed_bounds() -> list[tuple[str, str, Any, str]]:
    """(module, constant, value, the comment beside or above it) for each bound-like constant of the code."""
    out = []
    for path in source_files():
        text = path.read_text()
        lines = text.splitlines()
        for m in CONSTANT.finditer(text):
            name, expr, comment = m.group(1), m.group(2), m.group(3) or ""
            if not CONSTANT_NAME.search(name) or ".size" in expr:
                continue
            row = text.count("\n", 0, m.end())
            below = lines[row + 1].strip() if row + 1 < len(lines) else ""
            if not comment and below.startswith('"""'):  # an attribute docstring
                comment = below.strip('"')
            if not comment:  # the comment block right above it, whole
                block: list[str] = []
                row = text.count("\n", 0, m.start()) - 1
                while row >= 0 and lines[row].strip().startswith("#"):
                    block.insert(0, lines[row].strip().lstrip("#").strip())
                    row -= 1
                comment = " ".join(block)
            module = _package_module(path)
            value = getattr(importlib.import_module(module), name, expr)
            out.append((module, name, value, comment))
    return out


def alerts_page() -> str:
    """Every alert rule (deploy/prometheus/rules) and every dashboard panel (deploy/grafana/dashboards)."""
    import json

    import yaml

    lines = [
        "# Dashboards and alerts",
        "",
        "Generated from `deploy/prometheus/rules/` and `deploy/grafana/dashboards/` as the site builds",
        "(`tools/docs/reference.py`): what ships is what is listed. Docker Compose loads both (Prometheus",
        "on :9090, Grafana on :3000); on Kubernetes, give your Prometheus the rules file and import the",
        "dashboard. `promtool test rules deploy/prometheus/tests/*.yml` tests the rules, and the metrics",
        "they read are in [Metrics](metrics.md).",
        "",
        "## Alert rules",
        "",
        "Severity `critical`: jobs cannot run now (page); `warning`: jobs run but slower, fail, or will",
        "soon be refused (ticket). Each rule's description names what to look at first.",
        "",
    ]
    for path in sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text()).get("groups", []):
            lines += [
                f"### {group['name']}",
                "",
                "| alert | for | severity | when | look at |",
                "|---|---|---|---|---|",
            ]
            for rule in group.get("rules", []):
                if "alert" not in rule:
                    continue
                notes = rule.get("annotations", {})
                lines.append(
                    f"| `{rule['alert']}` | {rule.get('for', '')} | {rule.get('labels', {}).get('severity', '')} | "
                    f"{cell(notes.get('summary', ''))} | {cell(notes.get('description', ''))} |"
                )
            lines.append("")
    lines += ["## Dashboards", ""]
    for path in sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        lines += [f"### {board.get('title', path.stem)}", "", f"`{path.relative_to(ROOT).as_posix()}`", ""]
        lines += ["| panel | shows |", "|---|---|"]
        for panel in board.get("panels", []):
            if panel.get("type") == "row":
                lines.append(f"| **{cell(panel.get('title', ''))}** | |")
            else:
                lines.append(f"| {cell(panel.get('title', ''))} | {cell(panel.get('description', ''))} |")
        lines.append("")
    return "\n".join(lines) + "\n"


PAGES = {
    "reference/settings.md": settings_page,
    "reference/cli.md": cli_page,
    "reference/rest.md": rest_page,
    "reference/limits.md": limits_page,
    "operations/dashboards-alerts.md": alerts_page,
}
