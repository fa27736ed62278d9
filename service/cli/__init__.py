"""`zfab broker|worker|up|run|mmi|keys|healthcheck` (and `api`, `submit`, `jobs`... from the api package):
every flag is also a ZFAB_* environment variable.

A mistake the user can fix (a bad setting, a module that does not import, a port in use) is one
line on stderr and exit code 2, never a traceback.

common.py: what every command shares; roles.py: broker and worker; local.py: `up`, supervise.py: its
supervisor; client.py: run,
mmi, healthcheck, keys; main.py: the parser and main.
"""

from .common import (
    EXIT_USAGE,
    ProgressLine,
    UsageError,
    failure_lines,
    json_flag,
    setting_error,
    workers_flag,
)
from .main import build_parser, main
from .roles import load_worker_class

__all__ = [
    "EXIT_USAGE",
    "ProgressLine",
    "UsageError",
    "build_parser",
    "failure_lines",
    "json_flag",
    "load_worker_class",
    "main",
    "setting_error",
    "workers_flag",
]
