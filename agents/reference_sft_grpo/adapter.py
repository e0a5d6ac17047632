"""`reference-sft-grpo`: reference-grpo's agent started with an SFT warm-up round (`train_sft.py`)."""

from __future__ import annotations

from agents.reference_grpo.adapter import ReferenceGRPO


class ReferenceSFTGRPO(ReferenceGRPO):
    id = "reference-sft-grpo"
    sft_warmup = True
