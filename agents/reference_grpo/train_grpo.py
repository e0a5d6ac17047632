"""GRPO on GSM8K questions with TRL: the task's rule reward (exact final number) plus a small format reward,
LoRA merged before saving.

Stand-alone: run by the reference agent as its own process, so it imports nothing from the harness (the
answer extraction below is a small copy of the grader's rule).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import shutil
import sys
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path


def shared_module(name: str):
    """`name.py` shared with the SFT script: beside this script in a workspace, in `agents/reference_sft/` in the
    repository."""
    if name in sys.modules:
        return sys.modules[name]
    here = Path(__file__).resolve().parent
    path = next(p for p in (here, here.parent / "reference_sft") if (p / f"{name}.py").exists())
    spec = importlib.util.spec_from_file_location(name, path / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


shared_module("train_common")  # now in sys.modules, where the import below finds it
from train_common import (LORA_AUTO_MIN_PARAMS, PROMPT_TEMPLATE, SUMMARY_PREFIX, lora_config,  # noqa: E402
                          save_checkpoint)

FORMAT_WEIGHT = 0.2
"""Weight of the format reward next to the correctness reward (1.0)."""

_NUMBER = r"-?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_MARKED = re.compile(r"####\s*(" + _NUMBER + r")|answer\s+is\s*[:=]?\s*[*$\\(\s]*(" + _NUMBER + ")", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)
_FINAL_LINE = re.compile(r"The answer is\s*\$?(" + _NUMBER + r")\s*\.?\s*$")


def normalize_number(text: str) -> str | None:
    """`$1,200.00` -> `1200`, `0.50` -> `0.5`; None for text that is no number."""
    try:
        value = Decimal(re.sub(r"[\s$,]", "", text))
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    return str(int(value)) if value == value.to_integral_value() else format(value.normalize(), "f")


def extract_answer(text: str) -> str | None:
    """The final number a completion commits to: the first "The answer is N" / "#### N", else the last number.

    Example:
        >>> extract_answer("2 + 3 = 5 apples.\\nThe answer is 5. Question: next")
        '5'
    """
    text = text.split("Question:", 1)[0]
    marked = _MARKED.search(text)
    if marked:
        return normalize_number(marked.group(1) or marked.group(2))
    numbers = _ANY_NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def target_of(row: dict) -> str | None:
    """The reference number: the row's `target`, else the `#### N` line of its solution."""
    if row.get("target") not in (None, ""):
        return normalize_number(str(row["target"]))
    _head, sep, tail = str(row.get("answer", "")).rpartition("####")
    return normalize_number(tail) if sep else None


def _text(completion) -> str:
    """A completion as text (TRL passes conversational completions as lists of messages)."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def correctness_reward(completions: list, target: list[str], **kwargs) -> list[float]:
    """1.0 when the completion's final number equals the target, else 0.0 (the grader's rule)."""
    return [1.0 if extract_answer(_text(c)) == t else 0.0 for c, t in zip(completions, target, strict=True)]


def format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 when the completion ends with "The answer is N" (the format the grader reads first), 0.5 when it
    says it elsewhere or goes on with an invented next question, else 0.0."""
    rewards = []
    for c in completions:
        text = _text(c).strip()
        answer = text.split("Question:", 1)[0].strip()  # an invented next question is not part of the answer
        rewards.append(1.0 if answer == text and _FINAL_LINE.search(text) else 0.5 if _MARKED.search(answer) else 0.0)
    return rewards


def to_prompt(row: dict) -> dict:
    """One GSM8K row as a conversational GRPO prompt with its target column."""
    return {
        "prompt": [{"role": "user", "content": PROMPT_TEMPLATE.format(question=row["question"].strip())}],
        "target": target_of(row),
    }


def read_rows(path: Path) -> list[dict]:
    """Rows of a JSONL file that have a question and a number to aim for."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if row.get("question") and target_of(row) is not None:
                    rows.append(row)
    return rows




def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; defaults fit a short CPU round for SmolLM2-135M."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--init", required=True, help="HF checkpoint directory to start from")
    p.add_argument("--out", required=True, help="directory to write the merged checkpoint to (must not exist)")
    p.add_argument("--data", default=None, help="train.jsonl (default: $DATA_PATH/train.jsonl)")
    p.add_argument("--max-steps", type=int, default=8, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=4, help="completions per step (a multiple of --num-generations)")
    p.add_argument("--num-generations", type=int, default=4, help="completions sampled per prompt (the group)")
    p.add_argument("--max-completion-length", type=int, default=128)
    p.add_argument("--max-prompt-tokens", type=int, default=256, help="longer prompts are skipped")
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference model is loaded)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: 5e-5 with LoRA, 5e-6 without)")
    p.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"train a LoRA adapter and merge it (default: on for models over {LORA_AUTO_MIN_PARAMS:,} parameters)",
    )
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--time-limit", type=float, default=None, help="stop training after this many seconds of steps")
    p.add_argument("--rollouts", choices=("auto", "engine", "generate"),
                   default=os.environ.get("A2RL_GRPO_ROLLOUT_ENGINE") or "auto",
                   help="sampler of the completions: the decode engine (auto: on CUDA) or transformers generate")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def grpo_config(args: argparse.Namespace, lr: float, output_dir: Path, precision=None):
    """TRL settings that work on a CPU-only machine (fp32) as well as on a GPU (bf16: `train_precision`; no vLLM)."""
    import torch
    from trl import GRPOConfig

    precision = precision or train_precision().Precision("float32", bf16=False, gradient_checkpointing=False)

    use_cuda = torch.cuda.is_available()
    return GRPOConfig(
        output_dir=str(output_dir),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        beta=args.beta,
        learning_rate=lr,
        reward_weights=[1.0, FORMAT_WEIGHT],
        use_vllm=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        **precision.trainer_kwargs(),
        use_cpu=not use_cuda,
        dataloader_pin_memory=use_cuda,
        disable_tqdm=True,
        seed=args.seed,
        data_seed=args.seed,
    )


def import_decode_engine():
    """The static-cache decode engine: the copy in ``code/``, else the harness's own module."""
    try:
        import decode_engine
    except ImportError:
        from a2rl_bench.inference import decode_engine
    return decode_engine


class EngineRollouts:
    """Completions for TRL's GRPO from a bf16 copy of the policy (LoRA merged in) through the decode engine: CUDA
    graphs, sampling and end-of-sequence detection on the device. `sync` copies the policy's current weights in
    place before each generation (captured graphs keep reading the same tensors)."""

    def __init__(self, policy, eos_ids, *, temperature: float, top_p: float, top_k: int, max_new_tokens: int,
                 seed: int, pad_id: int):  # fmt: skip
        import copy

        import torch

        engine = import_decode_engine()
        self.engine, self.lora = engine, hasattr(policy, "get_base_model")
        clone = copy.deepcopy(policy)
        self.copy = (clone.merge_and_unload() if self.lora else clone).to(dtype=torch.bfloat16).eval()
        for p in self.copy.parameters():
            p.requires_grad_(False)
        on_cuda = next(self.copy.parameters()).device.type == "cuda"
        self.decoder = engine.Decoder(self.copy, use_graph=on_cuda, chunk=16)
        self.stop = engine.StopTokens(frozenset(eos_ids))
        self.sampling = engine.Sampling(temperature=temperature, top_p=top_p, top_k=top_k or 0)
        self.max_new_tokens, self.seed, self.pad_id, self.calls = max_new_tokens, seed, pad_id, 0

    def sync(self, policy) -> None:
        import torch

        with torch.no_grad():
            if self.lora:  # only the LoRA-wrapped layers change: base weight + the adapters' delta
                for name, module in policy.get_base_model().named_modules():
                    if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
                        merged = module.base_layer.weight + sum(module.get_delta_weight(a) for a in module.active_adapters)
                        self.copy.get_submodule(name).weight.copy_(merged)
            else:
                for mine, theirs in zip(self.copy.parameters(), policy.parameters()):
                    mine.copy_(theirs)
        self.decoder.weights_changed()

    def generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        """One sampled completion per prompt, through its first end-of-sequence token."""
        seeds = self.engine.row_seeds(self.seed * 1_000_003 + self.calls, len(prompt_ids))
        self.calls += 1
        out = self.decoder.decode(prompt_ids, self.max_new_tokens, None, self.pad_id, sampling=self.sampling,
                                  seeds=seeds, stop=self.stop)  # fmt: skip
        return [self.stop.cut(tokens) for tokens in out]


def engine_trainer(base_cls, mode: str):
    """`base_cls` (TRL's GRPOTrainer) with its single-process, text-only sampling on the decode engine (`mode`
    engine, or auto on CUDA); anything the engine does not reproduce (vLLM, images, min-p, a repetition
    penalty, several processes), or an engine failure, stays with TRL's own `generate`."""

    class EngineGRPOTrainer(base_cls):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            if self._engine_applies(images, multimodal_fields):
                try:
                    policy = self.accelerator.unwrap_model(self.model)
                    if getattr(self, "_rollouts", None) is None:
                        self._rollouts = EngineRollouts(
                            policy, self.eos_token_ids, temperature=self.temperature, top_p=self.top_p,
                            top_k=self.top_k, max_new_tokens=self.max_completion_length, seed=self.args.seed,
                            pad_id=self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0,
                        )  # fmt: skip
                    self._rollouts.sync(policy)
                    self.engine_generations = getattr(self, "engine_generations", 0) + 1
                    return self._rollouts.generate([list(p) for p in prompt_ids]), None
                except Exception as error:  # noqa: BLE001 - the same sampling through generate from here on
                    print(f"decode engine failed ({type(error).__name__}: {error}); sampling with generate",
                          file=sys.stderr, flush=True)  # fmt: skip
                    self._engine_off, self._rollouts = True, None
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)  # fmt: skip

        def _engine_applies(self, images, multimodal_fields) -> bool:
            import torch

            wanted = mode == "engine" or (mode == "auto" and torch.cuda.is_available())
            plain = (not self.use_vllm and not getattr(self, "use_transformers_continuous_batching", False)
                     and not images and not multimodal_fields and self.min_p is None
                     and (self.repetition_penalty or 1.0) == 1.0 and self.accelerator.num_processes == 1
                     and not self.args.generation_kwargs)  # fmt: skip
            return wanted and plain and not getattr(self, "_engine_off", False)

    return EngineGRPOTrainer




def time_limit_callback(limit_s: float | None):
    """A `TrainerCallback` that ends training once `limit_s` seconds of steps have passed."""
    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.t0 = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if limit_s is not None and time.monotonic() - self.t0 >= limit_s:
                print(f"time limit {limit_s:.0f}s reached at step {state.global_step}", flush=True)
                control.should_training_stop = True

    return TimeLimit()




def train_precision():
    """`train_precision.py`, the dtype rule."""
    return shared_module("train_precision")


def load_policy(args: argparse.Namespace, padding_side: str | None = None):
    """(tokenizer, model, use LoRA?, learning rate) for `--init`, `--lora` and `--lr`; the model in the dtype
    `train_precision` picks (bf16 for LoRA on a GPU, fp32 on CPU): `policy_precision` says which."""
    from transformers import AutoTokenizer

    kwargs = {"padding_side": padding_side} if padding_side else {}
    tokenizer = AutoTokenizer.from_pretrained(args.init, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model, _, use_lora, _ = train_precision().load_for_training(args.init, args.lora, LORA_AUTO_MIN_PARAMS)
    return tokenizer, model, use_lora, args.lr if args.lr is not None else (5e-5 if use_lora else 5e-6)


def policy_precision(model, use_lora: bool):
    """The `train_precision.Precision` that `load_policy` loaded `model` for (its trainer flags)."""
    return train_precision().choose_precision(sum(p.numel() for p in model.parameters()), use_lora)


def train_and_save(trainer, tokenizer, out: Path, use_lora: bool):
    """Train, merge the LoRA adapter, save atomically, drop the trainer's scratch dir; (result, t_trained)."""
    result = trainer.train()
    t_trained = time.monotonic()
    model = trainer.model.merge_and_unload() if use_lora else trainer.model
    save_checkpoint(model, tokenizer, out)
    shutil.rmtree(trainer.args.output_dir, ignore_errors=True)
    return result, t_trained


def mean_logged(history: list[dict], key: str) -> float | None:
    """Mean of a metric over the trainer's log history (None when it was never logged)."""
    values = [h[key] for h in history if key in h]
    return round(sum(values) / len(values), 4) if values else None


def main(argv: list[str] | None = None) -> int:
    """Train, merge, save atomically, print a one-line JSON summary prefixed with `TRAIN_SUMMARY`."""
    args = parse_args(argv)
    t_start = time.monotonic()
    out = Path(args.out)
    if out.exists():
        print(f"error: {out} already exists; pick a new --out", file=sys.stderr)
        return 2
    if args.batch_size % args.num_generations:
        print(f"error: --batch-size {args.batch_size} is not a multiple of --num-generations "
              f"{args.num_generations}", file=sys.stderr)  # fmt: skip
        return 2
    data = Path(args.data) if args.data else Path(os.environ.get("DATA_PATH", "data")) / "train.jsonl"

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers
    from trl import GRPOTrainer

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.set_seed(args.seed)
    tokenizer, model, use_lora, lr = load_policy(args)
    n_params = sum(p.numel() for p in model.parameters())
    t_loaded = time.monotonic()

    rows = read_rows(data)
    random.Random(args.seed).shuffle(rows)
    prompts_needed = args.max_steps * args.batch_size // args.num_generations
    prompts = []
    for row in rows:
        example = to_prompt(row)
        ids = tokenizer.apply_chat_template(example["prompt"], tokenize=True, add_generation_prompt=True)
        if len(ids["input_ids"] if hasattr(ids, "keys") else ids) <= args.max_prompt_tokens:
            prompts.append(example)
            if len(prompts) >= prompts_needed:
                break
    if not rows:
        print(f"error: {data} has no question with a numeric answer: this trainer's rule reward is GSM8K's; "
              "interactive tasks use train_grpo_env.py", file=sys.stderr)  # fmt: skip
        return 3
    if not prompts:
        print(f"error: no question of {data} fits --max-prompt-tokens {args.max_prompt_tokens}", file=sys.stderr)
        return 3
    print(
        f"init={args.init} params={n_params:,} lora={use_lora} lr={lr} steps={args.max_steps} "
        f"batch={args.batch_size} generations={args.num_generations} max_completion={args.max_completion_length} "
        f"prompts={len(prompts)}/{len(rows)} time_limit={args.time_limit} load_s={t_loaded - t_start:.1f}",
        flush=True,
    )

    trainer_dir = out.parent / f".{out.name}.trainer-{os.getpid()}"
    trainer = engine_trainer(GRPOTrainer, args.rollouts)(
        model=model,
        reward_funcs=[correctness_reward, format_reward],
        args=grpo_config(args, lr, trainer_dir, policy_precision(model, use_lora)),
        train_dataset=datasets.Dataset.from_list(prompts),
        processing_class=tokenizer,
        peft_config=lora_config(model, args) if use_lora else None,
        callbacks=[time_limit_callback(args.time_limit)],
    )
    t_train = time.monotonic()
    result, t_trained = train_and_save(trainer, tokenizer, out, use_lora)
    t_end = time.monotonic()

    steps = trainer.state.global_step
    history = trainer.state.log_history
    train_s = t_trained - t_train
    summary = {
        "out": str(out),
        "method": "GRPO",
        "lora": use_lora,
        "lr": lr,
        "steps": steps,
        "completions_seen": steps * args.batch_size,
        "train_loss": round(float(result.training_loss), 4),
        "reward_mean": mean_logged(history, "reward"),
        "correct_mean": mean_logged(history, "rewards/correctness_reward/mean"),
        "format_mean": mean_logged(history, "rewards/format_reward/mean"),
        "load_s": round(t_loaded - t_start, 1),
        "train_s": round(train_s, 1),
        "s_per_step": round(train_s / max(1, steps), 2),
        "save_s": round(t_end - t_trained, 1),
        "total_s": round(t_end - t_start, 1),
    }
    summary["engine_generations"] = getattr(trainer, "engine_generations", 0)
    print(f"GRPO: {steps} steps, mean reward {summary['reward_mean']}, correct {summary['correct_mean']}", flush=True)
    print(SUMMARY_PREFIX + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
