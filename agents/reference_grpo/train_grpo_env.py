"""GRPO with online rollouts in an interactive task's environment (alfworld, webshop, deepsearchqa), with TRL.

Each GRPO group is `--num-generations` episodes of one training goal, played by the current policy (sampled)
in the task's own environment from the workspace's `data/envlib.zip`, in lockstep: one batched `generate` per
step over the live episodes, with the evaluator's own prompts. An episode is one GRPO sample: its first prompt
is the prompt, the rest of the conversation (actions and observations) the completion, with the observations
masked out of the loss (TRL's `env_mask`); its reward is the environment's episode reward. LoRA merged before
saving.

The policy samples under the evaluator's prompts, which show the last few steps only; the training sequence
holds the whole episode. The two agree for episodes no longer than that window (see `history_prompt`).

Stand-alone: run by the reference agent as its own process, so it imports nothing from the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

LORA_AUTO_MIN_PARAMS = 50_000_000
SUMMARY_PREFIX = "TRAIN_SUMMARY "


def import_envlib(data_dir: Path):
    """The task's environments, as shipped in the workspace (`data/envlib.zip`). Each zip holds its own task's
    only, so an `envlib` already imported from another workspace (several tasks in one process) is dropped."""
    zip_path = str(Path(data_dir) / "envlib.zip")
    if not getattr(sys.modules.get("envlib"), "__file__", zip_path + "/").startswith(zip_path + "/"):
        for name in [n for n in sys.modules if n.split(".")[0] == "envlib"]:
            del sys.modules[name]
    while zip_path in sys.path:
        sys.path.remove(zip_path)
    sys.path.insert(0, zip_path)
    import envlib

    return envlib


def render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def episode_tokens(tokenizer, prompt: list[dict], turns: list[dict], max_tokens: int) -> tuple[list, list, list]:
    """(prompt ids, completion ids, env mask) of an episode: each action (with its end-of-turn) is the model's
    (mask 1), each observation and the next turn's header the environment's (mask 0). Turns past `max_tokens`
    completion tokens are dropped."""

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    messages = list(prompt)
    before = render(tokenizer, messages, True)
    prompt_ids, completion, mask = ids(before), [], []
    for turn in turns:
        messages.append({"role": "assistant", "content": turn["action"]})
        after_action = render(tokenizer, messages, False)
        messages.append({"role": "user", "content": f"Observation: {turn['observation']}"})
        after_obs = render(tokenizer, messages, True)
        if not (after_action.startswith(before) and after_obs.startswith(after_action)):
            raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
        action_ids, obs_ids = ids(after_action[len(before):]), ids(after_obs[len(after_action):])
        if completion and len(completion) + len(action_ids) > max_tokens:
            break
        completion += action_ids
        mask += [1] * len(action_ids)
        if len(completion) + len(obs_ids) > max_tokens:
            break
        completion += obs_ids
        mask += [0] * len(obs_ids)
        before = after_obs
    return prompt_ids, completion, mask


def sampling_policy(model, tokenizer, max_new_tokens: int, temperature: float, stop: str):
    """A batched policy for `envlib.run_episodes`: one sampled `generate` call for all live episodes."""
    import torch

    def policy(conversations: list[list[dict]]) -> list[str]:
        texts = [render(tokenizer, c, True) for c in conversations]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        with torch.no_grad():
            out = model.generate(**batch, do_sample=True, temperature=temperature, top_p=1.0,
                                 max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        new = out[:, batch["input_ids"].shape[1]:]
        return [t.split(stop, 1)[0].strip() for t in tokenizer.batch_decode(new, skip_special_tokens=True)]

    return policy


class Rollouts:
    """TRL's `rollout_func`: plays the episodes of a batch and returns them as token sequences."""

    def __init__(self, envlib, task: str, data_dir: Path, goals: list[dict], args: argparse.Namespace, tokenizer):
        self.envlib, self.task, self.args, self.tokenizer = envlib, task, args, tokenizer
        self.make_env = envlib.make_env(task, data_dir)
        self.prompter = envlib.prompter(task)
        self.max_steps = min(args.max_episode_steps, envlib.MAX_STEPS[task])
        self.by_prompt = {json.dumps(self.first_prompt(g)): g for g in goals}
        self.episodes = self.wins = 0
        self.reward_sum = 0.0
        self.seed = args.seed * 100_003

    def first_prompt(self, goal: dict) -> list[dict]:
        observation, _ = self.make_env().reset(goal, seed=0)
        return self.prompter(goal, observation, [])

    def __call__(self, prompts: list, trainer) -> dict:
        goals = [self.by_prompt[json.dumps(p)] for p in prompts]
        a = self.args
        policy = sampling_policy(trainer.model, self.tokenizer, a.max_new_tokens, a.temperature, self.envlib.STOP)
        self.seed += len(goals)
        episodes = self.envlib.run_episodes(self.make_env, goals, policy, self.prompter, self.max_steps, self.seed)
        out = {"prompt_ids": [], "completion_ids": [], "env_mask": [], "logprobs": None, "episode_reward": []}
        for goal, ep in zip(goals, episodes):
            prompt_ids, completion, mask = episode_tokens(self.tokenizer, self.prompter(goal, ep.observation, []),
                                                          ep.turns, a.max_completion_tokens)  # fmt: skip
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion)
            out["env_mask"].append(mask)
            out["episode_reward"].append(float(ep.reward))
        self.episodes += len(episodes)
        self.wins += sum(bool(ep.won) for ep in episodes)
        self.reward_sum += sum(float(ep.reward) for ep in episodes)
        return out


def episode_reward(completions: list, episode_reward: list[float], **kwargs) -> list[float]:
    """The environment's reward of each episode (passed through from the rollouts)."""
    return list(episode_reward)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init", required=True, help="HF checkpoint directory to start from")
    p.add_argument("--out", required=True, help="directory to write the merged checkpoint to (must not exist)")
    p.add_argument("--task", default=os.environ.get("TASK"), help="alfworld, webshop or deepsearchqa (default: $TASK)")
    p.add_argument("--data", default=None, help="the workspace's data dir (default: $DATA_PATH, else data)")
    p.add_argument("--max-steps", type=int, default=4, help="optimizer steps")
    p.add_argument("--goals-per-step", type=int, default=2, help="training goals per step (one group each)")
    p.add_argument("--num-generations", type=int, default=4, help="episodes per goal (the group)")
    p.add_argument("--max-episode-steps", type=int, default=10, help="cap on steps per training episode")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per action")
    p.add_argument("--max-completion-tokens", type=int, default=1024, help="longer episodes are cut for the loss")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: 5e-5 with LoRA, 5e-6 without)")
    p.add_argument("--lora", action=argparse.BooleanOptionalAction, default=None,
                   help=f"LoRA, merged at the end (default: on for models over {LORA_AUTO_MIN_PARAMS:,} parameters)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--time-limit", type=float, default=None, help="stop training after this many seconds of steps")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, merge, save atomically, print a one-line JSON summary prefixed with `TRAIN_SUMMARY`."""
    args = parse_args(argv)
    t_start = time.monotonic()
    out = Path(args.out)
    if out.exists():
        print(f"error: {out} already exists; pick a new --out", file=sys.stderr)
        return 2
    data_dir = Path(args.data or os.environ.get("DATA_PATH", "data"))
    if not (data_dir / "envlib.zip").exists():
        print(f"error: {data_dir}/envlib.zip is missing: {args.task!r} is not an interactive task", file=sys.stderr)
        return 2

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import datasets
    import torch
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    # Shared with train_grpo.py, which lies beside this file in a workspace as in the source tree.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_grpo import load_policy, lora_config, time_limit_callback, train_and_save

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.set_seed(args.seed)
    envlib = import_envlib(data_dir)
    tokenizer, model, use_lora, lr = load_policy(args, padding_side="left")
    n_params = sum(p.numel() for p in model.parameters())

    goals = envlib.load_goals(data_dir)
    random.Random(args.seed).shuffle(goals)
    goals = goals[: args.max_steps * args.goals_per_step]
    rollouts = Rollouts(envlib, args.task, data_dir, goals, args, tokenizer)
    prompts = [{"prompt": json.loads(key)} for key in rollouts.by_prompt]
    t_loaded = time.monotonic()
    print(f"task={args.task} init={args.init} params={n_params:,} lora={use_lora} lr={lr} steps={args.max_steps} "
          f"goals={len(prompts)} group={args.num_generations} episode_steps<={rollouts.max_steps} "
          f"time_limit={args.time_limit} load_s={t_loaded - t_start:.1f}", flush=True)  # fmt: skip

    use_cuda = torch.cuda.is_available()
    trainer_dir = out.parent / f".{out.name}.trainer-{os.getpid()}"
    config = GRPOConfig(
        output_dir=str(trainer_dir), max_steps=args.max_steps, learning_rate=lr, beta=0.0,
        per_device_train_batch_size=args.goals_per_step * args.num_generations, num_generations=args.num_generations,
        logging_steps=1, save_strategy="no", report_to="none", bf16=False, fp16=False, gradient_checkpointing=False,
        use_cpu=not use_cuda, dataloader_pin_memory=use_cuda, disable_tqdm=True, seed=args.seed, data_seed=args.seed,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, reward_funcs=[episode_reward], args=config, train_dataset=datasets.Dataset.from_list(prompts),
        processing_class=tokenizer, peft_config=lora_config(model, args) if use_lora else None,
        rollout_func=rollouts, callbacks=[time_limit_callback(args.time_limit)],
    )  # fmt: skip
    t_train = time.monotonic()
    result, t_trained = train_and_save(trainer, tokenizer, out, use_lora)
    t_end = time.monotonic()

    steps = trainer.state.global_step
    episodes = max(1, rollouts.episodes)
    summary = {
        "out": str(out), "method": "GRPO-env", "task": args.task, "lora": use_lora, "lr": lr, "steps": steps,
        "episodes": rollouts.episodes, "win_rate": round(rollouts.wins / episodes, 4),
        "reward_mean": round(rollouts.reward_sum / episodes, 4), "train_loss": round(float(result.training_loss), 4),
        "load_s": round(t_loaded - t_start, 1), "train_s": round(t_trained - t_train, 1),
        "s_per_step": round((t_trained - t_train) / max(1, steps), 2), "save_s": round(t_end - t_trained, 1),
        "total_s": round(t_end - t_start, 1),
    }  # fmt: skip
    print(f"GRPO-env: {steps} steps, {rollouts.episodes} episodes, mean reward {summary['reward_mean']}", flush=True)
    print(SUMMARY_PREFIX + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
