"""What is recorded during a run, under its harness directory: code snapshots (`snapshots`), resource samples
(`resources`), LLM and tool calls as store rows (`calls`)."""
