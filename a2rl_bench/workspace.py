"""Run directories and the agent's workspace.

    <runs_dir>/<run_id>/
        workspace/      what the agent sees: description.md, instructions.md, data/, models/base/, code/, output/
        harness/        what it must not see: ledger, request log, agent log, report, manifest
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import BaseModel

from a2rl_bench.isolation import safefs

INSTRUCTIONS_TEMPLATE = Path(__file__).parent / "templates" / "instructions.md"


class RunPaths(BaseModel):
    run_dir: Path
    workspace: Path
    harness_dir: Path

    @classmethod
    def for_run(cls, runs_dir: Path, run_id: str) -> RunPaths:
        run_dir = Path(runs_dir).resolve() / run_id
        return cls(run_dir=run_dir, workspace=run_dir / "workspace", harness_dir=run_dir / "harness")

    def create(self) -> None:
        self.harness_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("code", "output", "data", "models"):
            (self.workspace / sub).mkdir(parents=True, exist_ok=True)


def build_workspace(
    paths: RunPaths,
    public_data_dir: Path,
    base_model_dir: Path,
    description: str,
    instructions: str,
) -> None:
    """Fill the workspace. Idempotent, so a retried provisioning step can run again safely."""
    paths.create()
    ws = paths.workspace
    # Replaced, never written through a link (a retry provisions a workspace an agent has used).
    safefs.replace_file(ws, "description.md", description.encode())
    safefs.replace_file(ws, "instructions.md", instructions.encode())
    for src in Path(public_data_dir).iterdir():
        # Not a writer's temporary (`.<name>.<pid>.<tid>.tmp`, `envlib.zip.<pid>.tmp`): its rename may come first.
        if src.is_file() and not src.name.startswith(".") and src.suffix != ".tmp":
            shutil.copy2(src, ws / "data" / src.name)
    _copy_model(Path(base_model_dir), ws / "models" / "base")


def render_instructions(**values: object) -> str:
    text = INSTRUCTIONS_TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    return text


def _copy_model(src: Path, dst: Path) -> None:
    """Copy the base model's files, read-only. A copy, not a hard link: the agent may run as root, and a
    write through a hard link would corrupt the shared model cache for every later run."""
    if dst.is_symlink() or dst.parent.is_symlink():
        raise RuntimeError(f"{dst} is a symbolic link: refusing to write the base model through it")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        target = dst / f.name
        if not f.is_file() or f.name.startswith(".") or target.exists() or target.is_symlink():
            continue
        tmp = dst / f".{f.name}.tmp"
        shutil.copyfile(f, tmp)
        tmp.replace(target)
        target.chmod(0o444)
