"""a2rl: a benchmark harness for agents that engineer LLM post-training (Agent² RL-Bench, re-created).

The repository keeps the orchestration and the plug-ins in top-level folders (`flows/`, `tasks/`, `agents/`,
`analysis/`, `benchmarks/`, `blocks/`, and the task data `data/`), but they are packages of this one:
`a2rl_bench.flows`, `a2rl_bench.tasks`, ... An installed wheel holds them inside `a2rl_bench/` (pyproject's package-dir
mapping), so it puts no generic top-level name into site-packages. A checkout has the same layout through relative
symbolic links (`a2rl_bench/flows` -> `../flows`, ...), so Python, import-linter (`lint-imports` at the root) and the
wheel all see one package tree."""

__version__ = "0.1.0"
