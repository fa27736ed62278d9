"""A griffe extension (mkdocs.yml): the sections that service/client/clientdocs.py and
service/worker/workerdocs.py append to Client's and Worker's docstrings at import are appended to what
griffe reads from the source too, so the Python reference shows them without importing the whole package
(dynamic inspection would import every module, `zfab.cli.__main__` among them)."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe

# The class (as griffe names it inside the package) and the module whose SECTIONS it gets
APPENDED = {"client.client.Client": "zfab.client.clientdocs", "worker.worker.Worker": "zfab.worker.workerdocs"}


class AppendedSections(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "zfab":
            return
        for path, module in APPENDED.items():
            cls = pkg[path]
            for name, text in importlib.import_module(module).SECTIONS.items():
                target = cls if not name else cls.members[name]
                own = target.docstring.value if target.docstring is not None else ""
                more = inspect.cleandoc(text)
                target.docstring = griffe.Docstring((own + "\n\n" if own else "") + more, parent=target)
