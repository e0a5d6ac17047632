"""GRPO with online rollouts in an interactive task's environment, in plain PyTorch, with a loop penalty.

One step: `goals_per_step` training goals, `group_size` sampled episodes each, played in lockstep in the
task's own environment (``data/envlib.zip``) under the evaluator's own prompts, step limit and action parsing.
An episode's reward is the environment's reward minus ``loop_penalty`` times the share of its actions that
repeat an earlier action of the same episode (lost episodes mostly loop). Advantages are the rewards
normalised within each goal's group; every step of an episode is one sample (its prompt exactly as the
evaluator shows it, its sampled action tokens), and the policy-gradient loss is
``-advantage * log-prob(action tokens)`` averaged over the action tokens of the batch, one optimizer step per
iteration (on-policy, no KL term).

Stand-alone: copied into the workspace's ``code/`` and imported by the agent; imports nothing from the harness.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

try:  # in a workspace: the copy beside this file
    from sft_torch import autocast
except ImportError:  # in the harness's source tree
    from agents.reference_sft_grpo.sft_torch import autocast


def import_envlib(data_dir: Path):
    """The task's environments, as shipped in the workspace (`data/envlib.zip`)."""
    zip_path = str(Path(data_dir) / "envlib.zip")
    if zip_path not in sys.path:
        sys.path.insert(0, zip_path)
    import envlib

    return envlib


def normalise_action(action: str) -> str:
    return " ".join(action.lower().split())


def repeat_fraction(actions: list[str]) -> float:
    """Share of the actions that repeat an earlier action of the same episode (0 for an empty episode).

    >>> repeat_fraction(["go to desk 1", "look", "go to desk 1", "Go to  desk 1"])
    0.5
    """
    seen: set[str] = set()
    repeats = 0
    for action in actions:
        key = normalise_action(action)
        repeats += key in seen
        seen.add(key)
    return repeats / len(actions) if actions else 0.0


def shaped_reward(env_reward: float, actions: list[str], loop_penalty: float) -> float:
    """The environment's reward minus the loop penalty."""
    return float(env_reward) - loop_penalty * repeat_fraction(actions)


def group_advantages(rewards: list[float], group_size: int) -> list[float]:
    """Rewards normalised within consecutive groups of `group_size` (GRPO); a group whose rewards are all
    equal gets advantage 0 (it says nothing about which behaviour is better)."""
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards are not whole groups of {group_size}")
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / group_size
        std = (sum((r - mean) ** 2 for r in group) / group_size) ** 0.5
        out += [(r - mean) / (std + 1e-4) if std > 1e-6 else 0.0 for r in group]
    return out


@dataclass
class Rollout:
    """One episode: its outcome and, per step, the prompt's and the sampled action's token ids."""

    goal_id: str
    steps: list[tuple[list[int], list[int]]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    reward: float = 0.0
    won: bool = False


def real_length(ids: list[int], tokenizer, stop: str, eos_ids: set[int]) -> int:
    """Tokens through the first end-of-sequence or the token that completes the stop string."""
    for i, token in enumerate(ids):
        if token in eos_ids:
            return i + 1
        if stop and stop in tokenizer.decode(ids[: i + 1], skip_special_tokens=True):
            return i + 1
    return len(ids)


def sampler(model, tokenizer, *, max_new_tokens: int, temperature: float, stop: str):
    """A batched sampling policy: conversations -> [(prompt ids, action ids, text cut at the stop)]."""
    import torch

    eos_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    device = next(model.parameters()).device

    def sample(conversations: list[list[dict]]) -> list[tuple[list[int], list[int], str]]:
        texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad(), autocast(device):
            out = model.generate(**batch, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                                 max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 stop_strings=[stop], tokenizer=tokenizer)  # fmt: skip
        width = batch["input_ids"].shape[1]
        results = []
        for row in range(len(texts)):
            prompt = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
            new = out[row, width:].tolist()
            new = new[: real_length(new, tokenizer, stop, eos_ids)]
            text = tokenizer.decode(new, skip_special_tokens=True).split(stop, 1)[0].strip()
            results.append((prompt, new, text))
        return results

    return sample


def play(envlib, task: str, data_dir: Path, goals: list[dict], sample, max_steps: int, seed: int,
         deadline: float | None = None) -> list[Rollout]:
    """One episode per goal, in lockstep (one `sample` call per step for the live episodes), with the
    evaluator's environment, prompts and action parsing. Past `deadline` (monotonic clock) no further step is
    played: the episodes still running end there, unfinished (reward 0, like an episode out of steps)."""
    make_env, prompter = envlib.make_env(task, data_dir), envlib.prompter(task)
    envs = [make_env() for _ in goals]
    first = [env.reset(goal, seed=seed + i)[0] for i, (env, goal) in enumerate(zip(envs, goals))]
    turns: list[list[dict]] = [[] for _ in goals]
    rollouts = [Rollout(goal_id=str(g.get("id", i))) for i, g in enumerate(goals)]
    done = [False] * len(goals)
    for _ in range(max_steps):
        live = [i for i in range(len(goals)) if not done[i]]
        if not live or (deadline is not None and time.monotonic() > deadline):
            break
        samples = sample([prompter(goals[i], first[i], turns[i]) for i in live])
        for i, (prompt_ids, action_ids, text) in zip(live, samples):
            action = envlib.parse_action(text)
            result = envs[i].step(action)
            turns[i].append({"completion": text, "action": action, "observation": result.observation,
                             "reward": result.reward})  # fmt: skip
            r = rollouts[i]
            r.steps.append((prompt_ids, action_ids))
            r.actions.append(action)
            r.reward, r.won, done[i] = float(result.reward), bool(result.info.get("won", False)), bool(result.done)
    return rollouts


@dataclass
class StepStats:
    episodes: int
    wins: int
    mean_reward: float
    """Mean shaped reward (environment reward minus loop penalty)."""
    mean_repeat: float
    samples: int
    """Steps that carried a non-zero advantage into the loss."""
    loss: float
    update_s: float


class GRPOEnv:
    """GRPO steps on one loaded model; its own optimizer across the session's GRPO rounds."""

    def __init__(self, model, tokenizer, envlib, task: str, data_dir: Path, *, lr: float, goals_per_step: int,
                 group_size: int, max_episode_steps: int, temperature: float, loop_penalty: float, seed: int,
                 micro_batch: int = 16, max_new_tokens: int = 32, max_grad_norm: float = 1.0):  # fmt: skip
        import torch

        self.model, self.tokenizer, self.envlib, self.task, self.data_dir = model, tokenizer, envlib, task, data_dir
        self.goals_per_step, self.group_size, self.loop_penalty = goals_per_step, group_size, loop_penalty
        self.max_episode_steps = min(max_episode_steps, envlib.MAX_STEPS.get(task, max_episode_steps))
        self.micro_batch, self.max_grad_norm = micro_batch, max_grad_norm
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        self.goals = envlib.load_goals(data_dir)
        self.rng = random.Random(seed)
        self.seed = seed * 100_003
        self.sample = sampler(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature,
                              stop=envlib.STOP)  # fmt: skip
        self.steps_done = 0

    def rollouts(self, deadline: float | None = None) -> list[Rollout]:
        goals = self.rng.sample(self.goals, min(self.goals_per_step, len(self.goals)))
        grouped = [g for g in goals for _ in range(self.group_size)]
        self.seed += len(grouped)
        self.model.eval()
        return play(self.envlib, self.task, self.data_dir, grouped, self.sample, self.max_episode_steps, self.seed,
                    deadline)  # fmt: skip

    def grpo_step(self, deadline: float | None = None) -> StepStats:
        """Rollouts (cut at `deadline`), then one update."""
        rollouts = self.rollouts(deadline)
        rewards = [shaped_reward(r.reward, r.actions, self.loop_penalty) for r in rollouts]
        advantages = group_advantages(rewards, self.group_size)
        samples = [(p, a, adv) for r, adv in zip(rollouts, advantages) if adv != 0.0 for p, a in r.steps if a]
        t_update = time.monotonic()
        loss = self.update(samples)
        self.steps_done += 1
        n = len(rollouts)
        return StepStats(n, sum(r.won for r in rollouts), round(sum(rewards) / n, 4),
                         round(sum(repeat_fraction(r.actions) for r in rollouts) / n, 4), len(samples),
                         round(loss, 5), round(time.monotonic() - t_update, 2))  # fmt: skip

    def update(self, samples: list[tuple[list[int], list[int], float]]) -> float:
        """One optimizer step on `-advantage * log p(action)`, summed over action tokens / their number."""
        import torch

        if not samples:
            return 0.0
        self.model.train()
        total_tokens = sum(len(a) for _, a, _ in samples)
        samples = sorted(samples, key=lambda s: len(s[0]) + len(s[1]))
        loss_sum = 0.0
        for start in range(0, len(samples), self.micro_batch):
            chunk = samples[start : start + self.micro_batch]
            width = max(len(p) + len(a) for p, a, _ in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            weights = torch.zeros((len(chunk), width), dtype=torch.float32)
            for row, (p, a, adv) in enumerate(chunk):
                ids[row, : len(p) + len(a)] = torch.tensor(p + a)
                mask[row, : len(p) + len(a)] = 1
                weights[row, len(p) : len(p) + len(a)] = adv
            ids, mask, weights = ids.to(self.device), mask.to(self.device), weights.to(self.device)
            with autocast(self.device):
                logits = self.model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            log_probs = torch.log_softmax(logits.float(), dim=-1)
            token_log_probs = log_probs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            loss = -(weights[:, 1:] * token_log_probs).sum() / total_tokens
            loss.backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return loss_sum

    def train(self, seconds: float, max_steps: int | None = None) -> tuple[int, list[StepStats], float]:
        """Steps until the next would end past `seconds` (judged by the last one) or `max_steps`. Rollouts stop
        early enough for the update to end in time too, so even the first step keeps to `seconds`."""
        t0 = last = time.monotonic()
        stats: list[StepStats] = []
        update_s = 0.2 * seconds  # a guess until an update has been timed
        while max_steps is None or len(stats) < max_steps:
            stats.append(self.grpo_step(deadline=t0 + seconds - update_s))
            update_s = max(stats[-1].update_s, 0.5)
            now = time.monotonic()
            if now - t0 + (now - last) > seconds:
                break
            last = now
        return len(stats), stats, round(time.monotonic() - t0, 1)
