"""What the reference agents' training scripts share: the GSM8K prompt, the LoRA rule, the checkpoint's atomic
save and the summary line the agent loop reads.

Stand-alone (copied into the workspace's `code/` beside `train_sft.py` / `train_grpo.py`, which import it as a
sibling module, like `train_precision.py`): imports nothing from the harness.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

PROMPT_TEMPLATE = "Question: {question}\nLet's think step by step\nAnswer:"
LORA_AUTO_MIN_PARAMS = 50_000_000
LORA_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SUMMARY_PREFIX = "TRAIN_SUMMARY "


def lora_config(model, args):
    """LoRA on the attention and MLP projections the model has (all linear layers if it has none of them)."""
    from peft import LoraConfig

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = sorted(names & set(LORA_TARGET_MODULES)) or "all-linear"
    return LoraConfig(
        r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM"
    )


def fix_tokenizer_config(directory: Path) -> None:
    """Make ``tokenizer_config.json`` loadable by older ``AutoTokenizer`` versions too.

    transformers 5 may write ``extra_special_tokens`` as a list; versions before 5 expect a dict there and fail
    to load it. The list is stored under its pre-5 name ``additional_special_tokens``, which 5 also reads.
    """
    path = directory / "tokenizer_config.json"
    if not path.exists():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    extra = config.get("extra_special_tokens")
    if isinstance(extra, list):
        del config["extra_special_tokens"]
        if extra:
            config.setdefault("additional_special_tokens", extra)
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def save_checkpoint(model, tokenizer, out: Path) -> None:
    """Write into a temp dir beside ``out``, then rename: a half-written checkpoint is never visible."""
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    fix_tokenizer_config(tmp)
    for path in tmp.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; a grader running as another user must read it
    os.rename(tmp, out)
