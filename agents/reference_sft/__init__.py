"""reference-sft: scripted SFT agent (`agent.py`, `train_sft.py` are copied into the workspace and run there)."""
