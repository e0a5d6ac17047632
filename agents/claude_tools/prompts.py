"""Prompts of the LLM agents: the system prompt of `claude-tools` and the task prompt every LLM agent gets."""

from __future__ import annotations

import os
from pathlib import Path

from a2rl_bench.isolation import safefs

SYSTEM_PROMPT = """\
You are an autonomous machine-learning engineer. You are given a base language model, a task and a time \
budget, and your job is to post-train the model so that it scores as high as possible on the task's hidden \
test set. You work alone: nobody will answer questions, so decide and act.

You work in a workspace directory through tools: `bash` runs a shell command, `read_file`, `write_file` and \
`edit_file` handle files, `submit` sends a checkpoint to the grading server and returns its score, \
`check_budget` tells you how much time and how many submissions are left.

How to work well:
- Read `description.md` and `instructions.md` first; they define the task, the data, the API and the rules.
- Keep all your training code in `code/` and write checkpoints to `output/v1`, `output/v2`, ... . At every \
submission the harness snapshots `code/` and checks which training method it uses against the run's mode.
- Start with a quick, small run that produces a valid checkpoint and submit it early; then improve.
- A command that runs longer than its timeout is killed. Run long training in the background \
(`nohup python code/train.py > code/train.log 2>&1 &`) and check its log with short commands.
- Merge LoRA adapters into the model before saving a checkpoint, and save the tokenizer with it.
- The budget is wall-clock time; grading time is not counted. When it is used up, everything you started \
is stopped, so submit your best checkpoint before that.
- Each bash call starts a fresh shell in the workspace: `cd` and variables do not carry over between calls.
"""

NUDGE = (
    "The session is not over: about {remaining_s:.0f} seconds of your time budget and {submissions} remain. "
    "Keep improving the model (train, evaluate, submit). If you are certain nothing more can be gained, "
    "reply with exactly DONE."
)


def task_prompt(workspace: Path, env: dict[str, str] | None = None, grading_tools: bool = True,
                max_preview_lines: int = 3) -> str:  # fmt: skip
    """The first message: where things are, the task, the rules, a look at the workspace and the data.

    Args:
        grading_tools: the agent has `submit` / `check_budget` tools (claude-tools); CLI agents use curl.
    """
    env = dict(os.environ if env is None else env)
    workspace = Path(workspace)
    parts = [
        "# Your assignment\n",
        f"- Task: `{env.get('TASK', '?')}`\n- Base model: `{env.get('BASE_MODEL', '?')}` at "
        f"`{env.get('MODEL_PATH', 'models/base')}` (read-only)\n- Training data: `{env.get('DATA_PATH', 'data')}`\n"
        f"- Write checkpoints under: `{env.get('OUTPUT_DIR', 'output')}`\n"
        f"- Grading server: `{env.get('GRADING_SERVER_URL', '?')}` (bearer token in `$GRADING_TOKEN`"
        + ("; the `submit` and `check_budget` tools call it for you)\n" if grading_tools else ")\n"),
    ]
    for name in ("description.md", "instructions.md"):
        path = workspace / name
        if path.is_file():
            parts.append(f"\n# {name}\n\n{path.read_text(encoding='utf-8', errors='replace').strip()}\n")
    parts.append("\n# Workspace\n\n```\n" + _listing(workspace) + "```\n")
    previews = []
    for path in sorted((workspace / "data").glob("*"))[:5]:
        if path.is_file():
            with path.open(encoding="utf-8", errors="replace") as f:
                head = [line.rstrip("\n")[:400] for _, line in zip(range(max_preview_lines), f)]
            previews.append(f"`data/{path.name}` (first {len(head)} lines):\n```\n" + "\n".join(head) + "\n```\n")
    if previews:
        parts.append("\n# Data preview\n\n" + "\n".join(previews))
    parts.append(
        "\n# What to do\n\n1. Read the files above and look at the data and the base model.\n"
        "2. Write a training script in `code/` and run it (short first).\n"
        "3. Save a merged checkpoint (weights + tokenizer) to `output/vN` and submit it.\n"
        "4. Use the validation scores to improve, until the time budget is used.\n"
    )
    return "".join(parts)


def _listing(workspace: Path, max_entries: int = 60) -> str:
    lines = []
    # The runner has the harness's rights: links are listed as what they are, never followed.
    hidden = lambda e: e.name.startswith(".")  # noqa: E731
    for entry in safefs.walk(workspace, prune=hidden, max_depth=2):
        if hidden(entry):
            continue
        size = f"{'<dir>':>12}" if entry.is_dir else f"{'<link>':>12}" if entry.is_link else f"{entry.st.st_size:>12,d}"
        lines.append(f"{size}  {entry.rel}{'/' if entry.is_dir else ''}")
        if len(lines) >= max_entries:
            lines.append("... (more)")
            break
    return "\n".join(lines) + "\n"
