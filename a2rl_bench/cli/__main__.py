"""`python -m a2rl_bench.cli ...`, the same as the `a2rl` console script."""

import sys

from a2rl_bench.cli import main

sys.exit(main())
