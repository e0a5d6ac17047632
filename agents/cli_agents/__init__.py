"""CLI agents (Claude Code, Codex, Gemini CLI, OpenCode, OpenHands), one module each (its command, stream parser and
install facts in a `CliAgentSpec`), run as subprocesses in the workspace behind a harness-side LLM proxy."""
