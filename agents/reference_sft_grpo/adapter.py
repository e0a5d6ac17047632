"""`reference-sft-grpo`: reference-grpo's agent started with SFT. On an interactive task that ships worked
examples and environments (alfworld), one process runs full-fine-tuning SFT rounds until validation stops
rising, then GRPO with online rollouts and a loop penalty (`sft_grpo_session.py`); elsewhere one SFT
warm-up round (`train_sft.py`) precedes reference-grpo's GRPO rounds."""

from __future__ import annotations

from pathlib import Path

from agents.reference_grpo.adapter import ReferenceGRPO

HERE = Path(__file__).parent
SESSION_FILES = ("sft_grpo_session.py", "sft_torch.py", "grpo_env_torch.py")


class ReferenceSFTGRPO(ReferenceGRPO):
    id = "reference-sft-grpo"
    sft_warmup = True

    def files(self) -> dict[str, Path]:
        return {**super().files(), **{name: HERE / name for name in SESSION_FILES}}
