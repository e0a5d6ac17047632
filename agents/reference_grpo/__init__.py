"""reference-grpo: scripted GRPO agent (`agent.py`, `train_grpo.py` are copied into the workspace and run there)."""
