"""What the harness captures while a run goes, under its harness directory: code snapshots (`snapshots`), resource
samples (`resources`), LLM and tool calls as store rows (`calls`), the attempts and their times (`attempts`), the
agent's output (`agent_log`). Named apart from `a2rl_bench.records` (the typed records that cross a boundary) and
`a2rl_bench.summary.record` (a run's record)."""
