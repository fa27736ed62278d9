"""`python -m api [flags]`: the same as `zfab api [flags]`."""

import sys

from service.cli import main

sys.exit(main(["api", *sys.argv[1:]]))
