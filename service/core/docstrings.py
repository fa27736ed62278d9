"""Sections appended to a class's docstrings at import: for modules that keep to their size
(tests/unit/test_layout.py) while their public face needs Args, Returns, Raises and an Example."""

from __future__ import annotations

import inspect


def document(cls: type, sections: dict[str, str]) -> None:
    """Append each entry's text to the docstring of `cls` (key "") or of its attribute of that name."""
    for name, text in sections.items():
        target = getattr(cls, name) if name else cls
        own, more = inspect.cleandoc(target.__doc__ or ""), inspect.cleandoc(text)
        if not own.endswith(more):  # once: a module imported again appends nothing
            target.__doc__ = (own + "\n\n" if own else "") + more
