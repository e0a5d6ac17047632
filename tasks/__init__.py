"""The composition layer under the flows: the steps of a run (`a2rl_bench.tasks.run_steps`, Prefect tasks) and the
checks before one (`a2rl_bench.tasks.preflight`). These put the library (`a2rl`) together with the plug-ins
(`benchmarks`, `agents`, `blocks`), which the library itself never imports (tests/test_layers.py)."""
