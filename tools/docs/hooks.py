"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages of tools/docs/reference.py join the site as it
builds, generated from the code each time, so no generated page is kept in the repository to go stale."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference
from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    for uri, page in reference.PAGES.items():
        files.append(File.generated(config, uri, content=page()))
    return files
