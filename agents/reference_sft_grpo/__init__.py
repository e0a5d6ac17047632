"""reference-sft-grpo: SFT, then GRPO from it (scripted, no LLM); in-process rounds on interactive tasks."""
