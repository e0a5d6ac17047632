"""`reference-sft`: a scripted agent (no LLM) that fine-tunes with TRL SFT and submits over HTTP."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from agents.base import Agent

SCRIPTS = ("agent.py", "train_sft.py", "train_precision.py")


class ReferenceSFT(Agent):
    id = "reference-sft"

    def install(self, workspace: Path) -> None:
        # The agent's code lives in its workspace like any agent's, so it is snapshotted and route-labelled.
        for name in SCRIPTS:
            shutil.copy2(Path(__file__).parent / name, workspace / "code" / name)

    def command(self, workspace: Path) -> list[str]:
        return [sys.executable, "code/agent.py"]
