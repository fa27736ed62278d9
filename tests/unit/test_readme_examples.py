"""The shell examples of the README and the documentation site (docs/): every `zfab` command in them
parses as the CLI defines it, and every shell variable they use is set in the same example or in the
"set them once" block (docs/guides/index.md). tests/integration/test_doc_examples.py runs them.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from zfab.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "docs"))
from examples import all_examples  # noqa: E402  (the one reader of the docs' fenced examples)

SETUP = {"API", "TOKEN", "AUTH", "JSON"}  # the block after "set them once" (docs/guides/index.md)
OUTSIDE = {"PWD", "HOME", "PATH", "ZFAB_API_TOKEN", "TOKENS"}  # the shell's own, or the user's to give


def sh_blocks() -> list[str]:
    return [e.code for e in all_examples() if e.lang == "sh"]


def zfab_commands(block: str) -> list[str]:
    """Each `zfab ...` command of a block, cut at the shell's separators and comments."""
    found = []
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():  # a command continued over lines is one
        code = line.split("  #")[0]
        for piece in re.split(r"\$\(|\)|;|&&|\|\||\||&(?!&)", code):
            words = piece.strip()
            words = re.sub(r"^(?:[A-Z_]+=\S+\s+)+", "", words)  # VAR=value zfab ...
            words = re.sub(r"\s*\d?>\s*\S+", "", words)  # > /dev/null
            if words.startswith("zfab "):
                found.append(words)
    return found


def test_the_docs_have_zfab_examples() -> None:
    assert sum(len(zfab_commands(b)) for b in sh_blocks()) > 40


@pytest.mark.parametrize("command", sorted({c for b in sh_blocks() for c in zfab_commands(b)}))
def test_every_zfab_command_in_the_docs_parses(command: str) -> None:
    argv = shlex.split(command)[1:]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 0, f"docs: `{command}`: {err.getvalue().strip().splitlines()[-1:]}"


def test_every_variable_an_example_uses_is_set() -> None:
    unset = []
    for block in sh_blocks():
        code = "\n".join(line.split("  #")[0] for line in block.splitlines() if not line.lstrip().startswith("#"))
        assigned = set(re.findall(r"(?:^|[\s;(&|])(?:export\s+)?([A-Za-z_]\w*)=", code, re.M))
        used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", code))
        missing = used - assigned - SETUP - OUTSIDE
        unset += [f"${name} in: {block.splitlines()[0][:60]}" for name in sorted(missing)]
    assert not unset, unset
