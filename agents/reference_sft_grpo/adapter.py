"""`reference-sft-grpo`: reference-grpo's agent started with SFT. On an interactive task that ships worked
examples and environments (alfworld), one process runs full-fine-tuning SFT rounds until validation stops
rising (worked examples plus its own searching demonstrations), then GRPO with online rollouts, win-only
returns and a KL target (`sft_grpo_session.py`; on CUDA the rollouts sample through a copy of the harness's
decode engine); elsewhere one SFT warm-up round
(`train_sft.py`) precedes reference-grpo's GRPO rounds. `reference-sft-gigpo` is the same agent with GiGPO's
step-level advantages over anchor states in its RL rounds."""

from __future__ import annotations

from pathlib import Path

from a2rl_bench.agents.reference_grpo.adapter import ReferenceGRPO

HERE = Path(__file__).parent
SESSION_FILES = ("sft_grpo_session.py", "sft_torch.py", "grpo_env_torch.py", "search_demos.py")


class ReferenceSFTGRPO(ReferenceGRPO):
    id = "reference-sft-grpo"
    sft_warmup = True
    rl_algorithm = "grpo"

    def files(self) -> dict[str, Path]:
        return {**super().files(), **{name: HERE / name for name in SESSION_FILES}}

    def command(self, workspace: Path) -> list[str]:
        return [*super().command(workspace), "--rl", self.rl_algorithm]


class ReferenceSFTGiGPO(ReferenceSFTGRPO):
    """reference-sft-grpo with GiGPO in its RL rounds on interactive tasks: the episode-level GRPO advantage
    plus a step-level one from the steps of a group that start from the same environment state (anchor
    states), compared on their discounted return-to-go (Feng et al., 2025)."""

    id = "reference-sft-gigpo"
    rl_algorithm = "gigpo"
