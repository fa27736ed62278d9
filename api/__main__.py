"""`python -m zfab.api [flags]`: the same as `zfab api [flags]`."""

import sys

from zfab.cli import main

sys.exit(main(["api", *sys.argv[1:]]))
