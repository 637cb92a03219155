"""``python -m workbench``: the same command as ``workbench``."""

import sys

from workbench.cli import main

sys.exit(main())
