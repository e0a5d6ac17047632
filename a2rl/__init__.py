"""a2rl: a benchmark harness for agents that engineer LLM post-training (Agent² RL-Bench, re-created).

The repository keeps the orchestration and the plug-ins in top-level folders (`flows/`, `tasks/`, `agents/`,
`analysis/`, `benchmarks/`, `blocks/`), but they are packages of this one: `a2rl.flows`, `a2rl.tasks`, ... An
installed wheel holds them inside `a2rl/` (pyproject's package-dir mapping), so it puts no generic top-level name
into site-packages. From a checkout, the lines below add the repository's root to this package's search path,
where those folders are found under the same names."""

from pathlib import Path as _Path

__version__ = "0.1.0"

PLUGGED_PACKAGES = ("flows", "tasks", "agents", "analysis", "benchmarks", "blocks")
"""The top-level folders of a checkout that are subpackages of `a2rl` (`a2rl.flows`, ...)."""

_here = _Path(__file__).resolve().parent
if not (_here / "flows").is_dir() and (_here.parent / "flows" / "__init__.py").is_file():
    __path__.append(str(_here.parent))  # noqa: F821 (a package's module global)
