"""`python -m a2rl_bench ...`, the same as the `a2rl` console script (part of the CLI layer, see a2rl_bench/cli)."""

import sys

from a2rl_bench.cli import main

sys.exit(main())
