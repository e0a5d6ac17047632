"""reference-sft-grpo: one SFT warm-up round, then GRPO rounds from it (scripted, no LLM)."""
