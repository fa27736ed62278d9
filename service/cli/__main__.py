"""`python -m zfab.cli`: the `zfab` command."""

import sys

from .main import main

sys.exit(main())
