"""`mkdocs build --strict` builds the site offline (mkdocs.yml), and no page loads a script, style, font or
image from another host, at build or view time."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fabric import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
MKDOCS = Path(sys.executable).parent / "mkdocs"
EXTERNAL = re.compile(r"""<(?:script|link|img|source|iframe)\b[^>]*\b(?:src|href)=["']((?:https?:)?//[^"']+)""")


def test_the_site_builds_strict_and_offline_with_no_outside_asset(tmp_path: Path) -> None:
    if not MKDOCS.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("mkdocs is not installed: the docs extra is part of dev (pyproject.toml)")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    subprocess.run(["bash", "tools/typecheck-tree.sh"], cwd=ROOT, check=True, timeout=60)
    # Offline: a proxy that refuses everything, so a build that fetches anything fails
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    site = tmp_path / "site"
    r = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    pages = list(site.rglob("*.html"))
    assert len(pages) > 30
    outside = {(p.relative_to(site).as_posix(), m) for p in pages for m in EXTERNAL.findall(p.read_text())}
    assert not outside, sorted(outside)[:10]
    for css in site.rglob("*.css"):
        assert not re.search(r"@import\s+url\(\s*['\"]?https?:", css.read_text(errors="replace")), css
    for name in (
        "getting-started",
        "why",
        "coming-from/celery",
        "coming-from/norfab",
        "reference/limits",
        "reference/settings",
        "reference/cli",
        "reference/rest",
        "reference/python",
        "changelog",
        "operations/troubleshooting",
        "kubernetes",
        "protocol",
    ):
        assert (site / name / "index.html").exists(), name
    python = (site / "reference" / "python" / "index.html").read_text()
    for name in ("Client", "JobFuture", "Worker", "task", "Job", "Backoff", "Subscriber", "BusyError"):
        assert f'id="zfab.{name}' in python or f"zfab.errors.{name}" in python, name
    shutil.rmtree(site)
