"""The one rule for names that become file names: a worker's name (its job store and lock under
`$ZFAB_DATA_DIR/workers/`), the service a default worker name is made from, a CURVE key pair's name.

A name is one path component, never a path: a word character first, then word characters, `.`,
`-`, `+` or `@`, at most MAX_PATH_NAME_BYTES in UTF-8. So `a/b`, `../x`, `.`, `..`, a hidden
`.name`, an empty name, whitespace and control characters are refused before anything is opened.
Pure: no file is touched here.
"""

from __future__ import annotations

import re

from .errors import BadNameError

# A file name may be 255 bytes; the longest one made from a name is its job store's journal
# segment, `<name>.sqlite.journal.00000000` (24 more), so 200 leaves room for any suffix.
MAX_PATH_NAME_BYTES = 200
_NAME = re.compile(r"\w[\w.+@-]*")


def check_path_name(name: str, what: str = "worker name") -> str:
    """`name` when it is a safe file name; BadNameError (a ValueError) saying why not, otherwise."""
    if not isinstance(name, str):
        raise BadNameError(f"{what} must be a string, got {type(name).__name__}")
    size = len(name.encode(errors="surrogatepass"))
    if size > MAX_PATH_NAME_BYTES:
        raise BadNameError(f"{what} is {size} bytes long; at most {MAX_PATH_NAME_BYTES} are allowed")
    if not _NAME.fullmatch(name):
        raise BadNameError(
            f"{what} {name[:64]!r} is not allowed: it names a file under the data directory, so it must be "
            "letters, digits, '_', '.', '-', '+' or '@', starting with a letter, digit or '_' (no '/', no '..')"
        )
    return name
