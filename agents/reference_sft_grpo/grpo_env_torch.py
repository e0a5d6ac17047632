"""GRPO (or GiGPO) with online rollouts in an interactive task's environment, in plain PyTorch.

One step: `goals_per_step` training goals, `group_size` sampled episodes each (a group's episodes start from the
same game), played in lockstep in the task's own environment (``data/envlib.zip``) under the evaluator's own
prompts, step limit (training episodes are capped at the evaluator's, ``envlib.MAX_STEPS``) and action parsing.
An episode's return is the environment's reward alone (won or not): the update is about winning. Shaping is
optional and small: a repeated action (``loop_penalty``) or one the environment refused ("Nothing happens.",
``invalid_penalty``) costs its own step that much, UNnormalised, added to the advantages after the group
normalisation and only in groups whose returns differ, so it is never the whole signal of a group. Episodes cut
by the round's deadline are dropped from the update (their outcome is unknown, not a loss).

Every step of an episode is one sample: its prompt exactly as the evaluator shows it and its sampled action
tokens. Each update takes `epochs` x `minibatches` optimizer steps over the rollout batch with the clipped
objective of PPO / GRPO: per action token ``-min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)``, ``r`` the
ratio of the policy's probability to that of the policy that sampled the batch (its log-probs taken once, right
after the rollouts, from the sampler's own weights, at the sampling temperature), averaged per episode over its
action tokens, then over the episodes (a 50-step loss weighs what an 8-step win does). The learning rate warms
up, then decays (cosine). A trust region: with ``kl_target``, an update stops taking minibatches once one's
approximate KL to the sampler passes 1.5 x the target, and the rate is adapted toward it (halved above 2 x,
raised by half below half of it, back up to the peak but never past it: at 2 x the peak a policy from a strong SFT
collapsed); the sampling policy's entropy is watched, and
three rises in a row (`entropy_alarm`) end the round so that the session rolls back to its best checkpoint.

Advantages:
* ``grpo``: the episode's return normalised within its group, the same for each of its steps;
* ``gigpo`` (GiGPO, Feng et al. 2025): that episode-level advantage plus a step-level one: the steps of a
  group that start from the same environment state (an "anchor" state, `state_key`) are compared on their
  discounted return-to-go, so the action that led on from a shared state gets the credit, not the episode.

Rollouts on CUDA sample from a bf16 copy of the policy through the static-cache decode engine
(`decode_engine.py`: CUDA graphs, sampling and stop detection on the device, the shared system prompt prefilled
once per step), synchronised after every update; on the CPU they use `generate`.

Stand-alone: copied into the workspace's ``code/`` and imported by the agent; imports nothing from the harness.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path

try:  # in a workspace: the copies beside this file
    from search_demos import import_envlib  # noqa: F401 - the task's environments, for this module's users
    from sft_torch import MIN_SHARED_PREFIX as MIN_TRAIN_PREFIX
    from sft_torch import autocast, shared_prefix_length, target_log_probs
    from train_grpo import import_decode_engine
except ImportError:  # in the harness's source tree
    from a2rl_bench.agents.reference_grpo.train_grpo import import_decode_engine
    from a2rl_bench.agents.reference_sft_grpo.search_demos import import_envlib  # noqa: F401
    from a2rl_bench.agents.reference_sft_grpo.sft_torch import MIN_SHARED_PREFIX as MIN_TRAIN_PREFIX
    from a2rl_bench.agents.reference_sft_grpo.sft_torch import autocast, shared_prefix_length, target_log_probs

ALGORITHMS = ("grpo", "gigpo")
MAX_LR_SCALE = 1.0
"""The trust region's adaptation lowers the peak rate and brings it back, never raises it past the peak."""
INVALID_OBSERVATION = "Nothing happens"
"""How ALFWorld (and its offline stand-in) answers a command it cannot carry out."""
MIN_SHARED_PREFIX = 32
"""Shortest common token prefix of a step's prompts worth prefilling once."""


# -- rewards -----------------------------------------------------------------------------------------------
def normalise_action(action: str) -> str:
    return " ".join(action.lower().split())


def repeat_flags(actions: list[str]) -> list[bool]:
    """For each action, whether it repeats an earlier action of the same episode."""
    seen: set[str] = set()
    flags = []
    for action in actions:
        key = normalise_action(action)
        flags.append(key in seen)
        seen.add(key)
    return flags


def repeat_fraction(actions: list[str]) -> float:
    """Share of the actions that repeat an earlier action of the same episode (0 for an empty episode).

    >>> repeat_fraction(["go to desk 1", "look", "go to desk 1", "Go to  desk 1"])
    0.5
    """
    return sum(repeat_flags(actions)) / len(actions) if actions else 0.0


def invalid_action(observation: str) -> bool:
    return observation.strip().startswith(INVALID_OBSERVATION)


def shaped_reward(env_reward: float, actions: list[str], loop_penalty: float, invalid: list[bool] = (),
                  invalid_penalty: float = 0.0) -> float:  # fmt: skip
    """The environment's reward minus the loop penalty and the invalid-action penalty (each times a share)."""
    invalid_share = sum(invalid) / len(actions) if actions else 0.0
    return float(env_reward) - loop_penalty * repeat_fraction(actions) - invalid_penalty * invalid_share


def step_rewards(env_reward: float, actions: list[str], invalid: list[bool], loop_penalty: float,
                 invalid_penalty: float) -> list[float]:  # fmt: skip
    """Per-step rewards that sum to `shaped_reward`: each penalty charged to the step that earned it, the
    environment's reward to the last step (these environments pay it when the episode ends)."""
    if not actions:
        return []
    n = len(actions)
    rewards = [-(loop_penalty * rep + invalid_penalty * bad) / n
               for rep, bad in zip(repeat_flags(actions), list(invalid) + [False] * (n - len(invalid)))]  # fmt: skip
    rewards[-1] += float(env_reward)
    return rewards


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """Return-to-go of each step: r_t + gamma r_{t+1} + gamma^2 r_{t+2} + ..."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def _normalised(values: list[float]) -> list[float]:
    """(v - mean) / std within the list; all zero when the values are equal (no signal)."""
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return [(v - mean) / (std + 1e-4) if std > 1e-6 else 0.0 for v in values]


def group_advantages(rewards: list[float], group_size: int) -> list[float]:
    """Rewards normalised within consecutive groups of `group_size` (GRPO); a group whose rewards are all
    equal gets advantage 0 (it says nothing about which behaviour is better)."""
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards are not whole groups of {group_size}")
    out = []
    for start in range(0, len(rewards), group_size):
        out += _normalised(rewards[start : start + group_size])
    return out


@dataclass
class Rollout:
    """One episode: its outcome and, per step, the prompt's and the sampled action's token ids."""

    goal_id: str
    steps: list[tuple[list[int], list[int]]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    invalid: list[bool] = field(default_factory=list)
    state_keys: list[Hashable] = field(default_factory=list)
    """The environment state each action was taken from (GiGPO's anchor states)."""
    reward: float = 0.0
    won: bool = False
    cut: bool = False
    """Stopped by the round's deadline, not by the game or its step limit: dropped from the update."""


def step_advantages(rollouts: list[Rollout], group_size: int, *, algorithm: str, loop_penalty: float,
                    invalid_penalty: float, gamma: float = 0.95, step_weight: float = 1.0) -> list[list[float]]:  # fmt: skip
    """One advantage per step of each rollout (rollouts in consecutive groups of `group_size`).

    The return is the environment's reward (win-only), normalised within the group over its episodes that were
    not cut by the deadline (cut ones get 0 everywhere: they leave the update). GiGPO adds the step-level
    advantage over anchor states. Then, in groups with a signal only, each step's own penalty (`loop_penalty`
    if it repeats an earlier action, `invalid_penalty` if the environment refused it) is subtracted as is."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS} (got {algorithm!r})")
    if group_size < 1 or len(rollouts) % group_size:
        raise ValueError(f"{len(rollouts)} rollouts are not whole groups of {group_size}")
    out = [[0.0] * len(r.steps) for r in rollouts]
    for start in range(0, len(rollouts), group_size):
        members = [i for i in range(start, start + group_size) if not rollouts[i].cut]
        if len(members) < 2:
            continue
        episode = _normalised([float(rollouts[i].reward) for i in members])
        if not any(episode):  # all won or all lost: nothing says which behaviour is better
            continue
        for i, adv in zip(members, episode):
            out[i] = [adv] * len(rollouts[i].steps)
        if algorithm == "gigpo":
            anchors: dict[Hashable, list[tuple[int, int, float]]] = defaultdict(list)
            for i in members:
                r = rollouts[i]
                rewards = step_rewards(r.reward, r.actions, r.invalid, 0.0, 0.0)
                for t, (key, ret) in enumerate(zip(r.state_keys, discounted_returns(rewards, gamma))):
                    anchors[key].append((i, t, ret))
            for same_state in anchors.values():
                if len(same_state) < 2:
                    continue
                for (i, t, _), adv in zip(same_state, _normalised([ret for _, _, ret in same_state])):
                    out[i][t] += step_weight * adv
        if loop_penalty or invalid_penalty:
            for i in members:
                r = rollouts[i]
                for t, (rep, bad) in enumerate(zip(repeat_flags(r.actions), r.invalid)):
                    out[i][t] -= loop_penalty * rep + invalid_penalty * bad
    return out


# -- sampling ------------------------------------------------------------------------------------------------
Sample = tuple[list[int], list[int], str]
"""(prompt ids, action ids through the stop, action text cut at the stop)."""


def real_length(ids: list[int], tokenizer, stop: str, eos_ids: set[int]) -> int:
    """Tokens through the first end-of-sequence or the token that completes the stop string."""
    for i, token in enumerate(ids):
        if token in eos_ids:
            return i + 1
        if stop and stop in tokenizer.decode(ids[: i + 1], skip_special_tokens=True):
            return i + 1
    return len(ids)


def _render(tokenizer, conversations: list[list[dict]]) -> list[list[int]]:
    texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def sampler(model, tokenizer, *, max_new_tokens: int, temperature: float, stop: str):
    """A batched sampling policy with `generate` (the CPU path): conversations -> [Sample]."""
    import torch

    eos_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    device = next(model.parameters()).device

    def sample(conversations: list[list[dict]]) -> list[Sample]:
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


class EngineSampler:
    """Sampled actions from a bf16 copy of the policy through the decode engine (CUDA graphs, sampling and stop
    detection on the device, the shared prompt prefix prefilled once). `sync()` after every update."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int, temperature: float, stop: str, seed: int):
        import copy

        import torch

        engine = import_decode_engine()
        self.engine, self.policy, self.tokenizer = engine, model, tokenizer
        self.copy = copy.deepcopy(model).to(dtype=torch.bfloat16).eval()
        for p in self.copy.parameters():
            p.requires_grad_(False)
        self.decoder = engine.Decoder(self.copy, use_graph=True, chunk=8)
        eos_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id, *_list(self.copy.generation_config.eos_token_id)}
        self.stop_text = stop
        self.stop = engine.StopTokens.build(tokenizer, [stop], eos_ids - {None})
        self.sampling = engine.Sampling(temperature=temperature)
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.seed, self.calls, self.tokens = seed, 0, 0
        self.fallback = None

    def sync(self) -> None:
        """Copy the policy's current weights into the rollout copy (in place: captured graphs stay valid)."""
        import torch

        if self.fallback is not None:
            return
        with torch.no_grad():
            for mine, theirs in zip(self.copy.parameters(), self.policy.parameters()):
                mine.copy_(theirs)
        self.decoder.weights_changed()

    def __call__(self, conversations: list[list[dict]]) -> list[Sample]:
        if self.fallback is None:
            try:
                return self._sample(conversations)
            except Exception as error:  # noqa: BLE001 - the same policy through generate from here on
                print(f"decode engine failed ({type(error).__name__}: {error}); sampling with generate from now on",
                      file=sys.stderr, flush=True)  # fmt: skip
                self.fallback = sampler(self.policy, self.tokenizer, max_new_tokens=self.max_new_tokens,
                                        temperature=self.temperature, stop=self.stop_text)  # fmt: skip
                self.copy = self.decoder = None  # its memory back to the trainer
        return self.fallback(conversations)

    def _sample(self, conversations: list[list[dict]]) -> list[Sample]:
        rows = _render(self.tokenizer, conversations)
        prefix_ids = self.engine.shared_prefix(rows)
        prefix = self.decoder.cached_prefix(prefix_ids) if len(prefix_ids) >= MIN_SHARED_PREFIX else None
        p = prefix.length if prefix else 0
        seeds = self.engine.row_seeds(self.seed * 1_000_003 + self.calls, len(rows))
        self.calls += 1
        new = self.decoder.decode([r[p:] for r in rows], self.max_new_tokens, None, self.pad, prefix,
                                  sampling=self.sampling, seeds=seeds, stop=self.stop)  # fmt: skip
        out = []
        for prompt, tokens in zip(rows, new):
            tokens = self.stop.cut(tokens)
            self.tokens += len(tokens)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True).split(self.stop_text, 1)[0].strip()
            out.append((prompt, tokens, text))
        return out


def greedy_sampler(model, tokenizer, *, max_new_tokens: int, stop: str):
    """The policy's own greedy actions through the decode engine (graphs on CUDA): a win rate to watch, as the
    evaluator decodes. The engine reads the weights in place, so it follows the policy through updates."""
    engine = import_decode_engine()
    decoder = engine.Decoder(model, use_graph=True, chunk=8)
    eos = {tokenizer.eos_token_id, tokenizer.pad_token_id, *_list(model.generation_config.eos_token_id)} - {None}
    stops = engine.StopTokens.build(tokenizer, [stop], eos)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def sample(conversations: list[list[dict]]) -> list[Sample]:
        rows = _render(tokenizer, conversations)
        out = []
        for prompt, tokens in zip(rows, decoder.decode(rows, max_new_tokens, None, pad, stop=stops)):
            tokens = stops.cut(tokens)
            out.append((prompt, tokens, tokenizer.decode(tokens, skip_special_tokens=True).split(stop, 1)[0].strip()))
        return out

    return sample


def _list(value) -> list:
    return value if isinstance(value, list) else [value] if value is not None else []


def make_sampler(model, tokenizer, *, max_new_tokens: int, temperature: float, stop: str, seed: int,
                 engine: str = "auto") -> Callable[[list[list[dict]]], list[Sample]]:  # fmt: skip
    """The engine sampler on CUDA (or when `engine == "engine"`), `generate` otherwise or if it cannot start."""
    device = next(model.parameters()).device
    if engine == "engine" or (engine == "auto" and device.type == "cuda"):
        try:
            return EngineSampler(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature,
                                 stop=stop, seed=seed)  # fmt: skip
        except Exception as error:  # noqa: BLE001 - any engine failure: the same policy through generate
            print(f"decode engine unavailable ({type(error).__name__}: {error}); sampling with generate",
                  file=sys.stderr, flush=True)  # fmt: skip
    return sampler(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, stop=stop)


# -- rollouts ------------------------------------------------------------------------------------------------
def play(envlib, task: str, data_dir: Path, goals: list[dict], sample, max_steps: int, seed: int,
         deadline: float | None = None) -> list[Rollout]:  # fmt: skip
    """One episode per goal, in lockstep (one `sample` call per step for the live episodes), with the
    evaluator's environment, prompts and action parsing. Past `deadline` (monotonic clock) no further step is
    played: the episodes still running end there, marked `cut` (their outcome unknown: not a loss)."""
    make_env, prompter = envlib.make_env(task, data_dir), envlib.prompter(task)
    envs = [make_env() for _ in goals]
    first = [env.reset(goal, seed=seed + i)[0] for i, (env, goal) in enumerate(zip(envs, goals))]
    last = list(first)
    turns: list[list[dict]] = [[] for _ in goals]
    rollouts = [Rollout(goal_id=str(g.get("id", i))) for i, g in enumerate(goals)]
    done = [False] * len(goals)
    for _ in range(max_steps):
        live = [i for i in range(len(goals)) if not done[i]]
        if live and deadline is not None and time.monotonic() > deadline:
            for i in live:
                rollouts[i].cut = True
            break
        if not live:
            break
        samples = sample([prompter(goals[i], first[i], turns[i]) for i in live])
        for i, (prompt_ids, action_ids, text) in zip(live, samples):
            key = _state_key(envs[i], last[i])
            action = envlib.parse_action(text)
            result = envs[i].step(action)
            turns[i].append({"completion": text, "action": action, "observation": result.observation,
                             "reward": result.reward})  # fmt: skip
            r = rollouts[i]
            r.steps.append((prompt_ids, action_ids))
            r.actions.append(action)
            r.invalid.append(invalid_action(result.observation))
            r.state_keys.append(key)
            last[i] = result.observation
            r.reward, r.won, done[i] = float(result.reward), bool(result.info.get("won", False)), bool(result.done)
    return rollouts


def k3(log_ratio):
    """Schulman's k3 estimate of KL(p || q) per token from log(q / p) at tokens sampled from p: e^x - x - 1,
    never negative, 0 where the two agree, its gradient in p pulling p toward q.

    >>> import torch
    >>> [round(float(v), 4) for v in k3(torch.tensor([0.0, 0.1, -0.1]))]
    [0.0, 0.0052, 0.0048]
    """
    import torch

    return torch.expm1(log_ratio) - log_ratio


def token_mean(per_sample: list) -> float:
    """The mean over every token of per-sample tensors (0 for none)."""
    return float(sum(float(x.sum()) for x in per_sample) / max(1, sum(len(x) for x in per_sample)))


def _state_key(env, observation: str) -> Hashable:
    """The environment's own state key where it has one, else the observation the action answers."""
    key = env.state_key() if hasattr(env, "state_key") else None
    return key if key is not None else observation


# -- training ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    """The update recipe: optimizer steps per rollout batch, ratio clipping and the learning-rate schedule."""

    epochs: int = 1
    minibatches: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.28
    """Clip-higher (DAPO): a larger upper bound lets rare good actions grow faster than they shrink."""
    warmup_steps: int = 0
    decay_steps: int = 0
    """Cosine decay over this many optimizer steps after the warm-up, down to `min_lr_share` (0: constant)."""
    min_lr_share: float = 0.1
    kl_target: float = 0.0
    """Approximate KL per update to aim at (0: no trust region): minibatches stop past 1.5 x, the rate adapts."""
    entropy_rise: float = 0.02
    """A rise of the sampling entropy counts when it exceeds the last one by this share (noise is no rise)."""
    ref_kl: float = 0.0
    """Weight of a KL term to the reference policy, the weights RL started from (0: none). Per action token the
    k3 estimate of KL(policy || reference), episode-weighted as the loss is. Why: `kl_target` bounds each update's
    step, not the walk over many; from a 90% SFT end, 12 updates without an anchor lowered the hidden score in
    6 of 6 runs while the training wins held (BENCHMARKS.md "RL, eighteenth pass")."""
    negative_weight: float = 1.0
    """Share of a negative advantage that reaches the loss (1: all of it; 0: only steps that did better than their
    group push, as in filtered behaviour cloning). Why: from a 90% SFT end the lost episodes run to the step limit
    and are the most of an update's negative tokens, which push down actions that the won games take too; the
    hidden games that RL lost were ones the SFT policy had won (BENCHMARKS.md "RL, eighteenth pass")."""

    def __post_init__(self) -> None:
        if self.ref_kl < 0:
            raise ValueError(f"ref_kl must be >= 0 (got {self.ref_kl})")
        if not 0.0 <= self.negative_weight <= 1.0:
            raise ValueError(f"negative_weight must be in [0, 1] (got {self.negative_weight})")
        if self.epochs < 1 or self.minibatches < 1:
            raise ValueError(f"epochs and minibatches must be >= 1 (got {self.epochs}, {self.minibatches})")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"clip bounds must be 0 <= low < 1, high >= 0 (got {self.clip_low}, {self.clip_high})")

    def lr_factor(self, step: int) -> float:
        """The learning rate's share of its peak at optimizer step `step` (0-based).

        >>> s = Schedule(warmup_steps=2, decay_steps=10, min_lr_share=0.1)
        >>> [round(s.lr_factor(i), 2) for i in (0, 1, 2, 7, 12, 99)]
        [0.5, 1.0, 1.0, 0.55, 0.1, 0.1]
        """
        import math

        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay_steps <= 0:
            return 1.0
        done = min(1.0, (step - self.warmup_steps) / self.decay_steps)
        return self.min_lr_share + (1 - self.min_lr_share) * 0.5 * (1 + math.cos(math.pi * done))


@dataclass
class UpdateStats:
    """What one update's optimizer steps saw, over its action tokens."""

    loss: float = 0.0
    optimizer_steps: int = 0
    clip_fraction: float = 0.0
    """Share of action tokens whose clipped term was the smaller one (no gradient from them)."""
    approx_kl: float = 0.0
    """Estimate of KL(sampling policy || policy), mean of (r - 1) - log r over the tokens (Schulman's k3)."""
    entropy: float = 0.0
    """Estimate of the sampling policy's entropy per action token: mean -log p of the sampled tokens."""
    first_ratio_max_dev: float = 0.0
    """Largest |r - 1| in the first minibatch of the update (0 up to rounding when the sampler is the policy)."""
    lr: float = 0.0
    minibatches_used: int = 0
    """Minibatches whose optimizer step was taken (fewer than planned when the KL target stopped the update)."""
    kl_stopped: bool = False
    ref_kl: float | None = None
    """Mean k3 estimate of KL(policy || reference) over the update's action tokens before its first step (None
    without the reference term): how far RL has walked from where it started."""
    peak_gib: float = 0.0
    """The process's peak GPU memory allocated during the update (torch.cuda.max_memory_allocated; 0 on CPU)."""


@dataclass
class StepStats:
    episodes: int
    wins: int
    mean_reward: float
    """Mean return: the environment's reward (win-only; the shaping penalties are per step, not in it)."""
    mean_repeat: float
    samples: int
    """Steps that carried a non-zero advantage into the loss."""
    loss: float
    update_s: float
    rollout_s: float = 0.0
    mean_invalid: float = 0.0
    mean_steps: float = 0.0
    generated_tokens: int = 0
    cut: int = 0
    """Episodes cut by the deadline (left out of the update)."""
    win_rate: float = 0.0
    entropy_alarm: bool = False
    """The sampling entropy rose three updates running: the round ends here (the session rolls back)."""
    update: UpdateStats = field(default_factory=UpdateStats)


GOAL_DRAWS = ("uniform", "learnability")
PRIOR_EPISODES = 2.0
"""How many episodes' worth of the pooled loss rate a goal's own record starts from (`GoalDraw.weight`)."""


class GoalDraw:
    """Which training goals a step's groups play.

    `uniform` (the default): every goal alike. `learnability`: goals weighted by m (1 - m), m a goal's estimated
    chance of losing, (losses + 2 r) / (episodes + 2) with r the loss rate pooled over the session's rollouts so
    far: a group of one goal's episodes gives a gradient only when its episodes differ, most often near m = 1/2.
    Why: a policy that already wins ~91% of its training episodes leaves about half of uniformly drawn groups all
    won (0.91^8; BENCHMARKS.md "RL, fifteenth pass"). Why the pooled prior: with a flat prior (losses + 1) /
    (episodes + 2), the first version of this draw, an unplayed goal weighs 1/2, more than a goal lost in 2 of its
    8 episodes (3/10), so over 600 training goals RL would play unplayed goals first for ~75 updates and the
    weighting would do nothing within a run; with the pooled rate an unplayed goal weighs about r (1 - r)."""

    def __init__(self, goals: list[dict], how: str, rng: random.Random):
        if how not in GOAL_DRAWS:
            raise ValueError(f"goal draw must be one of {GOAL_DRAWS} (got {how!r})")
        self.goals, self.how, self.rng = goals, how, rng
        self.episodes = [0] * len(goals)
        self.losses = [0] * len(goals)
        self._index = {id(g): i for i, g in enumerate(goals)}

    def pooled_loss_rate(self) -> float:
        """Losses over episodes so far, pulled toward 1/2 by one won and one lost pseudo-episode (never 0 or 1)."""
        return (sum(self.losses) + 1) / (sum(self.episodes) + 2)

    def weight(self, i: int, pooled: float | None = None) -> float:
        r = self.pooled_loss_rate() if pooled is None else pooled
        m = (self.losses[i] + PRIOR_EPISODES * r) / (self.episodes[i] + PRIOR_EPISODES)
        return m * (1 - m)

    def draw(self, k: int) -> list[dict]:
        k = min(k, len(self.goals))
        if self.how == "uniform":
            return self.rng.sample(self.goals, k)
        # Weighted sampling without replacement (Efraimidis and Spirakis): the k largest u ** (1 / weight).
        r = self.pooled_loss_rate()
        keys = sorted(((self.rng.random() ** (1 / self.weight(i, r)), i) for i in range(len(self.goals))),
                      reverse=True)  # fmt: skip
        return [self.goals[i] for _, i in keys[:k]]

    def record(self, played: list[dict], rollouts: list[Rollout]) -> None:
        """Each episode's outcome against the goal it played (`played[j]` for `rollouts[j]`); cut ones say nothing."""
        for goal, r in zip(played, rollouts):
            if r.cut:
                continue
            i = self._index[id(goal)]
            self.episodes[i] += 1
            self.losses[i] += not r.won


class GRPOEnv:
    """GRPO / GiGPO steps on one loaded model; its own optimizer across the session's RL rounds."""

    sweep_pending = False
    """Whether `sweep_goals` is still to run before the first rollouts (set from `sweep`)."""

    def __init__(self, model, tokenizer, envlib, task: str, data_dir: Path, *, lr: float, goals_per_step: int,
                 group_size: int, max_episode_steps: int | None, temperature: float, loop_penalty: float,
                 seed: int, invalid_penalty: float = 0.0, algorithm: str = "grpo", gamma: float = 0.95,
                 step_weight: float = 1.0, micro_batch: int | None = None, micro_tokens: int | None = None,
                 max_new_tokens: int = 32, max_grad_norm: float = 1.0, engine: str = "auto",
                 curve: Path | None = None, max_samples: int = 1024, schedule: Schedule = Schedule(),
                 chunk_rows: int = 512, checkpoint_layers: bool | None = None, goal_draw: str = "uniform",
                 goal_ids: Collection[str] | None = None, sweep: bool = False):  # fmt: skip
        import torch

        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS} (got {algorithm!r})")
        self.model, self.tokenizer, self.envlib, self.task, self.data_dir = model, tokenizer, envlib, task, data_dir
        self.goals_per_step, self.group_size, self.loop_penalty = goals_per_step, group_size, loop_penalty
        self.invalid_penalty, self.algorithm, self.gamma, self.step_weight = invalid_penalty, algorithm, gamma, step_weight
        limit = envlib.MAX_STEPS.get(task)  # the evaluator's: training episodes may run as long as it lets them
        if limit is None and max_episode_steps is None:
            raise ValueError(f"no step limit for task {task!r}: envlib.MAX_STEPS lacks it and none was given")
        self.max_episode_steps = min(x for x in (max_episode_steps, limit) if x is not None)
        self.device = next(model.parameters()).device
        # With the shared system prompt run once per micro-batch, rows cost their suffix only. A micro-batch is
        # bounded by rows and by padded tokens: activations grow with tokens, ~0.7 MiB a token at 135M under bf16
        # autocast (the fp32 residual stream and norms, the MLP's 1536-wide bf16 tensors), ~0.1 MiB with each
        # layer checkpointed. A micro-batch's forward and backward cost ~0.19 s plus ~6 ms per 1k tokens: per-call
        # overhead dominates, so fewer, larger micro-batches are faster. Measured on an H200 in one call
        # (bench/bench_rl_update.py, BENCHMARKS.md "RL, ninth pass"), one update of 1,024 samples: 16k tokens
        # unchecked 14.6 s at 15.0 GiB; checkpointed, 64k tokens 8.5 s at 9.9 GiB, 80k 6.5 s at 10.7 GiB (2.27x
        # the unchecked speed: the default on CUDA), 96k 6.4 s at 12.1 GiB (over the 12 GiB a run may hold).
        cuda = self.device.type == "cuda"
        self.checkpoint_layers = cuda if checkpoint_layers is None else checkpoint_layers
        """Activation checkpointing per decoder layer in the policy's pass (each layer runs again in the backward
        pass): by default on CUDA, where it lets 4x larger micro-batches fit in less memory, faster."""
        big = cuda and self.checkpoint_layers
        self.micro_batch = micro_batch or (320 if big else 64 if cuda else 16)
        self.micro_tokens = micro_tokens or (81_920 if big else 16_384 if cuda else 4096)
        self.chunk_rows = chunk_rows
        """Action tokens per output-layer call: bounds the (rows, vocabulary) fp32 logits held at once (512 rows of
        a 49k vocabulary: 100 MB), never the whole batch's."""
        self.temperature = temperature
        self.lr_scale = 1.0
        """The trust region's adaptation of the peak rate (1: as given)."""
        self.entropies: list[float] = []
        self.max_grad_norm, self.max_samples = max_grad_norm, max_samples
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        self.peak_lr, self.schedule, self.optimizer_steps = lr, schedule, 0
        self.goals = [g for g in envlib.load_goals(data_dir) if goal_ids is None or str(g.get("id")) in goal_ids]
        """The training goals RL plays: all of them, or those in `goal_ids` (games held out of SFT for RL)."""
        if not self.goals:
            raise ValueError(f"no training goals to play: none of the {len(goal_ids or ())} held-out ids is a goal")
        self.rng = random.Random(seed)
        self.goal_draw = GoalDraw(self.goals, goal_draw, self.rng)
        # Before the first step's rollouts, play every goal once (`sweep_goals`): the goal draw then knows which
        # goals the policy loses. Why: in 8 updates of 8 goals among 600 the learnability draw had no loss record to
        # weigh by (BENCHMARKS.md "RL, seventeenth pass").
        self.sweep_pending = sweep
        self.seed = seed * 100_003
        self.sample = make_sampler(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature,
                                   stop=envlib.STOP, seed=seed, engine=engine)  # fmt: skip
        self.steps_done = 0
        self.last_update_s: float | None = None
        self.recent_step_s: list[float] = []
        """Seconds of each whole step so far, rollouts plus update (`step_estimate_s`): a round shorter than a step
        would only cut its rollouts at the deadline and drop them."""
        self.curve = curve
        self.reference = None
        """A frozen copy of the policy at the first update with `Schedule.ref_kl` (RL's start when set from the
        beginning): what the KL term anchors to. A restored checkpoint does not move it."""

    def reference_model(self):
        """The frozen reference, copied from the policy on first use."""
        import copy

        if self.reference is None:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        return self.reference

    def weights_changed(self) -> None:
        """The policy's weights changed outside an update (e.g. a checkpoint was restored)."""
        if hasattr(self.sample, "sync"):
            self.sample.sync()

    def entropy_alarm(self) -> bool:
        """Whether the sampling entropy rose (by more than `entropy_rise` each time) three updates running."""
        e, share = self.entropies[-4:], self.schedule.entropy_rise
        return len(e) == 4 and all(b > a * (1 + share) for a, b in zip(e, e[1:]))

    def rolled_back(self, note: str) -> None:
        """The session restored an earlier checkpoint after an alarm: the rate halves, the watch starts over."""
        self.weights_changed()
        self.lr_scale = max(0.05, self.lr_scale / 2)
        self.entropies = []
        if self.curve is not None:
            with self.curve.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"update": self.steps_done, "rolled_back": note, "lr_scale": self.lr_scale}) + "\n")

    def sweep_goals(self, deadline: float | None = None) -> None:
        """Play each training goal once, in batches of a step's episodes, and record the outcomes in the goal draw
        (episodes cut by `deadline` say nothing). No update: it only tells the draw where the losses are."""
        t0, batch = time.monotonic(), self.goals_per_step * self.group_size
        order = self.rng.sample(self.goals, len(self.goals))
        played = won = cut = 0
        self.model.eval()
        for i in range(0, len(order), batch):
            goals = order[i : i + batch]
            self.seed += len(goals)
            rollouts = play(self.envlib, self.task, self.data_dir, goals, self.sample, self.max_episode_steps,
                            self.seed, deadline)  # fmt: skip
            self.goal_draw.record(goals, rollouts)
            played += len(rollouts)
            won += sum(r.won for r in rollouts)
            cut += sum(r.cut for r in rollouts)
            if deadline is not None and time.monotonic() >= deadline:
                break
        if self.curve is not None:
            with self.curve.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"sweep": played, "of": len(self.goals), "wins": won, "cut": cut,
                                    "seconds": round(time.monotonic() - t0, 2)}) + "\n")  # fmt: skip

    def sweep_if_pending(self, deadline: float | None = None) -> None:
        """The sweep, once, before the first rollouts (kept out of a step's timing: it is no step)."""
        if self.sweep_pending:
            self.sweep_pending = False
            self.sweep_goals(deadline)

    def rollouts(self, deadline: float | None = None) -> list[Rollout]:
        self.sweep_if_pending(deadline)
        goals = self.goal_draw.draw(self.goals_per_step)
        grouped = [g for g in goals for _ in range(self.group_size)]
        self.seed += len(grouped)
        self.model.eval()
        rollouts = play(self.envlib, self.task, self.data_dir, grouped, self.sample, self.max_episode_steps,
                        self.seed, deadline)  # fmt: skip
        self.goal_draw.record(grouped, rollouts)
        return rollouts

    def grpo_step(self, deadline: float | None = None) -> StepStats:
        """Rollouts (cut at `deadline`), then one update."""
        self.sweep_if_pending(deadline)
        t_rollout = time.monotonic()
        tokens_before = getattr(self.sample, "tokens", 0)
        rollouts = self.rollouts(deadline)
        rollout_s = time.monotonic() - t_rollout
        samples = self.update_samples(rollouts)
        t_update = time.monotonic()
        update = self.update(samples)
        if hasattr(self.sample, "sync"):  # after the last optimizer step: the next rollouts use these weights
            self.sample.sync()
        self.steps_done += 1
        if update.optimizer_steps:
            self.entropies.append(update.entropy)
        n = len(rollouts)
        steps = sum(len(r.actions) for r in rollouts)
        wins = sum(r.won for r in rollouts)
        stats = StepStats(
            n, wins, round(sum(float(r.reward) for r in rollouts) / n, 4),
            round(sum(repeat_fraction(r.actions) for r in rollouts) / n, 4), len(samples), round(update.loss, 5),
            round(time.monotonic() - t_update, 2), round(rollout_s, 2),
            round(sum(sum(r.invalid) for r in rollouts) / max(1, steps), 4), round(steps / n, 2),
            getattr(self.sample, "tokens", 0) - tokens_before, sum(r.cut for r in rollouts), round(wins / n, 4),
            self.entropy_alarm(), update,
        )  # fmt: skip
        if self.curve is not None:
            with self.curve.open("a", encoding="utf-8") as f:
                row = asdict(stats)
                row.update(row.pop("update"))  # one flat row per update
                f.write(json.dumps({"update": self.steps_done, "algorithm": self.algorithm,
                                    "goal_draw": self.goal_draw.how, "goals": len(self.goals), **row}) + "\n")
        return stats

    def update_samples(self, rollouts: list[Rollout]) -> list[tuple[list[int], list[int], float, int]]:
        """The update's samples of a rollout batch: (prompt ids, action ids, advantage, episode) of every step with
        a non-zero advantage (a negative one times `Schedule.negative_weight`), at most `max_samples` of them."""
        advantages = step_advantages(rollouts, self.group_size, algorithm=self.algorithm,
                                     loop_penalty=self.loop_penalty, invalid_penalty=self.invalid_penalty,
                                     gamma=self.gamma, step_weight=self.step_weight)  # fmt: skip
        down = self.schedule.negative_weight
        weighted = ((p, a, adv if adv > 0 else adv * down, e) for e, (r, advs) in enumerate(zip(rollouts, advantages))
                    for (p, a), adv in zip(r.steps, advs))  # fmt: skip
        samples = [x for x in weighted if x[2] != 0.0 and x[1]]
        if len(samples) > self.max_samples:  # a uniform subset: the same expected loss, a bounded update time
            samples = self.rng.sample(samples, self.max_samples)
        return samples

    def _batch(self, chunk: list[tuple]):
        """Right-padded ids, attention mask and action-token mask of a micro-batch, on the device."""
        import torch

        width = max(len(x[0]) + len(x[1]) for x in chunk)
        ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        targets = torch.zeros((len(chunk), width), dtype=torch.bool)
        for row, (p, a, *_) in enumerate(chunk):
            ids[row, : len(p) + len(a)] = torch.tensor(p + a)
            mask[row, : len(p) + len(a)] = 1
            targets[row, len(p) : len(p) + len(a)] = True
        prefix = shared_prefix_length([x[0] for x in chunk], [len(x[0]) for x in chunk])
        return ids.to(self.device), mask.to(self.device), targets.to(self.device), prefix

    def _log_probs(self, model, chunk):
        import torch

        ids, mask, targets, prefix = self._batch(chunk)
        return target_log_probs(model, ids, mask, targets, self.device, chunk_rows=self.chunk_rows,
                                temperature=self.temperature, prefix=prefix if prefix >= MIN_TRAIN_PREFIX else 0,
                                checkpoint_layers=bool(self.checkpoint_layers) and torch.is_grad_enabled())  # fmt: skip

    def micro_batches(self, indices: list[int], samples: list[tuple]) -> list[list[int]]:
        """Consecutive runs of `indices` (sorted by length) of at most `micro_batch` rows and `micro_tokens`
        padded tokens (a single longer row goes alone)."""
        out: list[list[int]] = []
        width = 0
        for i in indices:
            size = len(samples[i][0]) + len(samples[i][1])
            fits = (len(out[-1]) + 1) * max(size, width) <= self.micro_tokens if out else False
            if fits and len(out[-1]) < self.micro_batch:
                out[-1].append(i)
                width = max(size, width)
            else:
                out.append([i])
                width = size
        return out

    def sampling_log_probs(self, samples, model=None) -> list:
        """Each sample's action-token log-probs under the weights that sampled it (the rollout copy when there is
        one; `model` instead when given) at the sampling temperature, taken before the first optimizer step of
        the update."""
        import torch

        model = model or getattr(self.sample, "copy", None) or self.model
        out = []
        with torch.no_grad():
            for idx in self.micro_batches(list(range(len(samples))), samples):
                chunk = [samples[i] for i in idx]
                flat = self._log_probs(model, chunk).float()
                out += list(torch.split(flat, [len(x[1]) for x in chunk]))
        return out

    @staticmethod
    def token_weights(samples: list[tuple]) -> list[float]:
        """Each sample's weight per action token: 1 / (its episode's action tokens x the episodes), so that every
        episode counts the same whatever its length (a per-episode token mean, then a mean over episodes).

        >>> GRPOEnv.token_weights([([1], [2, 3], 1.0, 0), ([1], [4, 5], 1.0, 0), ([1], [6], -1.0, 1)])
        [0.125, 0.125, 0.5]
        """
        tokens: dict[Hashable, int] = defaultdict(int)
        for _, a, _, episode in samples:
            tokens[episode] += len(a)
        return [1.0 / (tokens[episode] * len(tokens)) for _, _, _, episode in samples]

    def update(self, samples: list[tuple[list[int], list[int], float, Hashable]]) -> UpdateStats:
        """`epochs` x `minibatches` optimizer steps on the clipped objective over the action tokens; a sample is
        (prompt ids, action ids, advantage, episode). Each minibatch's loss is its episode-weighted token mean
        (`token_weights`); with a KL target, the update stops before a minibatch whose KL passed 1.5 x it."""
        import torch

        k = self.schedule
        stats = UpdateStats(lr=round(self.peak_lr * self.lr_scale * k.lr_factor(self.optimizer_steps), 10))
        if not samples:
            return stats
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.model.eval()
        samples = sorted(samples, key=lambda s: len(s[0]) + len(s[1]))  # similar lengths share micro-batches
        weights = self.token_weights(samples)
        old = self.sampling_log_probs(samples)
        # The sampling policy's entropy, estimated over every action token of the batch (-log p of each).
        stats.entropy = round(-token_mean(old), 4)
        ref = self.sampling_log_probs(samples, self.reference_model()) if k.ref_kl else None
        if ref is not None:  # the walk so far, measured where the update will act (the policy is the sampler's)
            stats.ref_kl = round(token_mean([k3(r.to(o.device) - o) for r, o in zip(ref, old)]), 6)
        self.model.train()
        tokens = clipped = 0
        kl_sum = loss_sum = 0.0
        first = True
        for _ in range(k.epochs):
            if stats.kl_stopped:
                break
            order = list(range(len(samples)))
            self.rng.shuffle(order)
            for part in range(k.minibatches):
                chosen = sorted(order[part :: k.minibatches])  # sorted: by length again, for the micro-batches
                if not chosen:
                    continue
                mb_weight = sum(weights[i] * len(samples[i][1]) for i in chosen)
                lr = self.peak_lr * self.lr_scale * k.lr_factor(self.optimizer_steps)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                mb_kl = mb_tokens = 0
                mb_clipped, mb_loss = 0, 0.0
                for idx in self.micro_batches(chosen, samples):
                    chunk = [samples[i] for i in idx]
                    new = self._log_probs(self.model, chunk).float()
                    before = torch.cat([old[i] for i in idx]).to(new.device)
                    adv = torch.tensor([x[2] for x in chunk for _ in x[1]], device=new.device)
                    w = torch.tensor([weights[i] for i in idx for _ in samples[i][1]], device=new.device)
                    ratio = torch.exp(new - before)
                    bounded = torch.clamp(ratio, 1 - k.clip_low, 1 + k.clip_high)
                    loss = -(torch.minimum(ratio * adv, bounded * adv) * w).sum() / mb_weight
                    if ref is not None:  # the anchor: k3 of KL(policy || reference), weighted as the loss
                        anchor = torch.cat([ref[i] for i in idx]).to(new.device)
                        loss = loss + k.ref_kl * (k3(anchor - new) * w).sum() / mb_weight
                    loss.backward()
                    with torch.no_grad():
                        r = ratio.detach()
                        outside = (r > 1 + k.clip_high) & (adv > 0) | (r < 1 - k.clip_low) & (adv < 0)
                        mb_clipped += int(outside.sum())
                        mb_kl += float(k3(torch.log(r)).sum())
                        mb_tokens += len(r)
                        mb_loss += float(loss.detach())
                        if first:
                            stats.first_ratio_max_dev = max(stats.first_ratio_max_dev, float((r - 1).abs().max()))
                first = False
                if k.kl_target and stats.optimizer_steps and mb_kl / max(1, mb_tokens) > 1.5 * k.kl_target:
                    self.optimizer.zero_grad(set_to_none=True)  # past the trust region: this step is not taken
                    stats.kl_stopped = True
                    kl_sum, tokens = kl_sum + mb_kl, tokens + mb_tokens  # what stopped it is in the estimate
                    break
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.optimizer_steps += 1
                stats.optimizer_steps += 1
                stats.minibatches_used += 1
                stats.lr = round(lr, 10)
                clipped, loss_sum = clipped + mb_clipped, loss_sum + mb_loss
                kl_sum, tokens = kl_sum + mb_kl, tokens + mb_tokens
        self.model.eval()
        steps = max(1, stats.optimizer_steps)
        stats.loss = round(loss_sum / steps, 6)
        stats.clip_fraction, stats.approx_kl = round(clipped / max(1, tokens), 4), round(kl_sum / max(1, tokens), 6)
        stats.first_ratio_max_dev = round(stats.first_ratio_max_dev, 6)
        if self.device.type == "cuda":
            stats.peak_gib = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 2)
        if k.kl_target:  # toward the target: a slower rate after a step too far, back up after a timid one
            if stats.approx_kl > 2 * k.kl_target:
                self.lr_scale = max(0.05, self.lr_scale / 2)
            elif stats.approx_kl < k.kl_target / 2:
                # Never past the peak: KL per update stays far below the target at lr 3e-5 (0.002-0.013 against
                # 0.02), so raising the rate on it doubled it within two updates, and one of three seeds of the
                # RL-only bench from a 41/60 SFT collapsed at 5.8e-5 (41 -> 26/60; BENCHMARKS "RL, tenth pass").
                self.lr_scale = min(MAX_LR_SCALE, self.lr_scale * 1.5)
        return stats

    def train(self, seconds: float, max_steps: int | None = None) -> tuple[int, list[StepStats], float]:
        """Steps until the next would end past `seconds` (judged by the last one), `max_steps`, or an entropy
        alarm. Rollouts stop early enough for the update to end in time too, so even the first step keeps to
        `seconds`."""
        t0 = last = time.monotonic()
        stats: list[StepStats] = []
        update_s = self.last_update_s or 0.2 * seconds  # a guess until an update has been timed
        self.sweep_if_pending(t0 + seconds - update_s)  # the round's time, not its first step's
        last = time.monotonic()
        while max_steps is None or len(stats) < max_steps:
            stats.append(self.grpo_step(deadline=t0 + seconds - update_s))
            if stats[-1].entropy_alarm:
                break
            if stats[-1].cut:  # the round's time ran out in its rollouts: a next step's would only be cut too
                break
            update_s = max(stats[-1].update_s, 0.5)
            self.last_update_s = update_s
            self.recent_step_s.append(stats[-1].rollout_s + stats[-1].update_s)
            now = time.monotonic()
            if now - t0 + max(now - last, self.step_estimate_s() or 0.0) > seconds:
                break
            last = now
        return len(stats), stats, round(time.monotonic() - t0, 1)

    def step_estimate_s(self) -> float | None:
        """What a next whole step may take: the slowest of the last three whole steps (None before one). On a
        card shared with other runs a step's time varies by a third from one to the next (rollouts 11-28 s,
        updates 10-23 s at four runs a card, BENCHMARKS.md "RL, tenth pass"): a round sized to the last step alone
        can start a step whose rollouts the deadline cuts, and drops them."""
        recent = self.recent_step_s[-3:]
        return max(recent) if recent else None

    @property
    def last_step_s(self) -> float | None:
        """Seconds the last whole step took (None before one was timed)."""
        return self.recent_step_s[-1] if self.recent_step_s else None
