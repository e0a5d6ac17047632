"""a2rl: a benchmark harness for agents that engineer LLM post-training (Agent² RL-Bench, re-created)."""

__version__ = "0.1.0"
