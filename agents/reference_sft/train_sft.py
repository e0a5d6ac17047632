"""Supervised fine-tuning of a causal LM with TRL, saved as a merged checkpoint: on a task's worked examples
(``sft.jsonl``, in the evaluation prompt format) or on GSM8K worked solutions.

Stand-alone: run by the reference agent as its own process, so it imports nothing from the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

try:  # run as a script, in a workspace's code/ or here: the sibling module
    from train_common import (LORA_AUTO_MIN_PARAMS, PROMPT_TEMPLATE, SUMMARY_PREFIX, fix_tokenizer_config,  # noqa: F401
                              lora_config, save_checkpoint)
except ImportError:  # imported as a2rl_bench.agents.reference_sft.train_sft (tests, the SFT+GRPO session)
    from a2rl_bench.agents.reference_sft.train_common import (LORA_AUTO_MIN_PARAMS, PROMPT_TEMPLATE, SUMMARY_PREFIX,
                                                   fix_tokenizer_config, lora_config, save_checkpoint)


_CALCULATOR_ANNOTATION = re.compile(r"<<[^<>]*>>")
_FINAL_ANSWER = re.compile(r"####\s*(.+?)\s*$")


def format_solution(answer: str) -> str:
    """Turn a GSM8K solution into the evaluation's answer style.

    Calculator annotations such as ``<<48/2=24>>`` are removed and the final ``#### N`` line becomes
    ``The answer is N``.

    Example:
        >>> format_solution("She has 48/2 = <<48/2=24>>24 left.\\n#### 24")
        'She has 48/2 = 24 left.\\nThe answer is 24'
    """
    text = _CALCULATOR_ANNOTATION.sub("", answer).strip()
    lines = text.split("\n")
    match = _FINAL_ANSWER.search(lines[-1])
    if match:
        final = match.group(1).replace(",", "").strip()
        lines[-1] = f"The answer is {final}"
    return "\n".join(line.rstrip() for line in lines)


def to_conversation(row: dict) -> dict:
    """One row as a conversational prompt-completion example (TRL's format): a worked example the task ships
    (``sft.jsonl``) as it is, a GSM8K question / answer row in the evaluation's answer style."""
    if isinstance(row.get("prompt"), list) and isinstance(row.get("completion"), list):
        return {"prompt": row["prompt"], "completion": row["completion"]}
    return {
        "prompt": [{"role": "user", "content": PROMPT_TEMPLATE.format(question=row["question"].strip())}],
        "completion": [{"role": "assistant", "content": format_solution(row["answer"])}],
    }


def read_rows(path: Path) -> list[dict]:
    """Rows of a JSONL file that are worked examples or have a question and an answer."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if (row.get("question") and row.get("answer")) or (row.get("prompt") and row.get("completion")):
                    rows.append(row)
    return rows


def select_examples(rows: list[dict], n: int, seed: int, fits) -> list[dict]:
    """Shuffle with ``seed`` and keep the first ``n`` conversations for which ``fits(example)`` is true."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    chosen = []
    for i in order:
        example = to_conversation(rows[i])
        if fits(example):
            chosen.append(example)
            if len(chosen) >= n:
                break
    return chosen




def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; defaults fit one ~90-120 s round for SmolLM2-135M on 2 CPU cores."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--init", required=True, help="HF checkpoint directory to start from (base model or earlier output)")
    p.add_argument("--out", required=True, help="directory to write the merged checkpoint to (must not exist)")
    p.add_argument("--data", default=None, help="train.jsonl (default: $DATA_PATH/train.jsonl)")
    p.add_argument("--max-steps", type=int, default=14, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=4, help="per-device batch size")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--max-length", type=int, default=256, help="longer examples are skipped, not truncated")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: 2e-4 with LoRA, 2e-5 without)")
    p.add_argument(
        "--warmup-steps", type=int, default=0, help="linear warm-up steps (the first step then runs at lr 0)"
    )
    p.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"train a LoRA adapter and merge it (default: on for models over {LORA_AUTO_MIN_PARAMS:,} parameters)",
    )
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds of training steps; stops before a step would overrun them (loading and saving come on top)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="wall-clock time (seconds since the epoch) by which the checkpoint must be saved: training stops "
        "before a step (at the measured step time) would leave less than --save-reserve seconds; at least one step",
    )
    p.add_argument("--save-reserve", type=float, default=15.0, help="seconds kept before --deadline to merge and save")
    p.add_argument("--seed", type=int, default=0, help="seed for the data subset and training")
    return p.parse_args(argv)


def count_tokens(tokenizer, example: dict) -> int:
    """Length of a conversational prompt-completion example after the chat template."""
    ids = tokenizer.apply_chat_template(example["prompt"] + example["completion"], tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)




def sft_config(args: argparse.Namespace, lr: float, output_dir: Path, precision=None):
    """TRL settings that work on a CPU-only machine (fp32) as well as on a GPU (bf16: `train_precision`)."""
    import torch
    from trl import SFTConfig
    from train_precision import Precision

    precision = precision or Precision("float32", bf16=False, gradient_checkpointing=False)

    use_cuda = torch.cuda.is_available()
    return SFTConfig(
        output_dir=str(output_dir),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=lr,
        lr_scheduler_type="cosine",
        warmup_steps=args.warmup_steps,
        max_length=args.max_length,
        completion_only_loss=True,
        logging_steps=max(1, args.max_steps // 8),
        save_strategy="no",
        report_to="none",
        **precision.trainer_kwargs(),
        use_cpu=not use_cuda,
        dataloader_pin_memory=use_cuda,
        disable_tqdm=True,
        seed=args.seed,
        data_seed=args.seed,
    )


def time_limit_callback(limit_s: float | None, deadline: float | None = None, reserve_s: float = 0.0):
    """A ``TrainerCallback`` that ends training before a step would end past ``limit_s`` seconds of steps, or
    past ``deadline - reserve_s`` (wall clock: the time to merge and save comes after the last step).

    The next step is assumed to take as long as the last one, so a slow (e.g. CPU-contended) run stops early
    instead of overrunning by a whole step. The first step always runs: a round that was started submits
    a trained checkpoint, however late its start-up ended.
    """
    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.t0 = self.t_last = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.monotonic()
            last_step_s, self.t_last = now - self.t_last, now
            if limit_s is not None and now - self.t0 + last_step_s > limit_s:
                print(f"stopping at step {state.global_step}: {now - self.t0:.0f}s of {limit_s:.0f}s used", flush=True)
                control.should_training_stop = True
            elif deadline is not None and time.time() + last_step_s + reserve_s > deadline:
                print(f"stopping at step {state.global_step} ({last_step_s:.1f}s per step): the checkpoint is due in "
                      f"{deadline - time.time():.0f}s, {reserve_s:.0f}s kept to save it", flush=True)
                control.should_training_stop = True

    return TimeLimit()




def _due_in(deadline: float | None) -> str:
    return "none" if deadline is None else f"{deadline - time.time():.0f}s"


def main(argv: list[str] | None = None) -> int:
    """Train, merge, save atomically, print a one-line JSON summary prefixed with ``TRAIN_SUMMARY``."""
    args = parse_args(argv)
    t_start = time.monotonic()
    out = Path(args.out)
    if out.exists():
        print(f"error: {out} already exists; pick a new --out", file=sys.stderr)
        return 2
    data = Path(args.data) if args.data else Path(os.environ.get("DATA_PATH", "data")) / "train.jsonl"

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers
    from transformers import AutoTokenizer
    from train_precision import load_for_training
    from trl import SFTTrainer

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.init)
    model, n_params, use_lora, precision = load_for_training(args.init, args.lora, LORA_AUTO_MIN_PARAMS)
    lr = args.lr if args.lr is not None else (2e-4 if use_lora else 2e-5)
    t_loaded = time.monotonic()

    rows = read_rows(data)
    wanted = args.max_steps * args.batch_size * args.grad_accum
    examples = select_examples(rows, wanted, args.seed, lambda ex: count_tokens(tokenizer, ex) <= args.max_length)
    if not examples:
        print(f"error: no example of {data} fits --max-length {args.max_length}", file=sys.stderr)
        return 3
    print(
        f"init={args.init} params={n_params:,} lora={use_lora} lr={lr} steps={args.max_steps} "
        f"batch={args.batch_size}x{args.grad_accum} max_length={args.max_length} examples={len(examples)}/{len(rows)} "
        f"dtype={precision.load_dtype} bf16={precision.bf16} checkpointing={precision.gradient_checkpointing} "
        f"time_limit={args.time_limit} due_in={_due_in(args.deadline)} load_s={t_loaded - t_start:.1f}",
        flush=True,
    )

    trainer_dir = out.parent / f".{out.name}.trainer-{os.getpid()}"
    trainer = SFTTrainer(
        model=model,
        args=sft_config(args, lr, trainer_dir, precision),
        train_dataset=datasets.Dataset.from_list(examples),
        processing_class=tokenizer,
        peft_config=lora_config(model, args) if use_lora else None,
        callbacks=[time_limit_callback(args.time_limit, args.deadline, args.save_reserve)],
    )
    t_train = time.monotonic()
    result = trainer.train()
    t_trained = time.monotonic()
    model = trainer.model.merge_and_unload() if use_lora else trainer.model
    save_checkpoint(model, tokenizer, out)
    shutil.rmtree(trainer_dir, ignore_errors=True)
    t_end = time.monotonic()

    steps = trainer.state.global_step
    train_s = t_trained - t_train
    summary = {
        "out": str(out),
        "lora": use_lora,
        "lr": lr,
        "steps": steps,
        "examples_seen": steps * args.batch_size * args.grad_accum,
        "train_loss": round(float(result.training_loss), 4),
        "load_s": round(t_loaded - t_start, 1),
        "train_s": round(train_s, 1),
        "s_per_step": round(train_s / max(1, steps), 2),
        "examples_per_s": round(steps * args.batch_size * args.grad_accum / max(1e-9, train_s), 3),
        "save_s": round(t_end - t_trained, 1),
        "total_s": round(t_end - t_start, 1),
    }
    print(f"training loss {summary['train_loss']} after {steps} steps", flush=True)
    print(SUMMARY_PREFIX + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
