"""RL that learns, on the CPU: from an untrained model, GRPO and GiGPO raise the greedy win rate of a small text
game from near chance to >= 90% within a bounded number of updates, through the agent's own update, advantage
and sampler code (`grpo_env_torch.GRPOEnv` with the decode-engine sampler and its bf16 rollout copy).

The game sits behind the same environment interface the agent plays ALFWorld through (`envlib`: goals, a
factory of environments, the evaluator's prompter, action parsing, the stop string and step limits), so only the
game is the test's own. The model is a tiny Llama on a word-level vocabulary of a few dozen tokens (the tiny
BPE model's 512 tokens would put chance near zero: no group would ever win, so nothing could be learned).

* ``take``: the observation names one of four objects; replying with its name wins (one step). Both GRPO and
  GiGPO learn it here (one update: 8 goals x 16 episodes, lr 3e-3; greedy 0% -> 100% in 30-35 updates).
* ``open-see`` (``boxed``, ``look``): the box must be opened, then looked into ("open", then "see"): two correct
  actions in a row, win-only. Asserted (fifth pass, issue 42): GRPO with the agent's KL target wins 52-61 of 64
  sampled episodes in updates 23-25 and 100% greedy at update 25 (seed 0; untrained and frozen: 0-2%). With the
  advantage's sign flipped it fails (greedy 0% and 0-2 sampled wins through 40 updates). Giving half the reward
  for the opened box instead made "open" win out at both steps on some seeds (stuck at reward 0.5).
* ``open-take`` (``boxed``): the object is in a closed box: "open" first, then its name (two steps; an opened box
  earns half the reward), for GiGPO's step-level credit. Not asserted: no setting tried reached 90% greedy on
  three seeds within the ~60 s a suite test may take (GiGPO, 8 goals x 16 episodes, <= 160 updates, one thread on
  the shared 2-core machine, 0.3-0.8 s per update). Every run learns "open" in 30-40 updates (sampled reward 0.25
  -> 0.5); reading the object after it is the hard part. Tried (seed 0 unless said): this tied model at lr 1e-3 or
  3e-3 stays at 25% for 150 updates (at 60, its step-2 distribution over the objects was the same whatever object
  the observation named); lr 1e-2 reaches 25%, then collapses to 0 wins. With its input and output embeddings
  untied (a test-only change) it learns the objects one at a time: lr 3e-3 50%, lr 5e-3 peaked at 75% (seed 1: at
  50%, ended at 25%), 32 episodes a group 25%, temperature 1.5 25%; with 2 epochs x 2 minibatches, lr 3e-3: 75%,
  then entropy 0 (every episode of the last object's groups loses alike: no advantage left); the same at
  temperature 1.3: 100% at 90 updates for seed 0, but seed 1 peaked at 75% and fell back, and seed 2 collapsed to
  0 wins at update 88 (one update with approximate KL 1.67 to the sampling policy), as lr 2e-3 did at update ~85
  (at temperature 1.3, lr 2e-3: seed 2 100% at 70 updates, seed 1 25% through 150). At learning rates fast enough
  for the time limit, training was unstable; slower ones did not get past 25-50% in time. Third pass (win-only
  returns, per-episode weighting; issue 42): still not asserted. GRPO, lr 3e-3, seed 0: 0% greedy through 120
  updates, sampled wins 3 of 128 at update 5, then 0. A variant whose first action is read from the
  observation and the second is fixed (take the object named, then "box"; 0.5 for the first): sampled reward
  0.11 -> 0.25 over 25 updates (the first step learned), no win, 0% greedy; stopped there (the shared machine
  at load 50-300 gave ~5 s per update).

Checked by mutation (each once, on the clipped update too): the advantage's sign flipped fails it (greedy 0%,
sampled wins 4 -> 0 of 128); the sampler's copy never synced after an update fails it (greedy 0-25%, sampled wins
stay ~6/128); the loss mask widened to the whole sequence does NOT fail it: a group's prompts are identical and
its normalised advantages sum to zero, so the prompt tokens' terms cancel exactly (even with a per-episode noise
word in the prompt it still learned, in 60 updates instead of 45). The mask is caught by
``test_the_update_learns_from_the_action_tokens_only`` instead: one update on three steps with different prompts
and advantages that do not sum to zero, whose gradient must equal that of the action tokens alone. Checked by
mutation, once each: every token after the first scored, consistently (`update` given ``([p[0]], p[1:] + a,
adv)``) fails it (relative gradient distance 0.96 against < 1e-4 allowed; 4.5e-6 unmutated); the mask builder
`_batch` alone widened fails it with a shape error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from a2rl_bench.agents.reference_sft_grpo import grpo_env_torch

OBJECTS = ("apple", "book", "card", "egg")
WORDS = ("open", "box", "see", "Nothing", "happens.", "won", "system", "user", "assistant", ".")
SYSTEM = " ".join(["see"] * 12 + ["."] + ["open", "box", "."] * 8)
"""Long enough (>= 32 tokens) for the sampler to prefill it once per step, as on ALFWorld."""


# -- the game, behind the envlib interface -------------------------------------------------------------------
@dataclass
class Result:
    observation: str
    reward: float
    done: bool
    info: dict


class Game:
    """One episode. `boxed`: the object must be uncovered with "open" before it can be taken. `look`: once the box
    is open, looking into it ("see") wins, whatever the object."""

    def __init__(self, boxed: bool, look: bool = False):
        self.boxed, self.look = boxed, look

    def reset(self, goal: dict, seed: int | None = None):
        self.target, self.open = goal["object"], not self.boxed
        return self.observation(), {}

    def observation(self) -> str:
        return f"see {self.target} ." if self.open else "see box ."

    def state_key(self):
        return ("open" if self.open else "closed", self.target)

    def step(self, action: str) -> Result:
        if not self.open and action == "open":
            self.open = True
            return Result(f"open box . see {self.target} .", self.progress(), False, {"won": False})
        if self.open and action == ("see" if self.look else self.target):
            return Result("won .", 1.0, True, {"won": True})
        return Result("Nothing happens.", self.progress(), False, {"won": False})

    def progress(self) -> float:
        """The reward so far (paid in full at the end, as ALFWorld does): half for an opened box (none when
        looking: there the reward is the win alone)."""
        return 0.5 if self.boxed and self.open and not self.look else 0.0


def game_envlib(boxed: bool, look: bool = False) -> SimpleNamespace:
    """The game as an `envlib` (what `grpo_env_torch` imports from the task's ``data/envlib.zip``)."""

    def prompter(goal, first, turns):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]
        for turn in turns:
            messages += [{"role": "assistant", "content": turn["completion"]},
                         {"role": "user", "content": turn["observation"]}]  # fmt: skip
        return messages

    return SimpleNamespace(
        MAX_STEPS={"game": 2 if boxed else 1},
        STOP="\n",
        load_goals=lambda data_dir: [{"id": f"{o}-{i}", "object": o} for o in OBJECTS for i in range(2)],
        make_env=lambda task, data_dir: (lambda: Game(boxed, look)),
        prompter=lambda task: prompter,
        parse_action=lambda text: (text.split() or [""])[0],
    )


# -- a tiny model on a word-level vocabulary -------------------------------------------------------------------
def word_model(seed: int = 0):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from tests.tiny_model import CHATML_TEMPLATE, SPECIAL_TOKENS

    words = list(dict.fromkeys([*SPECIAL_TOKENS, "[UNK]", *OBJECTS, *WORDS]))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                        pad_token="<|pad|>", unk_token="[UNK]",
                                        extra_special_tokens=["<|im_start|>"])  # fmt: skip
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.padding_side = "left"
    ids = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": tokenizer.eos_token_id}  # fmt: skip
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, initializer_range=0.02, **ids)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(**ids)
    return model, tokenizer


def greedy_win_rate(grpo: grpo_env_torch.GRPOEnv, envlib) -> float:
    """Wins of the policy itself (fp32, greedy, through the decode engine) on every goal once."""
    greedy = grpo_env_torch.greedy_sampler(grpo.model, grpo.tokenizer, max_new_tokens=2, stop=envlib.STOP)
    goals = envlib.load_goals(None)
    rollouts = grpo_env_torch.play(envlib, "game", None, goals, greedy, envlib.MAX_STEPS["game"], seed=0)
    return sum(r.won for r in rollouts) / len(rollouts)


def arm(algorithm: str, envlib, curve: Path | None, *, lr: float, temperature: float = 1.0, group_size: int = 16,
        seed: int = 0, schedule: grpo_env_torch.Schedule | None = None) -> grpo_env_torch.GRPOEnv:  # fmt: skip
    """One RL arm on the game from an untrained model (lr 0: the frozen arm)."""
    model, tokenizer = word_model(seed)
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "game", None, lr=lr, goals_per_step=8,
                                  group_size=group_size, max_episode_steps=2, temperature=temperature,
                                  loop_penalty=0.5, invalid_penalty=0.1,
                                  seed=seed, algorithm=algorithm, max_new_tokens=2, engine="engine",
                                  curve=curve, schedule=schedule or grpo_env_torch.Schedule())  # fmt: skip
    assert isinstance(grpo.sample, grpo_env_torch.EngineSampler)  # rollouts from the bf16 copy, synced
    return grpo


def learn(algorithm: str, boxed: bool, tmp_path, *, max_updates: int, lr: float = 3e-3, temperature: float = 1.0,
          group_size: int = 16, seed: int = 0, look: bool = False, schedule: grpo_env_torch.Schedule | None = None,
          stop_at_greedy: bool = True):
    """Updates until the greedy win rate (checked every 5) reaches 90% (or all `max_updates` of them, without
    `stop_at_greedy`); the curve and the rates seen."""
    envlib = game_envlib(boxed, look)
    curve = tmp_path / f"{algorithm}-{boxed}.jsonl"
    grpo = arm(algorithm, envlib, curve, lr=lr, temperature=temperature, group_size=group_size, seed=seed,
               schedule=schedule)  # fmt: skip
    rates = [greedy_win_rate(grpo, envlib)]
    for update in range(1, max_updates + 1):
        grpo.grpo_step()
        if update % 5 == 0:
            rates.append(greedy_win_rate(grpo, envlib))
            if rates[-1] >= 0.9 and stop_at_greedy:
                break
    rows = [json.loads(line) for line in curve.read_text().splitlines()]
    return rates, rows


@pytest.mark.parametrize("algorithm", ["grpo", "gigpo"])
def test_rl_raises_the_greedy_win_rate_from_chance(algorithm, tmp_path, one_torch_thread):
    rates, rows = learn(algorithm, False, tmp_path, max_updates=80)
    print(f"{algorithm}: greedy win rate every 5 updates {rates}; sampled wins per update "
          f"{[r['wins'] for r in rows]} of {rows[0]['episodes']}")  # fmt: skip
    assert rates[0] <= 0.25, rates  # an untrained model: chance or below
    assert rates[-1] >= 0.9, rates
    # The rollouts learn too (they sample from the synced bf16 copy): the sampled win rate (temperature 1) of the
    # last three updates is well above that of the first three.
    early, late = (sum(r["wins"] for r in part) / sum(r["episodes"] for r in part) for part in (rows[:3], rows[-3:]))
    assert late >= max(0.25, 2 * early), [r["wins"] for r in rows]


def test_rl_learns_two_actions_in_a_row_that_a_frozen_arm_does_not(tmp_path, one_torch_thread):
    """``open-see``: the box must be opened, then looked into, and only that wins (win-only: nothing for an
    opened box). The untrained policy wins 0-2% of its sampled episodes. GRPO as the agent runs it (win-only
    returns, the KL target 0.02 adapting the rate, never past its peak; 8 games x 8 episodes an update, lr 5e-3)
    wins nearly all within 40 updates, greedy too, where the frozen arm (the same model, rollouts and seeds at
    lr 0) stays at chance. Seed 0 here; seeds 1 and 2 (not asserted): the last three updates won 145 and 189 of
    192 episodes (seed 0: 190), greedy 100% for all three. Greedy reaches 90% first (updates 15-30), the sampled
    episodes later: all 40 updates run."""
    envlib = game_envlib(True, look=True)
    schedule = grpo_env_torch.Schedule(kl_target=0.02)
    rates, rows = learn("grpo", True, tmp_path, max_updates=40, lr=5e-3, group_size=8, look=True, schedule=schedule,
                        stop_at_greedy=False)  # fmt: skip
    frozen = arm("grpo", envlib, None, lr=0.0, group_size=8, schedule=schedule)
    frozen_wins = [sum(r.won for r in frozen.rollouts()) for _ in range(3)]
    print(f"greedy win rate every 5 updates {rates}; sampled wins per update {[r['wins'] for r in rows]} of "
          f"{rows[0]['episodes']}; frozen arm {frozen_wins}")  # fmt: skip
    assert rates[0] == greedy_win_rate(frozen, envlib) <= 0.25 and rates[-1] >= 0.9, rates
    late = sum(r["wins"] for r in rows[-3:])
    assert late >= max(0.5 * sum(r["episodes"] for r in rows[-3:]), 5 * sum(frozen_wins)), (late, frozen_wins)


# -- more learning per rollout: minibatches, clipped ratios, the schedule ---------------------------------------
def one_update(tmp_path, *, lr: float, schedule, exact_copy: bool = False):
    envlib = game_envlib(False)
    model, tokenizer = word_model()
    curve = tmp_path / f"curve-{lr}-{exact_copy}.jsonl"
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "game", None, lr=lr, goals_per_step=8, group_size=16,
                                  max_episode_steps=1, temperature=1.0, loop_penalty=0.5, seed=0,
                                  max_new_tokens=2, engine="engine", curve=curve, schedule=schedule)  # fmt: skip
    if exact_copy:  # the sampler's weights equal to the policy's: its log-probs are the policy's own
        grpo.sample.copy.float()
        grpo.sample.sync()
    captured = {}
    update = grpo.update
    grpo.update = lambda samples: captured.setdefault("stats", update(samples))
    stats = grpo.grpo_step()
    return stats, captured["stats"], json.loads(curve.read_text().splitlines()[-1])


def test_an_update_takes_epochs_times_minibatches_clipped_steps_and_logs_them(tmp_path, one_torch_thread):
    schedule = grpo_env_torch.Schedule(epochs=2, minibatches=3, warmup_steps=4, decay_steps=10)
    # Sampled by weights equal to the policy's: the first minibatch's ratios are 1.
    stats, update, row = one_update(tmp_path, lr=1e-4, schedule=schedule, exact_copy=True)
    assert update.first_ratio_max_dev <= 1e-5
    assert stats.update.optimizer_steps == 6 and row["optimizer_steps"] == 6
    for field in ("wins", "entropy", "clip_fraction", "approx_kl", "optimizer_steps", "lr"):
        assert field in row, field
    assert row["entropy"] > 0 and row["approx_kl"] >= 0
    assert row["lr"] == pytest.approx(1e-4 * schedule.lr_factor(5), rel=1e-4)  # the last step's rate: past the warm-up
    # The engine's bf16 copy sampled: ratios near 1 (rounding only), and a large step clips many tokens.
    _, small, _ = one_update(tmp_path, lr=1e-4, schedule=schedule)
    _, large, _ = one_update(tmp_path, lr=3e-2, schedule=schedule)
    assert small.first_ratio_max_dev < 0.1
    assert small.clip_fraction < 0.05 < large.clip_fraction and small.approx_kl < large.approx_kl


def test_the_learning_rate_warms_up_then_decays():
    s = grpo_env_torch.Schedule(warmup_steps=4, decay_steps=100, min_lr_share=0.1)
    rates = [s.lr_factor(i) for i in range(120)]
    assert rates[:4] == [0.25, 0.5, 0.75, 1.0] and rates[4] == 1.0
    assert all(a >= b for a, b in zip(rates[4:], rates[5:])) and rates[-1] == pytest.approx(0.1)
    assert grpo_env_torch.Schedule().lr_factor(10_000) == 1.0  # no schedule: constant
    with pytest.raises(ValueError):
        grpo_env_torch.Schedule(minibatches=0)


def test_the_rl_only_bench_spreads_its_runs_over_the_visible_cards():
    """Two H200s, 2026-11-29: the bench's four processes all ran on card 0 while card 1 idled (unless started
    twice by hand). Each child now gets a card of its own in turn; one card or none changes nothing."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_rl_only

    assert bench_rl_only.cards_for(4, "", 2) == ["0", "1", "0", "1"]
    assert bench_rl_only.cards_for(3, "5,7", 2) == ["5", "7", "5"]  # the ids the parent was given, not 0 and 1
    assert bench_rl_only.cards_for(2, "", 1) == [None, None] and bench_rl_only.cards_for(2, "3", 1) == [None, None]


def test_the_rl_only_bench_table_reads_a_sweep_row_as_no_update():
    """An arm with A2RL_GRPO_SWEEP writes a sweep row (wins, no episodes) before its first update: the table shows it
    and takes its updates from the update rows (the seventeenth GPU pass's table failed on a KeyError there)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_rl_only

    arm = "grpo:A2RL_GRPO_SWEEP=1"
    rows = [{"arm": arm, "seed": 0, "update": 0, "val_won": 1, "val_n": 2, "val_games": "10"},
            {"arm": arm, "seed": 0, "update": 0, "sweep": 6, "wins": 5},
            *({"arm": arm, "seed": 0, "update": u, "episodes": 4, "wins": w} for u, w in ((1, 1), (2, 3))),
            {"arm": arm, "seed": 0, "update": 2, "final": True, "test_won": 1, "test_n": 2, "test_games": "01"}]
    line = next(x for x in bench_rl_only.table(rows).splitlines() if x.startswith(f"| {arm} | 0 | "))
    assert "sweep 5/6; 1, 3 (of 4)" in line and "25.0% -> 75.0%" in line and "| 1/2 |" in line


def test_the_rl_only_bench_runs_on_the_cpu(tiny_model_dir, tmp_path, capsys):
    """`bench/bench_rl_only.py --smoke`: SFT checkpoint made, each arm's updates and validations recorded, the
    table printed (the path the GPU bench takes, at toy sizes)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_rl_only

    out = tmp_path / "rl.jsonl"
    arm = "gigpo@seen:A2RL_GRPO_GOAL_DRAW=learnability"  # on the games SFT saw, with its own knob
    assert bench_rl_only.main([str(tiny_model_dir), "--smoke", "--sequential", "--arms", arm, "none",
                               "--holdout", "0.25", "--seeds", "1", "--out", str(out), "--sft-anneal-s", "600",
                               "--sft-anneal-steps", "1", "--work", str(tmp_path / "work")]) == 0  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    runs = [(a, 1) for a in (arm, "none")]  # a rollout seed per run (the GPU bench: 0 1 2)
    # --holdout: the frozen arm plays the held-out quarter of the 600 training games, the other arm the rest
    assert {(r["arm"], r["goals"], r["goal_draw"]) for r in rows} == {(arm, 450, "learnability"),
                                                                       ("none", 150, "uniform")}  # fmt: skip
    with pytest.raises(SystemExit):
        bench_rl_only.parse_args([str(tiny_model_dir), "--arms", "grpo@unseen"])
    assert [(r["arm"], r["seed"], r["update"]) for r in rows] == [(a, s, u) for a, s in runs for u in (0, 1, 2, 2)]
    assert all(r["val_n"] == 2 for r in rows if not r.get("final")) and rows[1]["optimizer_steps"] >= 0
    assert "clip_fraction" in rows[1] and "minibatches_used" in rows[1] and "max_memory_gib" in rows[1]
    finals = [r for r in rows if r.get("final")]
    assert len(finals) == 2 and all(r["test_n"] == 2 and 0 <= r["test_won"] <= 2 for r in finals)  # the last checkpoint
    # per game, in the games' order, so that an arm pairs with the frozen one on the same games
    assert all(len(r["test_games"]) == 2 and r["test_games"].count("1") == r["test_won"] for r in finals)
    assert all(len(r["val_games"]) == 2 for r in rows if "val_won" in r)
    printed = capsys.readouterr().out
    assert f"| {arm} | 1 | " in printed and "| none | 1 | " in printed and "0/2 @ 0" not in printed  # the table
    gigpo_row = next(line for line in printed.splitlines() if line.startswith(f"| {arm} | 1 | "))
    assert gigpo_row.count("p=") == 2 and "(n=2)" in gigpo_row  # last validation and test against the frozen arm
    assert "searching demonstration steps" in printed  # the SFT checkpoint saw the agent's own search data
    assert "150 training games held out of SFT for RL" in printed and '"held_out": 150' in printed
    # the anneal bound by steps, not by the machine's speed, and named so
    assert '"steps": 2' in printed and '"anneal_steps": 1,' in printed
    made = [p.name for p in (tmp_path / "work").glob("sft-*")]
    assert made == ["sft-2-steps-seed-0-search-holdout-0.25-anneal-600s-1-steps"], made


# -- the loss reads the action tokens only -------------------------------------------------------------------
def action_only_gradient(samples, model, *, mask_off: bool = False, token_mean: bool = False,
                         temperature: float = 0.5) -> dict:
    """Reference gradient of the update's first step when the sampler is the policy (ratio 1): minus the
    advantage-weighted log-likelihood of the action tokens, averaged per episode over its tokens, then over the
    episodes, by a plain full-logits forward pass. `mask_off`: every token after the first scored instead (what
    a missing action mask computes); `token_mean`: one mean over all tokens (long episodes weigh more). The
    log-probs are those of the sampling distribution, softmax(logits / `temperature`)."""
    import torch

    model.zero_grad(set_to_none=True)
    scored = [([p[0]], p[1:] + a, adv, e) if mask_off else (p, a, adv, e) for p, a, adv, e in samples]
    tokens = {e: sum(len(a) for _, a, _, f in scored if f == e) for *_, e in scored}
    loss = 0.0
    for p, a, adv, e in scored:
        n = sum(tokens.values()) if token_mean else tokens[e] * len(tokens)
        ids = torch.tensor([p + a])
        log_probs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float() / temperature, dim=-1)
        loss = loss - adv * log_probs[len(p) - 1 :].gather(-1, ids[0, len(p) :, None]).sum() / n
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def test_the_update_learns_from_the_action_tokens_only(tmp_path, one_torch_thread):
    """The action mask, through the agent's own update (`GRPOEnv.update`: its batching, shared-prefix forward,
    clipped ratio, log-probs at the sampling temperature, per-episode token mean): on steps with different
    prompts and advantages that do not sum to zero (so prompt terms would not cancel, as they do within a GRPO
    group), the first optimizer step's gradient is that of the action tokens' log-likelihood alone (each
    episode weighted the same, at the sampling temperature), and far from the gradient with the prompt tokens
    scored too, with a token mean over the batch, or at T = 1.
    (The output layer's rows of prompt-only tokens are no test of this: the softmax gives every row a gradient.)"""
    import torch

    envlib = game_envlib(True)
    model, tokenizer = word_model()
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "game", None, lr=1e-3, goals_per_step=8, group_size=4,
                                  max_episode_steps=2, temperature=0.5, loop_penalty=0.5, seed=0, max_new_tokens=2,
                                  engine="engine", max_grad_norm=1e9)  # fmt: skip
    grpo.sample.copy.float()  # the sampler's weights equal to the policy's: every ratio of the first step is 1
    grpo.sample.sync()
    prompter, eos = envlib.prompter("game"), [tokenizer.eos_token_id]

    def prompt(goal, turns):  # a step's prompt exactly as the rollouts render it
        game = Game(boxed=True)
        first, _ = game.reset(goal)
        return grpo_env_torch._render(tokenizer, [prompter(goal, first, turns)])[0]

    def word(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"] + eos

    opened = [{"completion": "open", "observation": "open box . see apple ."}]
    # Two steps of one episode, one of another: each episode counts once, whatever its number of tokens.
    samples = [(prompt({"object": "apple"}, []), word("open"), 1.0, 0),
               (prompt({"object": "apple"}, opened), word("apple"), 0.5, 0),
               (prompt({"object": "book"}, []), word("egg"), -0.3, 1)]  # fmt: skip
    prompts = [p for p, *_ in samples]  # the shipped path: the shared system prompt run once for the batch
    assert grpo_env_torch.shared_prefix_length(prompts, [len(p) for p in prompts]) >= grpo_env_torch.MIN_TRAIN_PREFIX
    want = action_only_gradient(samples, model)
    wrong = action_only_gradient(samples, model, mask_off=True)
    by_token = action_only_gradient(samples, model, token_mean=True)
    at_one = action_only_gradient(samples, model, temperature=1.0)

    seen = {}
    grpo.optimizer.step = lambda *a, **k: seen.update({n: p.grad.clone() for n, p in model.named_parameters()})
    stats = grpo.update(samples)
    assert stats.optimizer_steps == 1 and stats.first_ratio_max_dev <= 1e-4  # fp32 rounding, doubled by 1 / T

    def distance(a, b):  # relative to the action-only gradient's norm, over all parameters
        return float(sum(((a[n] - b[n]) ** 2).sum() for n in a) ** 0.5 / sum((b[n] ** 2).sum() for n in b) ** 0.5)

    assert distance(wrong, want) > 0.5  # the prompt's tokens would change the step a lot: the test can tell
    assert distance(by_token, want) > 0.1  # so would a token mean over the batch
    assert distance(at_one, want) > 0.1  # and scores at T = 1 when the sampler drew at T = 0.5
    assert distance(seen, want) < 1e-4, distance(seen, want)


# -- the trust region ----------------------------------------------------------------------------------------
def test_a_kl_target_stops_the_update_and_adapts_the_rate(tmp_path, one_torch_thread):
    """Past 1.5 x the KL target an update takes no further minibatch (the one that overshot is not stepped) and
    the rate halves; far below it, every minibatch is taken and the rate rises. The curve records both."""
    tight = grpo_env_torch.Schedule(minibatches=4, kl_target=1e-5)
    stats, update, row = one_update(tmp_path, lr=3e-2, schedule=tight)
    assert update.kl_stopped and 1 <= update.minibatches_used < 4 and update.optimizer_steps == update.minibatches_used
    assert row["kl_stopped"] and row["minibatches_used"] == update.minibatches_used
    loose = grpo_env_torch.Schedule(minibatches=4, kl_target=10.0)
    _, update, row = one_update(tmp_path, lr=1e-5, schedule=loose)
    assert not update.kl_stopped and update.minibatches_used == 4
    for field in ("win_rate", "mean_reward", "approx_kl", "entropy", "lr", "minibatches_used", "entropy_alarm"):
        assert field in row, field


def test_the_kl_target_adapts_the_learning_rate(tmp_path, one_torch_thread):
    envlib = game_envlib(False)
    model, tokenizer = word_model()

    def grpo_at(lr, kl_target):
        return grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "game", None, lr=lr, goals_per_step=8,
                                      group_size=16, max_episode_steps=None, temperature=1.0, loop_penalty=0.0,
                                      seed=0, max_new_tokens=2, engine="engine",
                                      schedule=grpo_env_torch.Schedule(minibatches=4, kl_target=kl_target))  # fmt: skip

    fast = grpo_at(3e-2, 1e-5)
    assert fast.max_episode_steps == 1  # the game's own step limit (its envlib.MAX_STEPS)
    fast.grpo_step()
    assert fast.lr_scale == 0.5
    fast.schedule = grpo_env_torch.Schedule(minibatches=4, kl_target=10.0)  # now timid: back up to the peak
    fast.grpo_step()
    assert fast.lr_scale == 0.75
    back = fast.grpo_step()
    assert back.update.lr == pytest.approx(3e-2 * 0.75, rel=1e-6) and fast.lr_scale == 1.0
    slow = grpo_at(1e-6, 10.0)
    slow.grpo_step()
    assert slow.lr_scale == 1.0  # a timid update never raises the rate past its peak
    second = slow.grpo_step()
    assert second.update.lr == pytest.approx(1e-6, rel=1e-6)


def first_action_kl(model, start, tokenizer, envlib) -> float:
    """KL(model || start) of the first action's first token, over the vocabulary, averaged over the game's goals."""
    import torch

    prompt = envlib.prompter("game")
    ids = grpo_env_torch._render(tokenizer, [prompt(g, Game(False).reset(g)[0], []) for g in envlib.load_goals(None)])
    with torch.no_grad():
        p, q = (torch.log_softmax(m(torch.tensor(ids)).logits[:, -1].float(), -1) for m in (model, start))
    return float((p.exp() * (p - q)).sum(-1).mean())


def test_a_kl_term_to_the_reference_keeps_rl_near_where_it_started(tmp_path, one_torch_thread):
    """`Schedule.ref_kl` (`A2RL_GRPO_REF_KL`): the same 20 updates from the same model, rollout seeds and rate, with
    and without the KL term (0.3) to the policy RL started from. The anchored policy ends nearer its start (the first
    action's KL to it, over the whole vocabulary), still learns (its sampled wins), records its walk per update, and
    its reference never moves. Why: from a 90% SFT end, unanchored RL lowered the hidden score in 6 of 6 runs
    (BENCHMARKS.md "RL, eighteenth pass")."""
    import copy

    from a2rl_bench.agents.reference_sft_grpo.sft_grpo_session import Knobs

    envlib = game_envlib(False)
    start, tokenizer = word_model()
    ended = {}
    for ref_kl in (0.0, 0.3):
        curve = tmp_path / f"curve-{ref_kl}.jsonl"
        grpo = grpo_env_torch.GRPOEnv(copy.deepcopy(start), tokenizer, envlib, "game", None, lr=3e-3,
                                      goals_per_step=8, group_size=16, max_episode_steps=None, temperature=1.0,
                                      loop_penalty=0.0, seed=0, max_new_tokens=2, engine="engine", curve=curve,
                                      schedule=grpo_env_torch.Schedule(ref_kl=ref_kl))  # fmt: skip
        for _ in range(20):
            grpo.grpo_step()
        rows = [json.loads(line) for line in curve.read_text().splitlines()]
        ended[ref_kl] = first_action_kl(grpo.model, start, tokenizer, envlib), rows
    (free, free_rows), (held, held_rows) = ended[0.0], ended[0.3]
    print(f"first action's KL to the start: free {free:.4f}, anchored {held:.4f}; walk per update "
          f"{[r['ref_kl'] for r in held_rows]}; sampled wins per update {[r['wins'] for r in free_rows]} and "
          f"{[r['wins'] for r in held_rows]} of {held_rows[0]['episodes']}")  # fmt: skip
    # seed 0: KL 1.21 free against 0.29 anchored; wins 4, 9, 7 -> 17, 20, 20 of 128 anchored (free: -> 21, 29, 31)
    assert free > 0.5 and held < 0.5 * free, (free, held)
    assert sum(r["wins"] for r in held_rows[-3:]) >= 1.5 * sum(r["wins"] for r in held_rows[:3])  # it still learns
    assert all(r["ref_kl"] is None for r in free_rows)  # no reference without the term: no second forward pass
    walk = [r["ref_kl"] for r in held_rows]
    assert walk[0] < 0.01 and max(walk[1:]) > 10 * walk[0]  # RL's start, then the walk away from it
    reference = grpo.reference.state_dict()
    assert all(torch_equal(reference[n], v) for n, v in start.state_dict().items())  # the anchor stays put
    with pytest.raises(ValueError, match="ref_kl"):
        grpo_env_torch.Schedule(ref_kl=-1.0)
    assert Knobs.from_env({"A2RL_GRPO_REF_KL": "0.05"}).schedule(grpo_env_torch).ref_kl == 0.05
    assert Knobs.from_env({}).schedule(grpo_env_torch).ref_kl == 0.0  # off by default: no gain shown


def test_a_zero_negative_weight_leaves_the_lost_episodes_out_and_still_learns(tmp_path, one_torch_thread):
    """`Schedule.negative_weight` (`A2RL_GRPO_NEGATIVE_WEIGHT`): the share of a negative advantage that reaches the
    loss. On one rollout batch, 1 keeps every step as GRPO gives it, 0.5 halves the negative ones and leaves the
    positive ones as they were, 0 keeps the won episodes' steps alone; and 20 updates at 0 still raise the sampled
    wins (only what beat its group pushes). Why: from a 90% SFT end, the lost episodes' negative tokens push down
    actions the won games take too (BENCHMARKS.md "RL, eighteenth pass")."""
    from a2rl_bench.agents.reference_sft_grpo.sft_grpo_session import Knobs

    envlib = game_envlib(False)
    model, tokenizer = word_model()
    curve = tmp_path / "curve.jsonl"
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "game", None, lr=3e-3, goals_per_step=8, group_size=16,
                                  max_episode_steps=None, temperature=1.0, loop_penalty=0.0, seed=0,
                                  max_new_tokens=2, engine="engine", curve=curve,
                                  schedule=grpo_env_torch.Schedule(negative_weight=0.0))  # fmt: skip
    rollouts = grpo.rollouts()
    by_weight = {}
    for weight in (1.0, 0.5, 0.0):
        grpo.schedule = grpo_env_torch.Schedule(negative_weight=weight)
        by_weight[weight] = grpo.update_samples(rollouts)
    full, half, none = by_weight[1.0], by_weight[0.5], by_weight[0.0]
    assert any(adv < 0 for *_, adv, _ in full) and any(adv > 0 for *_, adv, _ in full)  # mixed groups: both signs
    assert [(p, a, adv / 2 if adv < 0 else adv, e) for p, a, adv, e in full] == half
    assert none == [x for x in full if x[2] > 0] and all(rollouts[e].won for *_, e in none)
    for _ in range(20):
        grpo.grpo_step()
    wins = [json.loads(line)["wins"] for line in curve.read_text().splitlines()]
    print(f"negative weight 0: sampled wins per update {wins} of {len(rollouts)}")
    assert sum(wins[-3:]) >= 2 * sum(wins[:3]), wins  # it learns from the wins alone
    with pytest.raises(ValueError, match="negative_weight"):
        grpo_env_torch.Schedule(negative_weight=1.5)
    assert Knobs.from_env({"A2RL_GRPO_NEGATIVE_WEIGHT": "0"}).schedule(grpo_env_torch).negative_weight == 0.0
    assert Knobs.from_env({}).schedule(grpo_env_torch).negative_weight == 1.0  # off by default: no gain shown


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_three_rises_of_the_entropy_in_a_row_raise_the_alarm(tmp_path):
    envlib = game_envlib(False)
    model, tokenizer = word_model()
    curve = tmp_path / "curve.jsonl"
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "game", None, lr=1e-3, goals_per_step=2, group_size=2,
                                  max_episode_steps=None, temperature=1.0, loop_penalty=0.0, seed=0,
                                  max_new_tokens=2, engine="generate", curve=curve)  # fmt: skip
    grpo.entropies = [1.0, 1.1, 1.2]
    assert not grpo.entropy_alarm()  # two rises
    grpo.entropies.append(1.3)
    assert grpo.entropy_alarm()
    grpo.entropies = [1.0, 1.1, 1.105, 1.3]  # the second "rise" is within the noise share (2%)
    assert not grpo.entropy_alarm()
    grpo.entropies = [1.0, 1.1, 1.2, 1.3]
    grpo.rolled_back("test")
    assert grpo.lr_scale == 0.5 and grpo.entropies == [] and not grpo.entropy_alarm()
    assert json.loads(curve.read_text().splitlines()[-1])["rolled_back"] == "test"



def _mixed_groups(how: str, seed: int, goals: int = 120, hard: int = 12, steps: int = 30) -> float:
    """Share of groups (8 episodes of one goal) with both a win and a loss, over `steps` draws of 8 goals, when
    `hard` goals are won half the time and the rest 97%: the groups that carry a win-only gradient."""
    import random

    pool = [{"id": f"g{i}"} for i in range(goals)]
    chance = {id(g): 0.5 if i < hard else 0.97 for i, g in enumerate(pool)}
    draw, env, mixed = grpo_env_torch.GoalDraw(pool, how, random.Random(seed)), random.Random(seed + 1), 0
    for _ in range(steps):
        played = [g for g in draw.draw(8) for _ in range(8)]
        rollouts = [grpo_env_torch.Rollout(g["id"], won=env.random() < chance[id(g)]) for g in played]
        draw.record(played, rollouts)
        mixed += sum(0 < sum(r.won for r in rollouts[j : j + 8]) < 8 for j in range(0, 64, 8))
    return mixed / (8 * steps)


def test_the_learnability_goal_draw_sends_groups_to_the_goals_the_policy_wins_only_sometimes():
    """`A2RL_GRPO_GOAL_DRAW=learnability` (issue 42): a goal lost half the time is drawn far more often than goals
    always won; an unplayed goal weighs about the pooled loss rate, not 1/2 (or it would outweigh the half-lost
    goal and, over 600 goals, RL would play unplayed goals for the whole run); episodes cut by the deadline say
    nothing; the default stays the uniform draw it was (the same goals from the same seed)."""
    import random

    from a2rl_bench.agents.reference_sft_grpo.sft_grpo_session import Knobs

    goals = [{"id": f"g{i}"} for i in range(10)]
    draw = grpo_env_torch.GoalDraw(goals, "learnability", random.Random(0))
    assert draw.weight(0) == pytest.approx(0.25)  # nothing played: every goal alike
    played = [g for g in goals[:9] for _ in range(8)] + [goals[9]] * 8
    rollouts = [grpo_env_torch.Rollout(g["id"], won=True) for g in played[:72]]
    rollouts += [grpo_env_torch.Rollout("g9", won=j % 2 == 0) for j in range(8)]
    draw.record(played, rollouts)
    draw.record([goals[0]] * 4, [grpo_env_torch.Rollout("g0", cut=True) for _ in range(4)])  # cut: not counted
    assert draw.episodes[0] == 8 and draw.losses[9] == 4 and draw.pooled_loss_rate() == pytest.approx(5 / 82)
    assert draw.weight(9) > 4 * draw.weight(0) > 0
    picks = [g["id"] for _ in range(2000) for g in draw.draw(2)]
    assert picks.count("g9") / 2000 > 0.45  # uniform: 0.2
    assert all(picks.count(f"g{i}") > 0 for i in range(9))  # a goal always won is still drawn now and then
    fresh = grpo_env_torch.GoalDraw(goals + [{"id": "new"}], "learnability", random.Random(1))
    fresh.record(played, rollouts)
    assert fresh.weight(9) > 2 * fresh.weight(10) > 2 * fresh.weight(0)  # unplayed: between the two
    # Over a run: RL's 120 held-out games, 12 of them won half the time, 30 steps. More groups carry a gradient.
    learn = [_mixed_groups("learnability", s) for s in range(4)]
    even = [_mixed_groups("uniform", s) for s in range(4)]
    assert sum(learn) / 4 > sum(even) / 4 + 0.06, (learn, even)

    uniform = grpo_env_torch.GoalDraw(goals, "uniform", random.Random(7))
    uniform.record(played, rollouts)
    assert uniform.draw(3) == random.Random(7).sample(goals, 3)
    with pytest.raises(ValueError, match="goal draw"):
        grpo_env_torch.GoalDraw(goals, "hardest", random.Random(0))
    assert Knobs.from_env({}).goal_draw == "uniform"
    assert Knobs.from_env({"A2RL_GRPO_GOAL_DRAW": "learnability"}).goal_draw == "learnability"


def _learnability_game(curve: Path, **options) -> grpo_env_torch.GRPOEnv:
    """GRPO with the learnability draw on the two-step game, a word model, its curve at `curve`."""
    model, tokenizer = word_model()
    return grpo_env_torch.GRPOEnv(model, tokenizer, game_envlib(False), "game", None, lr=1e-3, goals_per_step=2,
                                  max_episode_steps=None, temperature=1.0, loop_penalty=0.0, seed=0, max_new_tokens=2,
                                  engine="engine", curve=curve, goal_draw="learnability", **options)  # fmt: skip


def test_a_step_records_each_episode_against_the_goal_it_played(tmp_path, one_torch_thread):
    curve = tmp_path / "curve.jsonl"
    grpo = _learnability_game(curve, group_size=4, goal_ids={"apple-0", "book-1", "card-0"})
    stats = grpo.grpo_step()
    draw = grpo.goal_draw
    assert sum(draw.episodes) == 8 and sorted(e for e in draw.episodes if e) == [4, 4]
    assert sum(draw.episodes) - sum(draw.losses) == stats.wins
    row = json.loads(curve.read_text().splitlines()[-1])
    assert row["goal_draw"] == "learnability" and row["goals"] == 3  # only the goals it was given
    assert {g["id"] for g in grpo.goals} == {"apple-0", "book-1", "card-0"}
    with pytest.raises(ValueError, match="no training goals"):
        _learnability_game(curve, group_size=4, goal_ids={"nothing"})


def test_a_sweep_plays_every_goal_once_before_the_first_update_and_tells_the_draw(tmp_path, one_torch_thread):
    """`A2RL_GRPO_SWEEP=1` (issue 42): before the first step's rollouts every training goal is played once, its
    outcome recorded in the goal draw (so the learnability draw knows where the losses are from the start), and a
    curve row says so; it happens once, and it is no step (the step's own rollouts are its goals x group)."""
    from a2rl_bench.agents.reference_sft_grpo.sft_grpo_session import Knobs

    curve = tmp_path / "curve.jsonl"
    grpo = _learnability_game(curve, group_size=2, sweep=True)
    goals = len(grpo.goals)
    stats = grpo.grpo_step()
    assert stats.episodes == 4
    assert sum(grpo.goal_draw.episodes) == goals + 4 and min(grpo.goal_draw.episodes) >= 1  # each goal once, + 4
    rows = [json.loads(line) for line in curve.read_text().splitlines()]
    assert rows[0]["sweep"] == goals == rows[0]["of"] and "update" in rows[1]
    grpo.grpo_step()
    assert sum(grpo.goal_draw.episodes) == goals + 8  # once only
    assert Knobs.from_env({}).goal_sweep is False and Knobs.from_env({"A2RL_GRPO_SWEEP": "1"}).goal_sweep is True


# -- the update's memory -----------------------------------------------------------------------------------------
def test_the_update_scores_the_action_tokens_alone_in_chunks_that_bound_the_logits(one_torch_thread):
    """Memory of an update (issue 42): the output layer runs on the action tokens alone, at most `chunk_rows` of
    them per call, in the sampling policy's pass, the update's forward pass and its recomputation in the backward
    pass; so no (batch, length, vocabulary) logits and no fp32 copy of more than a chunk's exist. The chunked
    log-probs at the sampling temperature equal those of the model's full logits."""
    import torch

    envlib = game_envlib(True)
    model, tokenizer = word_model()
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "game", None, lr=1e-3, goals_per_step=8, group_size=4,
                                  max_episode_steps=2, temperature=0.7, loop_penalty=0.5, seed=0, max_new_tokens=2,
                                  engine="engine", chunk_rows=3)  # fmt: skip
    calls: dict[str, list[tuple]] = {"policy": [], "sampler": []}
    seen = {}
    update = grpo.update

    def watched(samples):
        seen["samples"] = samples
        hooks = [head.register_forward_hook(lambda m, args, out, name=name: calls[name].append(tuple(args[0].shape)))
                 for name, head in (("policy", model.get_output_embeddings()),
                                    ("sampler", grpo.sample.copy.get_output_embeddings()))]  # fmt: skip
        try:
            return update(samples)
        finally:
            for hook in hooks:
                hook.remove()

    grpo.update = watched
    stats = grpo.grpo_step()
    assert stats.update.optimizer_steps == 1
    tokens = sum(len(a) for _, a, *_ in seen["samples"])
    assert tokens > 3 * 4  # enough action tokens for several chunks
    for name in calls:
        assert calls[name] and all(len(shape) == 2 and shape[0] <= 3 for shape in calls[name]), (name, calls[name])
    assert sum(shape[0] for shape in calls["sampler"]) == tokens  # each action token once, nothing else
    assert sum(shape[0] for shape in calls["policy"]) == 2 * tokens  # forward, then recomputed in the backward
    with torch.no_grad():
        batch = seen["samples"][:6]
        ids, mask, targets, _ = grpo._batch(batch)
        full = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float() / 0.7, dim=-1)
        want = full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)[targets[:, 1:]]
        ours = grpo._log_probs(model, batch)
    assert ours.shape == want.shape and torch.allclose(ours, want, atol=1e-5)


# -- the update's memory and speed (issue 42, sixth pass) ------------------------------------------------------
class SameBatch:
    """One rollout batch of the boxed game and a `GRPOEnv` whose update can run on it again and again from the same
    weights, optimizer state and minibatch order, each run with other settings of the update."""

    def __init__(self):
        import copy

        self.envlib = game_envlib(True)
        self.model, tokenizer = word_model()
        self.grpo = grpo_env_torch.GRPOEnv(self.model, tokenizer, self.envlib, "game", None, lr=3e-2, goals_per_step=8,
                                           group_size=4, max_episode_steps=2, temperature=0.7, loop_penalty=0.5,
                                           seed=0, max_new_tokens=2, engine="engine", max_grad_norm=1e9,
                                           schedule=grpo_env_torch.Schedule(minibatches=2))  # fmt: skip
        for _ in range(6):  # until some group won and lost alike (a signal)
            self.samples = self.grpo.update_samples(self.grpo.rollouts())
            if len(self.samples) >= 8:
                break
        assert len(self.samples) >= 8
        self.grpo.sample.copy.float()
        self.start = copy.deepcopy(self.model.state_dict())

    def run(self, **settings):
        """(the update's stats, each optimizer step's gradients) with `settings` as `GRPOEnv` attributes."""
        import random

        import torch

        grpo, model = self.grpo, self.model
        model.load_state_dict(self.start)
        grpo.weights_changed()  # the rollout copy back to the same weights
        for name, value in settings.items():
            setattr(grpo, name, value)
        grpo.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
        grpo.optimizer_steps, grpo.lr_scale, grpo.rng = 0, 1.0, random.Random(0)
        grads, step = [], grpo.optimizer.step

        def recorded(*args, **kwargs):
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            return step(*args, **kwargs)

        grpo.optimizer.step = recorded
        return grpo.update(self.samples), grads


def assert_same_update(a, b) -> None:
    (one, one_grads), (other, other_grads) = a, b
    assert one.optimizer_steps == other.optimizer_steps == 2
    assert one.clip_fraction > 0 and one.approx_kl > 1e-4  # the statistics have something to sum
    for field in ("loss", "approx_kl", "clip_fraction", "entropy"):
        assert getattr(other, field) == pytest.approx(getattr(one, field), rel=1e-4, abs=1e-6), field
    # The first minibatch's ratios are 1 up to float32 rounding either way (the sampler is the policy): that
    # rounding's size depends on the summation order, so both are bounded, not compared (8e-6 against 9e-6 on one
    # CPU, equal on another).
    assert one.first_ratio_max_dev < 1e-4 and other.first_ratio_max_dev < 1e-4
    for x, y in zip(one_grads, other_grads, strict=True):
        norm = float(sum((x[n] ** 2).sum() for n in x) ** 0.5)
        assert float(sum(((x[n] - y[n]) ** 2).sum() for n in x) ** 0.5) < 1e-5 * norm


def test_the_updates_numbers_do_not_depend_on_how_it_is_cut_into_micro_batches(one_torch_thread):
    """The update's micro-batches (`micro_tokens`, `micro_batch`: what bounds its memory) change nothing it
    computes: each optimizer step's gradient, the loss, approximate KL, clip fraction and first-minibatch ratio
    are the same whether a minibatch runs as one micro-batch or one sample at a time, so the micro-batch size is
    a memory / speed setting only (bench/bench_rl_update.py). The second minibatch follows a step at a high
    rate: its ratios are far from 1 and tokens are clipped. (The rollout copy is fp32 here: a bf16 copy's
    log-probs themselves shift with the batch they run in, by bf16 rounding, which is no property of the
    update.)"""
    same = SameBatch()
    everything = list(range(len(same.samples)))
    one = same.run(micro_tokens=10**6, micro_batch=10**6)
    assert len(same.grpo.micro_batches(everything, same.samples)) == 1
    each = same.run(micro_tokens=1, micro_batch=1)
    assert len(same.grpo.micro_batches(everything, same.samples)) == len(same.samples)  # each sample alone
    assert_same_update(one, each)


def test_layer_checkpointing_keeps_the_updates_numbers_and_only_the_layers_inputs(one_torch_thread):
    """`checkpoint_layers` (what would let larger micro-batches fit): the same gradients and statistics as
    without it, through the shared-prompt path (its prefix cache read, never grown, by layers that run twice),
    and the policy's forward pass keeps far fewer bytes for the backward pass."""
    import torch

    same = SameBatch()
    chunk = same.samples[:6]
    assert same.grpo._batch(chunk)[3] >= grpo_env_torch.MIN_TRAIN_PREFIX  # the shared-prompt path is the one run
    plain = same.run(micro_tokens=10**6, micro_batch=10**6, checkpoint_layers=False)
    checkpointed = same.run(micro_tokens=10**6, micro_batch=10**6, checkpoint_layers=True)
    assert_same_update(plain, checkpointed)

    def saved_bytes() -> int:
        seen: dict[int, int] = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            same.grpo._log_probs(same.model, chunk).sum().backward()
        return sum(seen.values())

    same.grpo.checkpoint_layers = False
    full = saved_bytes()
    same.grpo.checkpoint_layers = True
    assert saved_bytes() < full / 2


def test_the_update_bench_runs_on_the_cpu(tiny_model_dir, tmp_path, capsys, one_torch_thread):
    """`bench/bench_rl_update.py --smoke`: an update batch from the real offline alfworld games through the
    agent's own episode code (the evaluator's prompts), the agent's modules imported as its workspace imports
    them (no harness package: the device image has no pydantic), and a baseline version of the update run on
    the same instance; one row per setting and update, the same loss whatever the setting, a table of ratios."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_rl_update

    with bench_rl_update.workspace_modules() as (module, session):
        assert module.shared_prefix_length.__module__ == "sft_torch"  # the workspace's copies, not the harness's
        assert module.import_decode_engine.__module__ == "train_grpo" and session.Knobs.__module__ == "sft_grpo_session"
    assert "grpo_env_torch" not in sys.modules  # undone: the test process keeps its own modules
    out = tmp_path / "update.jsonl"
    baseline = Path(grpo_env_torch.__file__)
    assert bench_rl_update.main([str(tiny_model_dir), "--smoke", "--baseline", str(baseline), "--out", str(out),
                                 "--settings", "baseline:default", "default", "micro_tokens=64",
                                 "checkpoint_layers=1"]) == 0  # fmt: skip
    facts, *rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert facts["episodes"] == 4 and facts["samples"] == 12 and facts["prompt_tokens_mean"] > 100
    assert [r["setting"] for r in rows] == ["baseline:default", "default", "micro_tokens=64", "checkpoint_layers=1"]
    assert all(r["update"] == 1 for r in rows)
    assert len({r["loss"] for r in rows}) == 1 and all(r["optimizer_steps"] == facts["minibatches"] for r in rows)
    assert rows[2]["micro_tokens"] == 64 and rows[2]["tokens"] > rows[1]["tokens"]  # rows alone: no shared prefix
    assert rows[3]["checkpoint_layers"] == 1 and not rows[1]["checkpoint_layers"]
    printed = capsys.readouterr().out
    assert "| baseline:default | " in printed and "| micro_tokens=64 | 64 | " in printed


def test_the_sft_step_bench_runs_on_the_cpu(tiny_model_dir, capsys, one_torch_thread):
    """`bench/bench_sft_step.py --smoke`: the agent's SFT step on its own examples, plain and with checkpointed
    layers, the same batches from the same weights (the same losses), one row per step and a table."""
    import sys

    from a2rl_bench.benchmarks import get_task

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_sft_step

    public = get_task("alfworld").prepare("offline").public_dir
    assert bench_sft_step.main([str(tiny_model_dir), "--data", str(public), "--smoke", "--settings", "plain",
                                "checkpointed", "micro_tokens=300"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    assert [(r["setting"], r["step"]) for r in rows] == [("plain", 0), ("plain", 1), ("checkpointed", 0),
                                                         ("checkpointed", 1), ("micro_tokens=300", 0),
                                                         ("micro_tokens=300", 1)]  # fmt: skip
    for other in (rows[3], rows[5]):
        assert rows[1]["loss"] == pytest.approx(other["loss"], rel=1e-5) and rows[1]["tokens"] == other["tokens"] > 0
    assert "| plain | 1 | " in printed and "| checkpointed | 1 | " in printed and "| micro_tokens=300 | 1 | " in printed
    with pytest.raises(SystemExit):
        bench_sft_step.main([str(tiny_model_dir), "--data", str(public), "--smoke", "--settings", "micro_tokens=0"])
