"""`python -m a2rl.cli ...`, the same as the `a2rl` console script."""

import sys

from a2rl.cli import main

sys.exit(main())
