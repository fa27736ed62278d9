"""The README's shell examples: every `zfab` command in them parses as the CLI defines it, and every
shell variable they use is set in the same example or in the README's "set them once" block.

(They were also run, line by line, against a `make run` stack: see the cli branch's report.)
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from zfab.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"
SETUP = {"API", "TOKEN", "AUTH", "JSON"}  # the block after "set them once"
OUTSIDE = {"PWD", "HOME", "PATH", "ZFAB_API_TOKEN"}  # the shell's own, or the user's to give


def sh_blocks() -> list[str]:
    return [m.group(1) for m in re.finditer(r"```sh\n(.*?)```", README.read_text(), re.S)]


def zfab_commands(block: str) -> list[str]:
    """Each `zfab ...` command of a block, cut at the shell's separators and comments."""
    found = []
    for line in block.splitlines():
        code = line.split("  #")[0]
        for piece in re.split(r"\$\(|\)|;|&&|\|\||\||&(?!&)", code):
            words = piece.strip()
            words = re.sub(r"^(?:[A-Z_]+=\S+\s+)+", "", words)  # VAR=value zfab ...
            words = re.sub(r"\s*\d?>\s*\S+", "", words)  # > /dev/null
            if words.startswith("zfab "):
                found.append(words)
    return found


def test_the_readme_has_zfab_examples() -> None:
    assert sum(len(zfab_commands(b)) for b in sh_blocks()) > 40


@pytest.mark.parametrize("command", sorted({c for b in sh_blocks() for c in zfab_commands(b)}))
def test_every_zfab_command_in_the_readme_parses(command: str) -> None:
    argv = shlex.split(command)[1:]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 0, f"README: `{command}`: {err.getvalue().strip().splitlines()[-1:]}"


def test_every_variable_an_example_uses_is_set() -> None:
    unset = []
    for block in sh_blocks():
        code = "\n".join(line.split("  #")[0] for line in block.splitlines() if not line.lstrip().startswith("#"))
        assigned = set(re.findall(r"(?:^|[\s;(&|])(?:export\s+)?([A-Za-z_]\w*)=", code, re.M))
        used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", code))
        missing = used - assigned - SETUP - OUTSIDE
        unset += [f"${name} in: {block.splitlines()[0][:60]}" for name in sorted(missing)]
    assert not unset, unset
