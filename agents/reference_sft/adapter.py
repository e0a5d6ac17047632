"""`reference-sft`: a scripted agent (no LLM) that fine-tunes with TRL SFT and submits over HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

from a2rl_bench.isolation import safefs
from a2rl_bench.agents.base import Agent

SCRIPTS = ("agent.py", "train_sft.py", "train_common.py", "train_precision.py")


class ReferenceSFT(Agent):
    id = "reference-sft"

    def install(self, workspace: Path) -> None:
        # The agent's code lives in its workspace like any agent's, so it is snapshotted and route-labelled.
        # Written as root on every (re)provisioning into the agent's own code/: never through a link it left.
        for name in SCRIPTS:
            safefs.replace_file(workspace / "code", name, (Path(__file__).parent / name).read_bytes())

    def command(self, workspace: Path) -> list[str]:
        return [sys.executable, "code/agent.py"]
