"""claude-tools: a tool-using agent on the `anthropic` SDK whose loop runs harness-side (the key stays there)."""
