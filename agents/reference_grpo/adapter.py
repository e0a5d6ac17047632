"""`reference-grpo`: a scripted agent (no LLM) that trains with TRL GRPO on the task's rule reward, or on an
interactive task's episode reward from online rollouts in its environment."""

from __future__ import annotations

import sys
from pathlib import Path

from a2rl_bench.isolation import safefs
from a2rl_bench.agents.base import Agent
from a2rl_bench.paths import package_file

HERE = Path(__file__).parent
REFERENCE_SFT = HERE.parent / "reference_sft"
DECODE_ENGINE = package_file("a2rl_bench.inference", "decode_engine.py")
"""Stand-alone (torch and transformers only): on CUDA the GRPO trainers sample through a copy of it in `code/`."""


class ReferenceGRPO(Agent):
    id = "reference-grpo"
    sft_warmup = False

    def files(self) -> dict[str, Path]:
        """Workspace file name -> source. The loop helpers are reference-sft's `agent.py`, as `round_loop.py`."""
        files = {"agent.py": HERE / "agent.py", "train_grpo.py": HERE / "train_grpo.py",
                 "train_grpo_env.py": HERE / "train_grpo_env.py", "round_loop.py": REFERENCE_SFT / "agent.py",
                 "train_common.py": REFERENCE_SFT / "train_common.py",
                 "train_precision.py": REFERENCE_SFT / "train_precision.py",
                 "decode_engine.py": DECODE_ENGINE}  # fmt: skip
        if self.sft_warmup:
            files["train_sft.py"] = REFERENCE_SFT / "train_sft.py"
        return files

    def install(self, workspace: Path) -> None:
        # The agent's code lives in its workspace like any agent's, so it is snapshotted and route-labelled.
        # Written as root on every (re)provisioning into the agent's own code/: never through a link it left.
        for name, src in self.files().items():
            safefs.replace_file(workspace / "code", name, Path(src).read_bytes())

    def command(self, workspace: Path) -> list[str]:
        return [sys.executable, "code/agent.py", *(["--sft-warmup"] if self.sft_warmup else [])]
