"""CLI agents (Claude Code, Codex CLI) run as subprocesses in the workspace behind a harness-side LLM proxy."""
