"""reference-sft-grpo on an interactive task that ships worked examples (``data/sft.jsonl``) and its environments
(``data/envlib.zip``): one process, one loaded model, rounds of (train, save, submit).

1. SFT rounds: full fine-tuning on the worked examples (``sft_torch.py``) and on searching demonstrations the
   agent builds from the public training games (``search_demos.py``: the worked examples are oracle walkthroughs
   that never search), each round submitted, while the last round's validation score rose by more than a
   game and a half, within a cap on SFT's share of the budget and a floor left for RL (``sft_split``). Each round
   goes on from its own checkpoint unless its validation score fell more than ``A2RL_GRPO_ROLLBACK_MARGIN`` points
   below the best (then the best is restored), and RL starts from where SFT ended on the same rule.
2. RL rounds from where SFT ended (why SFT stopped and that checkpoint are logged and are the first row of
   ``rl_curve.jsonl``; each submission names the one its training started from, ``parent``): GRPO (or GiGPO
   with ``A2RL_GRPO_ALGORITHM=gigpo``) with online rollouts on training goals, win-only returns, a KL target per
   update (``grpo_env_torch.py``; on CUDA the rollouts run on the decode engine), each round submitted; a round
   whose validation score falls more than ``A2RL_GRPO_ROLLBACK_MARGIN`` points below the best is rolled back,
   otherwise RL goes on from it. When the sampling entropy rose three updates running the round ends, the best
   checkpoint is restored and RL goes on at half the rate; after ``MAX_ENTROPY_ROLLBACKS`` such rollbacks RL
   stops.
In mode ``sft-only`` (read from ``instructions.md``) the RL code is removed from ``code/`` first and the SFT
rounds go on from where SFT ended (on the same rule) at half the learning rate instead of GRPO.

Only training goals and the grader's validation feedback are used. Knobs: ``A2RL_SFT_*`` / ``A2RL_RL_MIN_SHARE`` /
``A2RL_GRPO_*``.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

try:  # in a workspace: the copies beside this file
    import round_loop as loop
    import search_demos
    import sft_torch
except ImportError:  # in the harness's source tree
    from a2rl_bench.agents.reference_sft import agent as loop
    from a2rl_bench.agents.reference_sft_grpo import search_demos, sft_torch

MAX_ENTROPY_ROLLBACKS = 3
"""RL stops after this many rollbacks for a rising entropy (the policy keeps drifting away at any rate)."""
RL_FILES = ("train_grpo.py", "train_grpo_env.py", "grpo_env_torch.py")
"""Files of ``code/`` that hold RL code: removed in mode sft-only, so every snapshot is SFT only."""
_MODE_LINE = re.compile(r"^- Mode: `([a-z-]+)`", re.MULTILINE)


def read_mode(workspace: Path) -> str:
    """The run's mode as ``instructions.md`` states it (``free`` when it says nothing)."""
    try:
        text = (workspace / "instructions.md").read_text(encoding="utf-8")
    except OSError:
        return "free"
    match = _MODE_LINE.search(text)
    return match.group(1) if match else "free"


def score_noise(score: float, items: int) -> float:
    """The binomial standard error, in points, of a validation score (percent) over `items` items: one item's
    worth at least (at 60 items a score of 20 has 5.2 points of noise; one game is 1.7 points).

    >>> round(score_noise(20.0, 60), 1), round(score_noise(0.0, 60), 1)
    (5.2, 1.7)
    """
    p = min(max(score / 100, 1 / items), 1 - 1 / items)
    return 100 * (p * (1 - p) / items) ** 0.5


def sft_finished(scores: list[float | None], baseline: float | None, max_rounds: int, patience: int = 1,
                 items: int | None = None, margin: float | None = None) -> bool:  # fmt: skip
    """Whether to stop SFT after these validation scores (one per SFT round, None when not scored).

    SFT stops when the last `patience` rounds did not beat the best score before them by more than `margin`
    points, once that best is above the baseline (until SFT has lifted the model at all, more SFT is the better
    bet), or after `max_rounds`. Without `margin` but with `items` (the validation split's size) the margin is
    the best score's own noise (`score_noise`); with neither, any rise counts.
    """
    if len(scores) >= max_rounds:
        return True
    if len(scores) <= patience:
        return False
    known = [s for s in scores[:-patience] if s is not None]
    if not known:
        return False
    best_before = max(known)
    if baseline is not None and best_before <= baseline:
        return False
    if margin is None:
        margin = score_noise(best_before, items) if items else 0.0
    return all(s is None or s <= best_before + margin for s in scores[-patience:])


def sft_allowance_s(budget_s: float, remaining_s: float, *, max_share: float, rl_min_share: float, save_s: float,
                    end_margin_s: float = 0.0) -> float:  # fmt: skip
    """Training seconds SFT may still take, less a save: within its cap (`max_share` of the budget, counting what
    is used) and leaving RL its floor (`rl_min_share` of the budget, counting what remains before the run's end
    margin `end_margin_s`).

    >>> sft_allowance_s(420, 300, max_share=0.7, rl_min_share=0.3, save_s=5, end_margin_s=15)  # the floor
    154.0
    >>> sft_allowance_s(420, 390, max_share=0.1, rl_min_share=0.0, save_s=5)  # the cap: 42 - 30 - 5
    7.0
    """
    used_s = budget_s - remaining_s
    return min(max_share * budget_s - used_s, remaining_s - end_margin_s - rl_min_share * budget_s) - save_s


def release_cached_gpu_memory() -> None:
    """Give the allocator's cached, unused blocks back to the card. After an SFT step an agent holds 33 GiB this way
    (batch 32, one H200, 2026-11-29), and the grader's evaluation of its submission, on the same card, needs a few:
    three of 27 gradings of four runs a card ran out of memory. The next step allocates again (milliseconds)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def grow_gpu_memory_in_place() -> None:
    """The allocator's expandable segments, unless PYTORCH_CUDA_ALLOC_CONF says otherwise: SFT's batches change
    shape every step, and with fixed-size segments the blocks they leave cached grew to 28.8 GiB reserved for a
    20.1 GiB peak (bench/bench_sft_step.py, one H200). Set before the first allocation; the GPU table's graders
    (bench/gpu_alfworld.py) run so too, the decode engine's CUDA graphs included."""
    import torch

    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        return
    try:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    except Exception as error:  # noqa: BLE001 - an older torch without it: the default allocator is fine
        loop.log(f"allocator left as it is ({type(error).__name__}: {error})")


@dataclass(frozen=True)
class Split:
    """The decision after an SFT round: go on with SFT, or stop it (and why)."""

    stop: bool
    reason: str


def sft_split(scores: list[float | None], baseline: float | None, *, allowance_s: float, min_round_s: float,
              max_rounds: int, margin: float, patience: int = 1) -> Split:  # fmt: skip
    """SFT goes on until its last `patience` rounds' validation scores did not rise by more than `margin` points
    over the best before them (`sft_finished`), and while another round of at least `min_round_s` fits the time
    SFT may still take (`allowance_s`: its cap and RL's floor); RL then starts from the best SFT checkpoint.

    >>> sft_split([60.0, 63.3], 0.0, allowance_s=100, min_round_s=10, max_rounds=6, margin=2.5).stop
    False
    >>> sft_split([60.0, 63.3, 65.0], 0.0, allowance_s=100, min_round_s=10, max_rounds=6, margin=2.5).reason
    'validation no longer rises: 65.0 after a best of 63.3 before it (margin 2.5 points)'
    """
    if sft_finished(scores, baseline, max_rounds, patience=patience, margin=margin):
        if len(scores) >= max_rounds:
            return Split(True, f"{len(scores)} SFT rounds, the most allowed")
        known = [s for s in scores[:-patience] if s is not None]
        last = ", ".join(str(s) for s in scores[-patience:])
        return Split(True, f"validation no longer rises: {last} after a best of {max(known)} before "
                           f"{'it' if patience == 1 else 'them'} (margin {margin:.1f} points)")  # fmt: skip
    if allowance_s < min_round_s:
        return Split(True, f"validation still rises, but SFT's time is used ({max(0.0, allowance_s):.0f}s left "
                           "within its cap and RL's floor)")  # fmt: skip
    return Split(False, "validation still rises")


@dataclass(frozen=True)
class Knobs:
    """What the session reads from ``A2RL_SFT_*`` / ``A2RL_GRPO_*`` (defaults: SmolLM2-135M on one GPU)."""

    sft_lr: float
    sft_batch_size: int
    sft_max_length: int
    sft_round_s: float | None
    """Training seconds per SFT round (default: a sixth of the budget, 20 to 120 s)."""
    sft_max_steps: int | None
    """Cap on steps per SFT round (tests)."""
    sft_max_rounds: int
    sft_search_demos: bool
    """Mix the agent's own searching demonstrations (``search_demos.py``) into the worked examples."""
    sft_max_share: float
    """The cap: SFT never uses more than this share of the budget (its last round is cut to fit), however long
    validation rises. ``A2RL_SFT_MAX_SHARE`` given alone is the whole split (RL's floor is then 0)."""
    rl_min_share: float
    """The floor: SFT stops while this share of the budget is still left for what follows it (RL, or the
    annealed SFT rounds of mode sft-only), so that RL always takes some updates."""
    sft_rise_margin: float | None
    """Points the last SFT round must beat the best before it by for SFT to go on (default: one and a half
    validation items: a rise of one game, rounded up or not, is noise; two games are a rise)."""
    sft_patience: int
    """SFT stops after this many rounds in a row without a rise (`A2RL_SFT_PATIENCE`, default 2; a round without
    one halves SFT's rate). One is too few: at 60 games a score moves by its noise (~6 points at 75%) from round to
    round; in 14 SFT-only runs on H200s (BENCHMARKS.md, RL fourth, seventh, eighth and tenth passes) the round right
    after the first one without a rise, at half the rate, rose again in 7."""
    validation_items: int
    """Items of the validation split (alfworld: 60 games): a rise of SFT's score within its noise is no rise."""
    grpo_lr: float
    grpo_round_s: float | None
    grpo_max_steps: int | None
    goals_per_step: int
    group_size: int
    max_episode_steps: int | None
    """Training episodes' step limit (default: the evaluator's own, from the task's ``envlib``)."""
    temperature: float
    loop_penalty: float
    invalid_penalty: float
    """Per-step costs of a repeated / refused action, added unnormalised after the win-only group normalisation
    (0 by default: returns are about winning only)."""
    kl_target: float
    """Approximate KL per update to aim at: minibatches stop past 1.5 x it and the rate adapts (0: off)."""
    micro_tokens: int | None
    """Padded tokens per micro-batch of the update (bounds its memory; default on a GPU 80k with every layer
    checkpointed: an update's peak 10.7 GiB at 135M, 2.27x as fast as 16k unchecked at 15 GiB; see `GRPOEnv`)."""
    checkpoint_layers: bool | None
    """Activation checkpointing of the update's decoder layers (`A2RL_GRPO_CHECKPOINT_LAYERS` 1/0; default: on
    a GPU, off on the CPU)."""
    sft_micro_tokens: int | None
    """Padded tokens per forward and backward call of an SFT step (`A2RL_SFT_MICRO_TOKENS`; default: the whole
    batch in one call): a bound on SFT's memory, see `sft_torch.SFTRounds`."""
    sft_checkpoint_layers: bool
    """Activation checkpointing of SFT's decoder layers (`A2RL_SFT_CHECKPOINT_LAYERS=1`; off by default: memory for
    time, see `sft_torch.SFTRounds`)."""
    algorithm: str
    """`grpo` (episode-level advantages) or `gigpo` (plus step-level advantages over anchor states)."""
    gamma: float
    """GiGPO's discount of the return-to-go."""
    rollback_margin: float
    """A round (SFT or RL) goes on from its own checkpoint unless its validation score fell more than this many
    points below the best (then the best is restored): gains come in small steps that one noisy score would undo
    (`InteractiveSession.goes_on`)."""
    rollout_engine: str
    """`auto` (the decode engine on CUDA, `generate` on the CPU), `engine` or `generate`."""
    max_samples: int
    """Steps per update at most (a uniform subset of those with a non-zero advantage): bounds the update time."""
    epochs: int
    minibatches: int
    """Each update takes epochs x minibatches optimizer steps over its rollout batch (clipped ratios)."""
    clip_low: float
    clip_high: float
    warmup_steps: int
    decay_steps: int
    """Learning rate: linear warm-up over this many optimizer steps, then cosine decay to a tenth over these."""
    rl_holdout: float
    """Share of the public training games kept out of SFT (its worked examples and searching demonstrations) for
    RL to play alone (`A2RL_GRPO_HOLDOUT`, default 0: SFT on all, RL on all; ignored in mode sft-only). Why: SFT
    trains on every training game's walkthrough, so RL's sampled episodes on those games were already won 91-92%
    of the time, half its groups all won, while the unseen validation games stood at ~85% (BENCHMARKS.md "RL,
    fifteenth pass"); on games SFT never saw, RL's wins and losses would be about the searching that the hidden
    games ask for. Measured (BENCHMARKS.md "RL, sixteenth pass"): from one 72% SFT checkpoint RL on the held-out
    games gained less than on the games SFT saw (+2.2 against +7.1 hidden points over the frozen policy), so it is
    off by default; the bench uses it to compare the two."""
    goal_draw: str
    """`uniform` (default) or `learnability` (`A2RL_GRPO_GOAL_DRAW`): how a step picks its training goals, see
    `grpo_env_torch.GoalDraw`. `learnability` measured at 2 seeds from a 72% SFT checkpoint (BENCHMARKS.md "RL,
    sixteenth pass"): +9.3 hidden points over the frozen policy against uniform's +7.1, within noise: not the
    default."""

    ref_kl: float = 0.0
    """`A2RL_GRPO_REF_KL`: weight of a KL term to the policy RL started from (`grpo_env_torch.Schedule.ref_kl`).
    Measured at 0.1, 3 seeds, 12 updates from a 77% SFT end (BENCHMARKS.md "RL, nineteenth pass"): +2.5 hidden points
    over the frozen policy [-1.7, +6.7], its KL to the start at most 0.1; the unanchored draw beside it (one seed) +2.2.
    From an 83% end, 3 seeds each ("RL, twentieth pass"): -0.7 [-4.5, +2.7] against the unanchored +1.0 [-3.7, +5.5].
    No better shown, so off by default."""

    negative_weight: float = 1.0
    """`A2RL_GRPO_NEGATIVE_WEIGHT`: share of a negative advantage that reaches the loss
    (`grpo_env_torch.Schedule.negative_weight`; 0: only the steps that beat their group push). Measured at 0, 3
    seeds, 12 updates from a 77% SFT end (BENCHMARKS.md "RL, nineteenth pass"): +0.0 hidden points over the frozen
    policy [-4.7, +4.5], its training wins falling in one seed of three: 1 (every negative advantage) by default."""

    goal_sweep: bool = False
    """`A2RL_GRPO_SWEEP=1`: before RL's first update, play every training goal once, so that the learnability draw
    starts from each goal's outcome (`grpo_env_torch.GRPOEnv.sweep_goals`; ~9 updates' rollouts at 600 goals). Not
    measured yet on a GPU: off by default."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Knobs:
        env = dict(os.environ if env is None else env)

        def opt(name: str, kind):
            return kind(env[name]) if env.get(name) else None

        return cls(
            sft_lr=float(env.get("A2RL_SFT_LR") or 1e-4),
            sft_batch_size=int(env.get("A2RL_SFT_BATCH_SIZE") or 32),
            sft_max_length=int(env.get("A2RL_SFT_MAX_LENGTH") or 1024),
            sft_round_s=opt("A2RL_SFT_ROUND_S", float),
            sft_max_steps=opt("A2RL_SFT_MAX_STEPS", int),
            sft_max_rounds=int(env.get("A2RL_SFT_MAX_ROUNDS") or 6),
            sft_search_demos=(env.get("A2RL_SFT_SEARCH_DEMOS") or "1") != "0",
            sft_max_share=float(env.get("A2RL_SFT_MAX_SHARE") or 0.7),
            rl_min_share=float(env.get("A2RL_RL_MIN_SHARE") or (0.0 if env.get("A2RL_SFT_MAX_SHARE") else 0.3)),
            sft_rise_margin=opt("A2RL_SFT_RISE_MARGIN", float),
            sft_patience=int(env.get("A2RL_SFT_PATIENCE") or 2),
            validation_items=int(env.get("A2RL_VALIDATION_ITEMS") or 60),
            grpo_lr=float(env.get("A2RL_GRPO_LR") or 3e-5),
            grpo_round_s=opt("A2RL_GRPO_ROUND_S", float),
            grpo_max_steps=opt("A2RL_GRPO_MAX_STEPS", int),
            goals_per_step=int(env.get("A2RL_GRPO_GOALS_PER_STEP") or 8),
            group_size=int(env.get("A2RL_GRPO_NUM_GENERATIONS") or 8),
            max_episode_steps=opt("A2RL_GRPO_MAX_EPISODE_STEPS", int),
            temperature=float(env.get("A2RL_GRPO_TEMPERATURE") or 1.0),
            loop_penalty=float(env.get("A2RL_GRPO_LOOP_PENALTY") or 0.0),
            invalid_penalty=float(env.get("A2RL_GRPO_INVALID_PENALTY") or 0.0),
            kl_target=float(env.get("A2RL_GRPO_KL_TARGET") or 0.02),
            micro_tokens=opt("A2RL_GRPO_MICRO_TOKENS", int),
            checkpoint_layers=None if not env.get("A2RL_GRPO_CHECKPOINT_LAYERS")
            else env["A2RL_GRPO_CHECKPOINT_LAYERS"] != "0",
            sft_micro_tokens=opt("A2RL_SFT_MICRO_TOKENS", int),
            sft_checkpoint_layers=(env.get("A2RL_SFT_CHECKPOINT_LAYERS") or "0") != "0",
            algorithm=env.get("A2RL_GRPO_ALGORITHM") or "grpo",
            gamma=float(env.get("A2RL_GRPO_GAMMA") or 0.95),
            rollback_margin=float(env.get("A2RL_GRPO_ROLLBACK_MARGIN") or 10.0),
            rollout_engine=env.get("A2RL_GRPO_ROLLOUT_ENGINE") or "auto",
            max_samples=int(env.get("A2RL_GRPO_MAX_SAMPLES") or 1024),
            epochs=int(env.get("A2RL_GRPO_EPOCHS") or 1),
            minibatches=int(env.get("A2RL_GRPO_MINIBATCHES") or 4),
            clip_low=float(env.get("A2RL_GRPO_CLIP_LOW") or 0.2),
            clip_high=float(env.get("A2RL_GRPO_CLIP_HIGH") or 0.28),
            warmup_steps=int(env.get("A2RL_GRPO_WARMUP_STEPS") or 4),
            decay_steps=int(env.get("A2RL_GRPO_DECAY_STEPS") or 200),
            goal_draw=env.get("A2RL_GRPO_GOAL_DRAW") or "uniform",
            rl_holdout=float(env.get("A2RL_GRPO_HOLDOUT") or 0.0),
            goal_sweep=(env.get("A2RL_GRPO_SWEEP") or "0") not in ("0", "false", "no", ""),
            ref_kl=float(env.get("A2RL_GRPO_REF_KL") or 0.0),
            negative_weight=float(env.get("A2RL_GRPO_NEGATIVE_WEIGHT") or 1.0),
        )

    def schedule(self, grpo_env_torch):
        """The update recipe as `grpo_env_torch.Schedule` (the module passed in: the workspace's copy or ours)."""
        return grpo_env_torch.Schedule(epochs=self.epochs, minibatches=self.minibatches, clip_low=self.clip_low,
                                       clip_high=self.clip_high, warmup_steps=self.warmup_steps,
                                       decay_steps=self.decay_steps, kl_target=self.kl_target,
                                       ref_kl=self.ref_kl, negative_weight=self.negative_weight)  # fmt: skip


def held_out_games(goal_ids: list[str], share: float, seed: int) -> frozenset[str]:
    """The training games kept out of SFT for RL alone: `share` of them, drawn by `seed` whatever their order.

    >>> ids = [f"g{i}" for i in range(10)]
    >>> held = held_out_games(ids, 0.2, 0)
    >>> len(held), held == held_out_games(ids[::-1], 0.2, 0), held_out_games(ids, 0.0, 0)
    (2, True, frozenset())
    """
    if not 0.0 <= share < 1.0:
        raise ValueError(f"A2RL_GRPO_HOLDOUT must be a share in [0, 1) (got {share})")
    ids = sorted(set(goal_ids))
    return frozenset(random.Random(f"rl-holdout-{seed}").sample(ids, round(share * len(ids))))


def sft_examples(data_path: Path, train_file: Path, task: str, tokenizer, max_length: int,
                 search: bool, exclude: frozenset[str] = frozenset()) -> tuple[list, int]:  # fmt: skip
    """The worked examples that fit, plus (with `search`) the searching demonstrations built from the training
    games; (examples, rows read). Rows of the games in `exclude` (by `goal_id`: RL's held-out games) are left out.
    A task whose games this builder cannot search keeps its worked examples."""
    with Path(train_file).open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    examples, n_rows = sft_torch.examples_from_rows([r for r in rows if _kept(r, exclude)], tokenizer, max_length)
    if not search or not task:
        return examples, n_rows
    try:
        envlib = search_demos.import_envlib(data_path)
        extra = [r for r in search_demos.sft_rows(envlib, task, data_path) if _kept(r, exclude)]
    except Exception as error:  # noqa: BLE001 - the demonstrations are a bonus: SFT goes on without them
        loop.log(f"no searching demonstrations ({type(error).__name__}: {error}); worked examples only")
        return examples, n_rows
    more, n = sft_torch.examples_from_rows(extra, tokenizer, max_length)
    loop.log(f"{len(more)}/{n} searching demonstration steps of {len({r['goal_id'] for r in extra})} training "
             f"games added to {len(examples)} worked examples"
             + (f"; {len(exclude)} training games held out of SFT for RL" if exclude else ""))  # fmt: skip
    return examples + more, n_rows + n


def _kept(row: dict, exclude: frozenset[str]) -> bool:
    return not isinstance(row, dict) or str(row.get("goal_id")) not in exclude


def _win_rate(stats) -> str:
    episodes = sum(x.episodes for x in stats)
    return f"{100 * sum(x.wins for x in stats) / episodes:.0f}%" if episodes else "-"


def default_round_s(budget_s: float) -> float:
    return min(120.0, max(20.0, budget_s / 6))


@dataclass
class Round:
    n: int
    method: str
    init: str
    steps: int
    loss: float
    train_s: float
    submission: str = "-"
    score: float | None = None
    note: str = ""
    detail: str = ""
    entropy_alarm: bool = False
    """An RL round ended by its sampling entropy rising three updates running."""


class InteractiveSession:
    """SFT rounds until validation stops rising, then GRPO rounds (or more SFT in mode sft-only)."""

    SAVE_S = 5.0
    """Guess for saving and submitting a checkpoint, before one has been timed."""

    def __init__(self, settings: loop.Settings, knobs: Knobs, client: loop.GradingClient, budget: dict):
        self.s, self.k, self.client, self.budget = settings, knobs, client, budget
        self.mode = read_mode(settings.workspace)
        self.task = os.environ.get("TASK", "")
        self.notes = settings.workspace / "code" / "NOTES.md"
        self.margin_s = 5.0 + 0.02 * float(budget["budget_s"])
        self.save_s = self.SAVE_S
        self.phase = "SFT"
        self.sft_scores: list[float | None] = []
        self.baseline: float | None = None
        self.best_score: float | None = None
        self.best_path: Path | None = None
        self.current_path: Path | None = None
        self.current_score: float | None = None
        self.submission_ids: dict[Path, int] = {}
        """The grader's id of each submitted checkpoint: a submission names the one its training started from."""
        self.rounds: list[Round] = []
        self.failures_in_a_row = 0
        self.model = self.tokenizer = self.sft = self.grpo = None
        self.rl_goal_ids: frozenset[str] | None = None
        self.entropy_rollbacks = 0

    # -- set-up ------------------------------------------------------------------------------------------
    def respect_mode(self) -> None:
        if self.mode == "sft-only":
            for name in RL_FILES:
                (self.s.workspace / "code" / name).unlink(missing_ok=True)
            loop.log("mode sft-only: RL code removed from code/; SFT rounds only")

    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        t0 = time.monotonic()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            grow_gpu_memory_in_place()
        self.tokenizer = AutoTokenizer.from_pretrained(self.s.model_path)
        self.tokenizer.padding_side = "left"  # generation; SFT pads on the right by itself
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch.manual_seed(self.s.seed)
        self.model = AutoModelForCausalLM.from_pretrained(self.s.model_path, dtype=torch.float32).to(device)
        self.model.eval()
        self.rl_goal_ids = self.held_out()
        examples, rows = sft_examples(self.s.data_path, self.s.train_file, self.task, self.tokenizer,
                                      self.k.sft_max_length, self.k.sft_search_demos,
                                      exclude=self.rl_goal_ids or frozenset())  # fmt: skip
        self.sft = sft_torch.SFTRounds(self.model, self.tokenizer, examples, lr=self.k.sft_lr,
                                       batch_size=self.k.sft_batch_size, seed=self.s.seed,
                                       checkpoint_layers=self.k.sft_checkpoint_layers,
                                       micro_tokens=self.k.sft_micro_tokens)  # fmt: skip
        loop.log(f"loaded {self.s.model_path} on {device} ({sum(p.numel() for p in self.model.parameters()):,} "
                 f"params), {len(examples)}/{rows} worked examples fit {self.k.sft_max_length} tokens, "
                 f"mode {self.mode}, {time.monotonic() - t0:.1f}s")  # fmt: skip

    def held_out(self) -> frozenset[str] | None:
        """RL's own training games, kept out of SFT (`A2RL_GRPO_HOLDOUT`), or None: SFT and RL both on all of them."""
        if not self.k.rl_holdout:
            return None
        if self.mode == "sft-only":
            loop.log(f"A2RL_GRPO_HOLDOUT={self.k.rl_holdout} ignored in mode sft-only: SFT trains on every game")
            return None
        ids = [str(g.get("id")) for g in search_demos.import_envlib(self.s.data_path).load_goals(self.s.data_path)]
        held = held_out_games(ids, self.k.rl_holdout, self.s.seed)
        if not held:  # a share too small for this many games: nothing to hold out, RL plays them all
            loop.log(f"A2RL_GRPO_HOLDOUT={self.k.rl_holdout} holds out no game of {len(set(ids))}: SFT and RL on all")
            return None
        loop.log(f"{len(held)} of {len(set(ids))} training games held out of SFT for RL (A2RL_GRPO_HOLDOUT)")
        return held

    def make_grpo(self):
        release_cached_gpu_memory()  # SFT's cached activation blocks go back before the rollout copy is made
        try:
            import grpo_env_torch
        except ImportError:
            from a2rl_bench.agents.reference_sft_grpo import grpo_env_torch
        k = self.k
        envlib = grpo_env_torch.import_envlib(self.s.data_path)
        return grpo_env_torch.GRPOEnv(
            self.model, self.tokenizer, envlib, self.task, self.s.data_path, lr=k.grpo_lr,
            goals_per_step=k.goals_per_step, group_size=k.group_size, max_episode_steps=k.max_episode_steps,
            temperature=k.temperature, loop_penalty=k.loop_penalty, invalid_penalty=k.invalid_penalty,
            algorithm=k.algorithm, gamma=k.gamma, seed=self.s.seed, engine=k.rollout_engine, max_samples=k.max_samples,
            micro_tokens=k.micro_tokens, checkpoint_layers=k.checkpoint_layers, goal_draw=k.goal_draw,
            goal_ids=self.rl_goal_ids, sweep=k.goal_sweep,
            curve=self.s.workspace / "code" / "rl_curve.jsonl",
            schedule=k.schedule(grpo_env_torch),
        )  # fmt: skip

    # -- rounds ------------------------------------------------------------------------------------------
    def round_seconds(self) -> float:
        budget_s = float(self.budget["budget_s"])
        wanted = (self.k.sft_round_s if self.phase != "GRPO" else self.k.grpo_round_s) or default_round_s(budget_s)
        usable = float(self.budget["remaining_s"]) - self.margin_s - self.save_s
        if self.phase == "SFT" and self.mode != "sft-only":  # SFT's share ends with this round at the latest
            usable = min(usable, self.sft_allowance_s())
        return min(wanted, usable)

    def sft_allowance_s(self) -> float:
        """Training seconds SFT may still take: within its cap, leaving RL its floor, less a save."""
        return sft_allowance_s(float(self.budget["budget_s"]), float(self.budget["remaining_s"]),
                               max_share=self.k.sft_max_share, rl_min_share=self.k.rl_min_share,
                               save_s=self.save_s, end_margin_s=self.margin_s)  # fmt: skip

    def rise_margin(self) -> float:
        return self.k.sft_rise_margin if self.k.sft_rise_margin is not None else 150 / self.k.validation_items

    def can_start(self) -> tuple[bool, float, str]:
        cap = self.budget.get("max_submissions")
        if cap is not None and self.budget.get("submissions_used", 0) >= cap:
            return False, 0.0, "submission cap reached"
        if self.phase == "GRPO" and self.entropy_rollbacks >= MAX_ENTROPY_ROLLBACKS:
            return False, 0.0, f"RL stopped: the sampling entropy rose three updates running {self.entropy_rollbacks}x"
        if self.failures_in_a_row >= loop.MAX_FAILURES_IN_A_ROW:
            return False, 0.0, f"{self.failures_in_a_row} failed rounds in a row"
        seconds = self.round_seconds()
        if seconds < loop.MIN_TRAIN_S and self.rounds:
            return False, 0.0, f"{self.budget['remaining_s']:.0f}s left, too little for another round"
        step_s = self.grpo.step_estimate_s() if self.phase == "GRPO" and self.grpo is not None else None
        if step_s and seconds < step_s:  # its rollouts would be cut at the deadline and dropped: no update
            return False, 0.0, (f"{self.budget['remaining_s']:.0f}s left, too little for another RL update (recent "
                                f"ones took up to {step_s:.0f}s)")  # fmt: skip
        return True, max(1.0, seconds), "round"

    def train_round(self, seconds: float) -> Round:
        n = len(self.rounds) + 1
        init = loop.relative_to_workspace(self.current_path or self.s.model_path, self.s.workspace)
        if self.phase == "GRPO":
            if self.grpo is None:
                self.grpo = self.make_grpo()
            steps, stats, train_s = self.grpo.train(seconds, self.k.grpo_max_steps)
            episodes = sum(x.episodes for x in stats)
            rollout_s = sum(x.rollout_s for x in stats)
            detail = (f"{self.k.algorithm}: {episodes} episodes ({episodes / max(rollout_s, 1e-9):.1f}/s in "
                      f"rollouts), {sum(x.wins for x in stats)} won, shaped reward "
                      f"{sum(x.mean_reward * x.episodes for x in stats) / max(1, episodes):.3f}, repeats "
                      f"{sum(x.mean_repeat * x.episodes for x in stats) / max(1, episodes):.2f}, "
                      f"win rate first/last update {_win_rate(stats[:1])}/{_win_rate(stats[-1:])}")  # fmt: skip
            loss = stats[-1].loss if stats else 0.0
            alarm = bool(stats) and stats[-1].entropy_alarm
            return Round(n, "GRPO", init, steps, loss, train_s, detail=detail, entropy_alarm=alarm)
        st = self.sft.train(seconds, self.k.sft_max_steps)
        detail = f"{st.examples} examples, {st.tokens} tokens, {st.tokens / max(st.train_s, 1e-9):.0f} tok/s"
        return Round(n, self.phase, init, st.steps, st.loss, st.train_s, detail=detail)

    def save(self) -> Path:
        try:
            from train_sft import save_checkpoint
        except ImportError:
            from a2rl_bench.agents.reference_sft.train_sft import save_checkpoint
        out = self.s.output_dir / f"v{loop.next_version(self.s.output_dir)}"
        self.s.output_dir.mkdir(parents=True, exist_ok=True)
        save_checkpoint(self.model, self.tokenizer, out)
        return out

    def restore_best(self) -> None:
        """Load the best checkpoint's weights into the model (the optimizers keep their state)."""
        from safetensors.torch import load_file

        if self.best_path is None or self.current_path == self.best_path:
            return
        state = load_file(str(self.best_path / "model.safetensors"), device=str(next(self.model.parameters()).device))
        missing, _ = self.model.load_state_dict(state, strict=False)
        if [m for m in missing if not m.endswith("lm_head.weight")]:  # tied embeddings are saved once
            raise RuntimeError(f"{self.best_path} lacks weights: {missing[:3]}")
        self.current_path, self.current_score = self.best_path, self.best_score
        if self.grpo is not None:
            self.grpo.weights_changed()
        loop.log(f"restored the best checkpoint {loop.relative_to_workspace(self.best_path, self.s.workspace)}")

    def play_round(self, seconds: float) -> bool:
        """Train, save, submit, decide the next phase; False when the grader refuses further submissions."""
        parent = self.submission_ids.get(self.current_path) if self.current_path is not None else None
        r = self.train_round(seconds)
        charged_before = float(self.client.budget()["elapsed_s"])
        out = self.save()
        self.current_path, self.current_score = out, None
        r.submission = loop.relative_to_workspace(out, self.s.workspace)
        stage = "GiGPO" if r.method == "GRPO" and self.k.algorithm == "gigpo" else r.method
        release_cached_gpu_memory()  # the grader evaluates it on this card while this process waits
        status, reply = self.client.submit(r.submission, stage=stage, parent=parent)
        if isinstance(reply.get("submission_id"), int):
            self.submission_ids[out] = reply["submission_id"]
        # What saving and submitting cost on the agent's clock (grading itself is not charged).
        self.save_s = max(self.SAVE_S, float(self.client.budget()["elapsed_s"]) - charged_before)
        self.rounds.append(r)
        if status != 200 or reply.get("status") != "scored":
            r.note = f"submit {status}: {reply.get('detail') or reply.get('error')}"
            self.failures_in_a_row += 1
            self.note(r)
            return status not in (403, 429)
        self.failures_in_a_row = 0
        r.score = self.current_score = reply.get("score")
        if reply.get("baseline_score") is not None:
            self.baseline = reply["baseline_score"]
        if loop.is_better(r.score, self.best_score):
            self.best_score, self.best_path = r.score, out
            r.note = "new best"
        loop.log(f"round {r.n} {r.method}: {r.steps} steps in {r.train_s}s, loss {r.loss}, {r.detail}; "
                 f"score {r.score} (baseline {self.baseline}, best {self.best_score})")  # fmt: skip
        self.next_phase(r)
        self.note(r)
        return True

    def next_phase(self, r: Round) -> None:
        if r.method == "SFT":
            self.sft_scores.append(r.score)
            self.budget = self.client.budget()
            split = sft_split(self.sft_scores, self.baseline, allowance_s=self.sft_allowance_s(),
                              min_round_s=loop.MIN_TRAIN_S, max_rounds=self.k.sft_max_rounds,
                              margin=self.rise_margin(), patience=self.k.sft_patience)  # fmt: skip
            if split.stop:
                self.phase = "SFT-anneal" if self.mode == "sft-only" else "GRPO"
                used = float(self.budget["elapsed_s"]) / float(self.budget["budget_s"])
                r.note = (r.note + "; " if r.note else "") + f"SFT stops ({split.reason}): next {self.phase}"
                if self.phase == "SFT-anneal":
                    self.sft.set_lr(min(self.sft.lr, self.k.sft_lr / 2))
                if not r.note.startswith("new best") and not self.goes_on(r):  # else from the best SFT checkpoint
                    self.restore_best()
                self.record_split(split, used)
                return
            if sft_finished(self.sft_scores, self.baseline, len(self.sft_scores) + 1, margin=self.rise_margin()):
                # No rise, but not yet a plateau (`sft_patience`): one more SFT round, at half the rate (the
                # annealed rounds of mode sft-only rose again after such a round in 7 of 14 runs on an H200)
                self.sft.set_lr(self.sft.lr / 2)
                note = f"no rise: SFT goes on at half the rate ({self.sft.lr:g})"
                r.note = (r.note + "; " if r.note else "") + note
        elif r.method == "SFT-anneal" and r.note != "new best":
            self.sft.set_lr(self.sft.lr / 2)
        if r.method == "GRPO" and r.entropy_alarm:  # the policy drifts: back to the best, at half the rate
            self.entropy_rollbacks += 1
            self.restore_best()
            if self.grpo is not None:
                self.grpo.rolled_back(f"entropy rose three updates running ({self.entropy_rollbacks})")
            r.note = (r.note + "; " if r.note else "") + (
                f"entropy rose three updates running: best checkpoint restored, RL rate halved "
                f"({self.entropy_rollbacks}/{MAX_ENTROPY_ROLLBACKS})")  # fmt: skip
            return
        if r.note.startswith("new best") or self.goes_on(r):
            return
        self.restore_best()

    def goes_on(self, r: Round) -> bool:
        """Whether what follows round `r` starts from its checkpoint: its validation score fell no more than
        `rollback_margin` points below the best (noted in `r`). Gains come in steps smaller than a 60-game score's
        noise: in the twelfth RL pass every SFT round the agent discarded for the best on validation was better on
        the hidden games (3 of 3, by 5.9 to 20.2 points; BENCHMARKS.md)."""
        if r.score is None or self.best_score is None or r.score < self.best_score - self.k.rollback_margin:
            return False
        if not r.note.startswith("new best"):
            what = "RL" if r.method == "GRPO" else "SFT"
            r.note = (r.note + "; " if r.note else "") + f"{what} goes on from here"
        return True

    def record_split(self, split: Split, used: float) -> None:
        """Why SFT stopped and the checkpoint what follows starts from: in the log and (RL) in rl_curve.jsonl."""
        start = loop.relative_to_workspace(self.current_path or self.s.model_path, self.s.workspace)
        row = {"update": 0, "sft_stopped": split.reason, "sft_rounds": len(self.sft_scores),
               "sft_scores": self.sft_scores, "sft_budget_share": round(used, 3), "starts_from": start,
               "starts_from_score": self.current_score, "next": self.phase}  # fmt: skip
        loop.log(f"SFT stops after {len(self.sft_scores)} rounds and {used:.0%} of the budget: {split.reason}; "
                 f"{self.phase} starts from {start} (validation {self.current_score})")  # fmt: skip
        if self.phase == "GRPO":
            with (self.s.workspace / "code" / "rl_curve.jsonl").open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    # -- notes ---------------------------------------------------------------------------------------------
    def note(self, r: Round) -> None:
        row = [r.n, r.method, r.init, r.steps, r.loss, r.train_s, r.submission,
               "-" if r.score is None else r.score, r.note, r.detail]  # fmt: skip
        with self.notes.open("a", encoding="utf-8") as f:
            f.write("| " + " | ".join(str(x) for x in row) + " |\n")

    def run(self) -> None:
        self.respect_mode()
        self.notes.parent.mkdir(parents=True, exist_ok=True)
        self.notes.write_text(
            "# reference-sft-grpo notes\n\nOne process: full fine-tuning on data/sft.jsonl in rounds until the "
            "validation score stops rising, then "
            + ("more SFT at half the learning rate (mode sft-only)" if self.mode == "sft-only" else
               f"{self.k.algorithm.upper()} with online rollouts on training goals (loop and invalid-action "
               "penalties; per-update curve in code/rl_curve.jsonl)")
            + f", one submission per round.\n\n- knobs: {json.dumps(asdict(self.k))}\n\n"
            "| round | method | init | steps | loss | train s | submission | score | note | detail |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n",
            encoding="utf-8",
        )  # fmt: skip
        try:
            self.load()
            while True:
                self.budget = self.client.budget()
                start, seconds, reason = self.can_start()
                if not start:
                    loop.log(f"stopping: {reason}")
                    break
                loop.log(f"round {len(self.rounds) + 1} {self.phase}: {seconds:.0f}s of training")
                if not self.play_round(seconds):
                    break
        finally:
            best = loop.relative_to_workspace(self.best_path, self.s.workspace) if self.best_path else "none"
            summary = f"best {best}, validation {self.best_score} (baseline {self.baseline})"
            loop.log(f"done after {len(self.rounds)} rounds; {summary}")
            with self.notes.open("a", encoding="utf-8") as f:
                f.write(f"\nAfter {len(self.rounds)} rounds: {summary}.\n")


def applies(data_path: Path) -> bool:
    """Whether the task ships what this session needs: environments and worked examples."""
    return (data_path / "envlib.zip").is_file() and (data_path / loop.DEMONSTRATIONS).is_file()
