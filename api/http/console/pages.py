"""The console's packaged files: page templates and static assets, read once and served from memory."""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from functools import cache
from html import escape
from importlib.resources import files
from string import Template

PACKAGE = "zfab.api.http.console"
# view -> (path under /ui, title, shown in the navigation)
VIEWS = {
    "jobs": ("", "Jobs", True),
    "job": ("/jobs", "Job", False),
    "queues": ("/queues", "Queues", True),
    "workers": ("/workers", "Workers", True),
    "schedules": ("/schedules", "Schedules", True),
}
# Views for a role's eyes only: (path, title, the action their link needs: hidden from the others).
ROLE_VIEWS = {"audit": ("/audit", "Audit", "audit")}
# The scripts of each view, in order: core.js first (every view script reads it), then what the view needs.
SCRIPTS = {
    "jobs": ("core.js", "forms.js", "jobs.js"),
    "job": ("core.js", "forms.js", "job.js"),
    "queues": ("core.js", "mmi.js"),
    "workers": ("core.js", "mmi.js"),
    "schedules": ("core.js", "forms.js", "schedules.js"),
    "audit": ("core.js", "audit.js"),
}
MEDIA_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    media_type: str
    version: str  # the first 12 hex digits of its sha256: named in its URL, and its ETag
    gzipped: bytes  # the same, compressed once (a script is a third of its size so)


@cache
def assets() -> dict[str, Asset]:
    """Every file of static/ the console serves, by name."""
    out: dict[str, Asset] = {}
    for entry in files(PACKAGE).joinpath("static").iterdir():
        suffix = entry.name[entry.name.rfind(".") :]
        if entry.is_file() and suffix in MEDIA_TYPES:
            body = entry.read_bytes()
            version = hashlib.sha256(body).hexdigest()[:12]
            out[entry.name] = Asset(body, MEDIA_TYPES[suffix], version, gzip.compress(body, 9, mtime=0))
    return out


@cache
def template(name: str) -> Template:
    return Template(files(PACKAGE).joinpath("templates", f"{name}.html").read_text(encoding="utf-8"))


def asset_url(root: str, name: str) -> str:
    return f"{root}/ui/static/{name}?v={assets()[name].version}"


def render(view: str, root: str, job: str = "") -> str:
    """The HTML shell of one view: layout, navigation and the view's empty skeleton (no data)."""
    root, job = escape(root), escape(job)
    nav = "".join(
        f'<a href="{root}/ui{path}"{" aria-current=page" if name == view else ""}>{title}</a>'
        for name, (path, title, shown) in VIEWS.items()
        if shown
    ) + "".join(
        f'<a href="{root}/ui{path}" data-needs="{needs}"{" aria-current=page" if name == view else ""}>{title}</a>'
        for name, (path, title, needs) in ROLE_VIEWS.items()
    )
    body = template(view).substitute(root=root, job=job, jobform=template("jobform").template)
    title = (VIEWS[view][1] if view in VIEWS else ROLE_VIEWS[view][1]) + (f" {job}" if job else "")
    return template("layout").substitute(
        title=title,
        view=view,
        root=root,
        job=job,
        nav=nav,
        body=body,
        css=asset_url(root, "console.css"),
        scripts="\n".join(f'<script defer src="{asset_url(root, name)}"></script>' for name in SCRIPTS[view]),
        icon=asset_url(root, "favicon.svg"),
    )
