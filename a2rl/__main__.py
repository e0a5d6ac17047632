"""`python -m a2rl ...`, the same as the `a2rl` console script (part of the CLI layer, see a2rl/cli)."""

import sys

from a2rl.cli import main

sys.exit(main())
