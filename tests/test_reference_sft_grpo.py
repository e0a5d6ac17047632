"""reference-sft-grpo on an interactive task (alfworld): the in-process session (SFT rounds until validation
stops rising, then GRPO with online rollouts and win-only returns), its stop rule, its rewards, and the mode
sft-only, on the tiny model against the real grading HTTP API."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
from a2rl_bench.records import EvalResult, RunConfig
from a2rl_bench.grading.route_audit import route_label
from a2rl_bench.workspace import RunPaths, build_workspace
from a2rl_bench.agents import AgentEnv, get_agent, run_agent
from a2rl_bench.agents.reference_sft_grpo import grpo_env_torch, sft_torch
from a2rl_bench.agents.reference_sft_grpo import sft_grpo_session
from a2rl_bench.agents.reference_sft_grpo.sft_grpo_session import Knobs, read_mode, sft_finished


# -- the stop rule and the rewards ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scores", "baseline", "done"),
    [
        ([10.0], 0.0, False),  # one round: nothing to compare with
        ([10.0, 20.0], 0.0, False),  # still rising
        ([10.0, 20.0, 20.0], 0.0, True),  # a tie is not a rise
        ([10.0, 20.0, 15.0], 0.0, True),
        ([0.0, 0.0], 0.0, False),  # not above the baseline yet: keep going
        ([0.0, 5.0, 3.0], 5.0, False),
        ([10.0, None], 0.0, True),  # an unscored round does not rise either
        ([None, None], 0.0, False),
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.0, True),  # max rounds
    ],
)
def test_sft_stops_when_validation_stops_rising(scores, baseline, done):
    assert sft_finished(scores, baseline, max_rounds=6) is done


def test_a_rise_within_the_scores_noise_is_no_rise():
    """At 60 validation games a score of 20 has 5.2 points of binomial noise: 24 after it is no rise, 26 is."""
    assert sft_grpo_session.score_noise(20.0, 60) == pytest.approx(5.16, abs=0.01)
    assert sft_finished([10.0, 20.0, 24.0], 0.0, max_rounds=6, items=60)
    assert not sft_finished([10.0, 20.0, 26.0], 0.0, max_rounds=6, items=60)
    assert not sft_finished([10.0, 20.0, 24.0], 0.0, max_rounds=6)  # without the split's size: any rise counts
    assert not sft_finished([2.0, 6.0], 0.0, max_rounds=6, items=60)  # 6 vs 2: beyond 2's noise (1.8)


GAME = 100 / 60
"""One validation game of alfworld's 60, in points (the split's default margin is one and a half)."""


@pytest.mark.parametrize(
    ("scores", "allowance_s", "stop", "why"),
    [
        ([60.0], 200.0, False, "rises"),  # one round: nothing to compare with
        ([60.0, 63.3], 200.0, False, "rises"),  # two games more: a rise (6.3 points of noise stopped it before)
        ([60.0, 63.3, 80.0, 85.0], 200.0, False, "rises"),
        ([60.0, 61.7], 200.0, True, "no longer rises: 61.7 after a best of 60.0"),  # one game (rounded): noise
        ([60.0, 80.0, 70.0], 200.0, True, "no longer rises: 70.0 after a best of 80.0"),
        ([60.0, None], 200.0, True, "no longer rises"),
        ([0.0, 0.0], 200.0, False, "rises"),  # not above the baseline yet: keep going
        ([60.0, 63.3], 9.0, True, "SFT's time is used (9s left"),  # rising, but its cap / RL's floor is reached
        ([1.0, 4.0, 7.0, 10.0, 13.0, 16.0], 200.0, True, "6 SFT rounds, the most allowed"),
    ],
)
def test_sft_goes_on_while_its_last_round_rose_by_more_than_a_game(scores, allowance_s, stop, why):
    split = sft_grpo_session.sft_split(scores, 0.0, allowance_s=allowance_s, min_round_s=10.0, max_rounds=6,
                                       margin=1.5 * GAME)  # fmt: skip
    assert split.stop is stop and why in split.reason, split


def test_sft_has_a_cap_rl_a_floor_and_an_explicit_share_overrides_both():
    allowance = sft_grpo_session.sft_allowance_s
    # The floor: with 300 of 420 s left, RL keeps 30% (126 s) after the end margin (15 s) and a save (5 s).
    assert allowance(420, 300, max_share=0.7, rl_min_share=0.3, save_s=5, end_margin_s=15) == pytest.approx(154)
    # The cap: SFT stops at 70% of the budget used, whatever RL's floor.
    assert allowance(420, 150, max_share=0.7, rl_min_share=0.0, save_s=5) == pytest.approx(294 - 270 - 5)
    k = Knobs.from_env({})
    assert (k.sft_max_share, k.rl_min_share, k.sft_rise_margin) == (pytest.approx(0.7), pytest.approx(0.3), None)
    session = sft_grpo_session.InteractiveSession.__new__(sft_grpo_session.InteractiveSession)  # no grader needed
    session.__dict__.update(k=k, save_s=5.0, phase="SFT", mode="free", margin_s=13.4,
                            budget={"budget_s": 420.0, "remaining_s": 300.0, "elapsed_s": 120.0})  # fmt: skip
    # 120 s used: a third of the budget no longer ends SFT (it left 15 s); RL's floor leaves 155.6 s.
    assert session.sft_allowance_s() == pytest.approx(300 - 13.4 - 126 - 5)
    assert session.round_seconds() == pytest.approx(70.0)  # a sixth of the budget
    assert session.rise_margin() == pytest.approx(1.5 * GAME)
    session.budget = {"budget_s": 420.0, "remaining_s": 150.0, "elapsed_s": 270.0}
    assert session.sft_allowance_s() < 10 and session.round_seconds() < 10  # the floor is reached
    session.phase = "GRPO"  # RL rounds are not capped by SFT's share
    assert session.round_seconds() == pytest.approx(70.0)
    # A2RL_SFT_MAX_SHARE alone is the whole split, as before the rule: a third of the budget, no floor.
    session.k, session.phase = Knobs.from_env({"A2RL_SFT_MAX_SHARE": str(1 / 3)}), "SFT"
    session.budget = {"budget_s": 420.0, "remaining_s": 300.0, "elapsed_s": 120.0}
    assert session.k.rl_min_share == 0.0 and session.sft_allowance_s() == pytest.approx(15.0)
    session.k = Knobs.from_env({"A2RL_SFT_MAX_SHARE": "0.9", "A2RL_RL_MIN_SHARE": "0.5"})
    assert session.sft_allowance_s() == pytest.approx(300 - 13.4 - 210 - 5)


def test_an_entropy_alarm_rolls_back_to_the_best_checkpoint_and_stops_rl_after_three():
    session = sft_grpo_session.InteractiveSession.__new__(sft_grpo_session.InteractiveSession)  # no grader needed
    restored, rolled = [], []
    session.__dict__.update(k=Knobs.from_env({}), save_s=5.0, phase="GRPO", mode="free", margin_s=13.4,
                            budget={"budget_s": 420.0, "remaining_s": 300.0, "elapsed_s": 120.0},
                            entropy_rollbacks=0, failures_in_a_row=0, rounds=[], best_score=30.0,
                            grpo=type("G", (), {"rolled_back": lambda self, note: rolled.append(note),
                                                      "step_estimate_s": lambda self: None})())  # fmt: skip
    session.restore_best = lambda: restored.append(True)
    for n in range(1, 4):
        r = sft_grpo_session.Round(n, "GRPO", "output/v1", 3, 0.1, 10.0, score=35.0, note="new best",
                                   entropy_alarm=True)  # fmt: skip
        session.next_phase(r)
        assert len(restored) == len(rolled) == n and "best checkpoint restored, RL rate halved" in r.note
        assert session.can_start()[0] == (n < sft_grpo_session.MAX_ENTROPY_ROLLBACKS)
    assert "entropy rose" in session.can_start()[2]
    calm = sft_grpo_session.Round(4, "GRPO", "output/v1", 3, 0.1, 10.0, score=29.0)
    session.entropy_rollbacks = 0
    session.next_phase(calm)  # within the rollback margin, no alarm: RL goes on from here
    assert len(restored) == 3 and "RL goes on from here" in calm.note


def test_no_rl_round_starts_that_would_only_cut_its_rollouts():
    """An RL round shorter than the last whole step (rollouts plus update) would cut its rollouts at the deadline
    and drop them (eight runs a card: two such rounds of 34 and 28 s after steps of 75 s, 2026-11-29): the session
    stops instead; the next round's rollouts leave room for the update as last measured, not a guess."""
    import time as clock

    env = grpo_env_torch.GRPOEnv.__new__(grpo_env_torch.GRPOEnv)
    env.last_update_s = None
    env.recent_step_s = []
    deadlines, cuts = [], iter([0, 0, 7])

    def step(deadline=None):
        deadlines.append(deadline)
        return grpo_env_torch.StepStats(episodes=64, wins=40, mean_reward=0.6, mean_repeat=0.0, samples=100,
                                        loss=0.0, update_s=20.0, rollout_s=55.0, cut=next(cuts))  # fmt: skip

    env.grpo_step = step
    before = clock.monotonic()
    env.train(100.0, max_steps=1)
    after = clock.monotonic()
    assert before + 80.0 <= deadlines[-1] <= after + 80.0  # 0.2 x 100 s guessed for the update (no timing)
    assert (env.last_step_s, env.last_update_s) == (75.0, 20.0)
    before = clock.monotonic()
    env.train(30.0, max_steps=1)
    after = clock.monotonic()
    assert before + 10.0 <= deadlines[-1] <= after + 10.0  # the update as measured: 20 s
    env.train(300.0, max_steps=1)  # a cut step says nothing about a whole one
    assert env.last_step_s == 75.0

    session = sft_grpo_session.InteractiveSession.__new__(sft_grpo_session.InteractiveSession)
    session.__dict__.update(k=Knobs.from_env({}), save_s=5.0, phase="GRPO", mode="free", margin_s=13.4,
                            budget={"budget_s": 420.0, "remaining_s": 52.4, "elapsed_s": 367.6},
                            entropy_rollbacks=0, failures_in_a_row=0, rounds=[object()], grpo=env)  # fmt: skip
    start, _, why = session.can_start()  # 34 s of round left, a step takes 75 s
    assert not start and "too little for another RL update (recent ones took up to 75s)" in why
    env.recent_step_s = [75.0, 30.0, 30.0, 30.0]  # the slowest of the last three whole steps counts
    assert session.can_start()[:2] == (True, pytest.approx(34.0))
    env.recent_step_s = [30.0, 36.0, 30.0]
    assert not session.can_start()[0]
    session.grpo = None  # no step timed yet: the round starts
    assert session.can_start()[0]


def test_a_round_takes_no_step_after_one_its_deadline_cut(monkeypatch):
    """Four runs a card, 2026-11-29: a 59 s RL round took a whole step (27.6 s), then two whose rollouts the
    deadline cut (11 and 29 of 64 episodes) and whose updates were therefore empty, ~30 s for nothing. A cut step
    ends the round, and a short one does not make the next step look as if it fitted."""
    clock = {"now": 1000.0}
    monkeypatch.setattr(grpo_env_torch.time, "monotonic", lambda: clock["now"])
    env = grpo_env_torch.GRPOEnv.__new__(grpo_env_torch.GRPOEnv)
    env.last_update_s, env.recent_step_s = 16.4, [27.6]
    taken, rollout_s = [], iter([11.0, 15.5, 16.1])  # as measured: rollouts vary from step to step

    def step(deadline=None):  # rollouts (cut at the deadline), then an update of 16.4 s
        start, wanted = clock["now"], next(rollout_s)
        cut = start + wanted > deadline
        clock["now"] = min(start + wanted, deadline) + (0.01 if cut else 16.4)
        taken.append(cut)
        return grpo_env_torch.StepStats(episodes=64, wins=50, mean_reward=0.8, mean_repeat=0.0,
                                        samples=0 if cut else 900, loss=0.0, update_s=0.01 if cut else 16.4,
                                        rollout_s=min(wanted, deadline - start), cut=11 if cut else 0)  # fmt: skip

    env.grpo_step = step
    steps, stats, _ = env.train(59.0)
    assert taken == [False, True] and steps == 2  # before: a third step, cut as well
    assert env.last_step_s == pytest.approx(27.4) and env.step_estimate_s() == pytest.approx(27.6)


def test_sft_stop_rule_with_patience_two():
    assert not sft_finished([10.0, 20.0, 15.0], 0.0, max_rounds=9, patience=2)
    assert sft_finished([10.0, 20.0, 15.0, 20.0], 0.0, max_rounds=9, patience=2)


def test_loop_penalty_counts_repeated_actions():
    assert grpo_env_torch.repeat_fraction([]) == 0.0
    assert grpo_env_torch.repeat_fraction(["look", "go to desk 1", "take pen 1 from desk 1"]) == 0.0
    assert grpo_env_torch.repeat_fraction(["go to desk 1", "look", "Go to  desk 1", "look"]) == 0.5
    assert grpo_env_torch.shaped_reward(1.0, ["a", "b"], 0.5) == 1.0
    assert grpo_env_torch.shaped_reward(0.0, ["a", "a", "a", "a"], 0.4) == pytest.approx(-0.3)


def test_group_advantages_normalise_within_each_group():
    adv = grpo_env_torch.group_advantages([1.0, 0.0, 0.5, 0.5, -0.2, 0.0], group_size=2)
    assert adv[0] == pytest.approx(1.0, abs=1e-3) and adv[1] == pytest.approx(-1.0, abs=1e-3)
    assert adv[2:4] == [0.0, 0.0]  # equal rewards carry no signal
    assert adv[4] < 0 < adv[5]
    with pytest.raises(ValueError):
        grpo_env_torch.group_advantages([1.0, 0.0, 1.0], group_size=2)


def test_mode_comes_from_the_instructions(tmp_path):
    assert read_mode(tmp_path) == "free"
    (tmp_path / "instructions.md").write_text("# Instructions\n- Mode: `sft-only`. Only SFT.\n")
    assert read_mode(tmp_path) == "sft-only"


def test_a_holdout_too_small_for_the_games_holds_none_out_and_rl_plays_them_all(alfworld_data):
    """`A2RL_GRPO_HOLDOUT` of less than half a game: no empty set of RL goals (RL would have nothing to play)."""
    from types import SimpleNamespace

    session = sft_grpo_session.InteractiveSession.__new__(sft_grpo_session.InteractiveSession)
    session.mode, session.s = "free", SimpleNamespace(data_path=alfworld_data, seed=0)
    games = len(grpo_env_torch.import_envlib(alfworld_data).load_goals(alfworld_data))
    session.k = Knobs.from_env({"A2RL_GRPO_HOLDOUT": str(0.4 / games)})
    assert session.held_out() is None
    session.k = Knobs.from_env({"A2RL_GRPO_HOLDOUT": "0.5"})
    assert len(session.held_out()) == round(0.5 * games)
    assert Knobs.from_env({}).rl_holdout == 0.0


def test_knobs_default_to_the_gpu_recipe():
    k = Knobs.from_env({})
    assert (k.sft_lr, k.sft_batch_size, k.group_size, k.goals_per_step) == (1e-4, 32, 8, 8)
    assert (k.algorithm, k.rollout_engine, k.grpo_lr, k.kl_target) == ("grpo", "auto", 3e-5, 0.02)
    # Win-only returns, episodes as long as the evaluator lets them run (its limit, read from the task's envlib).
    assert (k.loop_penalty, k.invalid_penalty, k.max_episode_steps) == (0.0, 0.0, None)
    assert Knobs.from_env({"A2RL_SFT_ROUND_S": "7", "A2RL_GRPO_LOOP_PENALTY": "0.2"}).sft_round_s == 7.0
    schedule = k.schedule(grpo_env_torch)
    assert (schedule.epochs, schedule.minibatches, schedule.clip_low, schedule.clip_high) == (1, 4, 0.2, 0.28)
    assert schedule.kl_target == 0.02
    assert Knobs.from_env({"A2RL_GRPO_EPOCHS": "2"}).schedule(grpo_env_torch).epochs == 2
    # The update's memory: the GPU default (checkpointed layers, 80k-token micro-batches) unless set.
    assert (k.micro_tokens, k.checkpoint_layers) == (None, None)
    assert Knobs.from_env({"A2RL_GRPO_CHECKPOINT_LAYERS": "0"}).checkpoint_layers is False
    assert Knobs.from_env({"A2RL_GRPO_CHECKPOINT_LAYERS": "1"}).checkpoint_layers is True


# -- the trainers on the tiny model ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alfworld_data(tmp_path_factory) -> Path:
    """The alfworld workspace data: 8 training games, 40 worked examples, the environments."""
    from a2rl_bench.benchmarks import get_task

    public = get_task("alfworld").prepare("offline").public_dir
    data = tmp_path_factory.mktemp("alfworld-data")
    (data / "envlib.zip").write_bytes((public / "envlib.zip").read_bytes())
    for name, n in (("train.jsonl", 8), ("sft.jsonl", 40)):
        (data / name).write_text("\n".join((public / name).read_text().splitlines()[:n]) + "\n")
    return data


def _tiny(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), tokenizer


def test_sft_examples_carry_the_loss_on_the_reply_only(tiny_model_dir, alfworld_data):
    _, tokenizer = _tiny(tiny_model_dir)
    examples, rows = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=100_000)
    assert rows == 40 and len(examples) == 40
    row = json.loads((alfworld_data / "sft.jsonl").read_text().splitlines()[0])
    ex = examples[0]
    reply = tokenizer.decode([t for t in ex.labels if t != sft_torch.IGNORE])
    assert reply.startswith(row["completion"][0]["content"])
    assert row["prompt"][-1]["content"][:30] not in reply
    short, _ = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=len(ex.input_ids) - 1)
    assert len(short) < 40  # too long is skipped, never truncated


def test_epoch_batches_cover_every_example_once():
    import random

    batches = sft_torch.epoch_batches(70, 8, random.Random(0), lengths=[i % 13 for i in range(70)])
    assert sorted(i for b in batches for i in b) == list(range(70))


def test_checkpointed_sft_steps_run_each_layer_twice_and_train_the_same_weights(tiny_model_dir, alfworld_data):
    """`A2RL_SFT_CHECKPOINT_LAYERS`: memory for time, not another update. Two steps from the same start give the
    same weights (relative to their norm), with each layer's attention run once more per step (the recomputation;
    the shared prefix runs once either way)."""
    import torch

    def two_steps(checkpoint_layers: bool):
        model, tokenizer = _tiny(tiny_model_dir)
        runs = []
        model.model.layers[0].self_attn.register_forward_hook(lambda *_: runs.append(1))
        examples, _ = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=100_000)
        sft = sft_torch.SFTRounds(model, tokenizer, examples, lr=1e-2, batch_size=4, seed=0,
                                  checkpoint_layers=checkpoint_layers)  # fmt: skip
        stats = sft.train(seconds=60, max_steps=2)
        return model.state_dict(), len(runs), stats.loss

    plain, plain_runs, plain_loss = two_steps(False)
    checkpointed, checkpointed_runs, checkpointed_loss = two_steps(True)
    assert (plain_runs, checkpointed_runs) == (4, 6)  # per step: prefix + suffix, then the suffix again
    assert abs(plain_loss - checkpointed_loss) <= 1e-5 * abs(plain_loss)
    for name, value in plain.items():
        assert (checkpointed[name] - value).norm() <= 1e-5 * value.norm() + 1e-7, name
    assert Knobs.from_env({}).sft_checkpoint_layers is False
    assert Knobs.from_env({"A2RL_SFT_CHECKPOINT_LAYERS": "1"}).sft_checkpoint_layers is True


def test_sft_micro_batches_bound_each_call_and_train_the_same_weights(tiny_model_dir, alfworld_data):
    """`A2RL_SFT_MICRO_TOKENS`: a step's rows split into calls of at most that many padded tokens, whose gradients
    add up to the whole batch's mean loss: the same loss and weights after two steps (relative to their norm),
    every call within the bound, more calls than without it."""
    def two_steps(micro_tokens):
        model, tokenizer = _tiny(tiny_model_dir)
        calls = []
        model.model.register_forward_pre_hook(
            lambda _, args, kwargs: calls.append(kwargs["input_ids"].numel()), with_kwargs=True)
        examples, _ = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=100_000)
        sft = sft_torch.SFTRounds(model, tokenizer, examples, lr=1e-2, batch_size=8, seed=0, micro_tokens=micro_tokens)
        stats = sft.train(seconds=60, max_steps=2)
        return model.state_dict(), calls, stats

    whole, whole_calls, whole_stats = two_steps(None)
    longest = max(whole_calls)  # a step's padded suffix tokens in one call
    bound = longest // 3
    parts, part_calls, part_stats = two_steps(bound)
    assert len(part_calls) >= 3 * len(whole_calls) // 2  # the calls of the prefixes count too
    assert max(part_calls) <= bound
    assert (part_stats.steps, part_stats.examples, part_stats.tokens) == (2, 16, whole_stats.tokens)
    assert abs(part_stats.loss - whole_stats.loss) <= 1e-5 * abs(whole_stats.loss)
    for name, value in whole.items():
        assert (parts[name] - value).norm() <= 1e-5 * value.norm() + 1e-7, name
    assert Knobs.from_env({}).sft_micro_tokens is None
    assert Knobs.from_env({"A2RL_SFT_MICRO_TOKENS": "12288"}).sft_micro_tokens == 12288
    with pytest.raises(ValueError, match="micro_tokens"):
        sft_torch.SFTRounds(*_tiny(tiny_model_dir), [sft_torch.Example([1, 2], [-100, 2])], lr=1e-2, batch_size=1,
                            seed=0, micro_tokens=0)  # fmt: skip


def test_sft_rounds_and_grpo_iterations_change_the_weights(tiny_model_dir, alfworld_data):
    import torch

    model, tokenizer = _tiny(tiny_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    examples, _ = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=100_000)
    sft = sft_torch.SFTRounds(model, tokenizer, examples, lr=1e-2, batch_size=4, seed=0)
    stats = sft.train(seconds=60, max_steps=2)
    assert stats.steps == 2 and stats.examples == 8 and stats.loss > 0
    after_sft = {k: v.clone() for k, v in model.state_dict().items()}
    assert max((after_sft[k] - before[k]).abs().max().item() for k in before) > 0

    envlib = grpo_env_torch.import_envlib(alfworld_data)
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "alfworld", alfworld_data, lr=1e-2, goals_per_step=2,
                                  group_size=2, max_episode_steps=None, temperature=1.0, loop_penalty=0.0, seed=0,
                                  max_new_tokens=8)  # fmt: skip
    assert grpo.max_episode_steps == envlib.MAX_STEPS["alfworld"] == 50  # the evaluator's limit, read from envlib
    # A scripted sampler: one episode of each group plays its game's walkthrough (a win), the other loops.
    env = envlib.make_env("alfworld", alfworld_data)()
    walkthrough = {env.reset(g)[0]: g["walkthrough"] for g in envlib.load_goals(alfworld_data)}
    calls = {"n": 0}

    def winning_or_looping(conversations):
        out = []
        for row, conv in enumerate(conversations):
            ids = tokenizer(conv[-1]["content"][:20], add_special_tokens=False)["input_ids"][:4] or [1]
            steps = walkthrough[conv[1]["content"].split("\n(")[0]]
            text = steps[calls["n"]] if row % 2 and calls["n"] < len(steps) else "look"
            out.append((ids, tokenizer(text, add_special_tokens=False)["input_ids"], text))
        calls["n"] += 1
        return out

    grpo.sample = winning_or_looping
    stats = grpo.grpo_step()
    assert stats.episodes == 4 and stats.wins == 2 and stats.samples > 0 and stats.mean_repeat > 0
    assert stats.mean_steps > 25  # the losers ran the evaluator's 50 steps, not a shorter training cap
    assert max((model.state_dict()[k] - after_sft[k]).abs().max().item() for k in before) > 0
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_play_uses_the_evaluators_environment_and_real_sampling(tiny_model_dir, alfworld_data):
    model, tokenizer = _tiny(tiny_model_dir)
    envlib = grpo_env_torch.import_envlib(alfworld_data)
    goals = envlib.load_goals(alfworld_data)[:2]
    sample = grpo_env_torch.sampler(model, tokenizer, max_new_tokens=6, temperature=1.0, stop=envlib.STOP)
    rollouts = grpo_env_torch.play(envlib, "alfworld", alfworld_data, goals, sample, max_steps=2, seed=0)
    assert [len(r.steps) for r in rollouts] == [2, 2] and all(not r.won for r in rollouts)
    for r in rollouts:
        for prompt_ids, action_ids in r.steps:
            assert prompt_ids and len(action_ids) <= 6
    # Past the deadline no step is played: the round's time is kept even by its first GRPO step.
    cut = grpo_env_torch.play(envlib, "alfworld", alfworld_data, goals, sample, max_steps=2, seed=0,
                              deadline=time.monotonic() - 1)  # fmt: skip
    assert [len(r.steps) for r in cut] == [0, 0] and not any(r.won for r in cut)
    assert all(r.cut for r in cut) and not any(r.cut for r in rollouts)  # cut: left out of the update


def test_completion_loss_equals_the_models_own_loss_without_full_logits(tiny_model_dir, alfworld_data):
    """The output layer on the completion positions only gives the same loss and gradients as the model's own
    loss over the full (batch, length, vocabulary) logits."""
    import torch

    model, tokenizer = _tiny(tiny_model_dir)
    examples, _ = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=100_000)
    ids, mask, labels = sft_torch.collate(examples[:6], tokenizer.pad_token_id, "cpu")
    reference = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    reference.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ours = -sft_torch.target_log_probs(model, ids, mask, labels != sft_torch.IGNORE, "cpu", chunk_rows=7).mean()
    ours.backward()
    assert ours.item() == pytest.approx(reference.item(), rel=1e-5)
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, want[name], atol=1e-6, rtol=1e-4), name
    # At a sampling temperature T the scores are those of the distribution sampled from: softmax(logits / T).
    with torch.no_grad():
        targets = labels != sft_torch.IGNORE
        full = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float() / 0.7, dim=-1)
        want_t = full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)[targets[:, 1:]]
        at_t = sft_torch.target_log_probs(model, ids, mask, targets, "cpu", chunk_rows=7, temperature=0.7)
        at_1 = sft_torch.target_log_probs(model, ids, mask, targets, "cpu", chunk_rows=7)
    assert torch.allclose(at_t, want_t, atol=1e-5) and not torch.allclose(at_1, want_t, atol=1e-3)


def test_the_shared_prompt_prefix_runs_once_with_the_same_loss_and_gradients(tiny_model_dir, alfworld_data):
    """Worked examples share the system prompt: running it once at batch 1 and letting every row attend to its
    keys and values gives the same target log-probabilities and gradients as the whole rows."""
    import torch

    model, tokenizer = _tiny(tiny_model_dir)
    examples, _ = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, max_length=100_000)
    batch = examples[:5]
    prefix = sft_torch.shared_prefix_length([e.input_ids for e in batch], [sft_torch.first_target(e) for e in batch])
    assert prefix >= sft_torch.MIN_SHARED_PREFIX
    ids, mask, labels = sft_torch.collate(batch, tokenizer.pad_token_id, "cpu")
    whole = sft_torch.target_log_probs(model, ids, mask, labels != sft_torch.IGNORE, "cpu")
    whole.sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    shared = sft_torch.target_log_probs(model, ids, mask, labels != sft_torch.IGNORE, "cpu", prefix=prefix)
    shared.sum().backward()
    assert shared.shape == whole.shape and torch.allclose(shared, whole, atol=1e-5)
    # float32 sums in another order differ by ~1e-6 of a gradient's size (3e-5 on entries of magnitude 37):
    # compare each tensor's difference to its norm; a broken prefix (wrong keys, positions, masks) is off by
    # a fraction of it.
    for name, param in model.named_parameters():
        error, size = float((param.grad - want[name]).norm()), float(want[name].norm())
        assert error <= 2e-5 * size + 1e-7, (name, error, size)
    assert sft_torch.shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5]], [3, 3]) == 2  # short of the first target


def _rollout(actions, keys, reward, invalid=None):
    r = grpo_env_torch.Rollout(goal_id="g", steps=[([1], [2])] * len(actions), actions=list(actions),
                               invalid=list(invalid or [False] * len(actions)), state_keys=list(keys), reward=reward,
                               won=reward > 0)  # fmt: skip
    return r


def test_step_rewards_sum_to_the_shaped_return_and_charge_the_step_that_earned_them():
    actions, invalid = ["go to desk 1", "take pen 1 from desk 1", "go to desk 1", "fly"], [False, False, False, True]
    rewards = grpo_env_torch.step_rewards(1.0, actions, invalid, loop_penalty=0.5, invalid_penalty=0.2)
    assert sum(rewards) == pytest.approx(grpo_env_torch.shaped_reward(1.0, actions, 0.5, invalid, 0.2))
    assert rewards[0] == rewards[1] == 0.0 and rewards[2] == pytest.approx(-0.125)
    assert rewards[3] == pytest.approx(1.0 - 0.05)
    assert grpo_env_torch.discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert grpo_env_torch.invalid_action("Nothing happens.") and not grpo_env_torch.invalid_action("You arrive")


def test_gigpo_credits_the_action_taken_from_a_shared_state():
    """Two episodes of one game share their first two states; at the second they part ways and only one wins.
    GRPO gives every step of an episode the same advantage; GiGPO adds a step-level one at the shared state,
    so the deciding step of the winner gains more than its first (shared, identical) step, and a state seen
    once adds nothing."""
    win = _rollout(["go to a", "take x from a", "move x to b"], ["s0", "s1", "s2"], 1.0)
    lose = _rollout(["go to a", "look", "look"], ["s0", "s1", "s1"], 0.0)
    grpo = grpo_env_torch.step_advantages([win, lose], 2, algorithm="grpo", loop_penalty=0.0, invalid_penalty=0.0)
    assert grpo[0] == [pytest.approx(1.0, abs=1e-3)] * 3 and grpo[1] == [pytest.approx(-1.0, abs=1e-3)] * 3
    gigpo = grpo_env_torch.step_advantages([win, lose], 2, algorithm="gigpo", loop_penalty=0.0,
                                           invalid_penalty=0.0, gamma=0.9)  # fmt: skip
    # s0: both took the same action, returns 0.81 vs 0 -> normalised +1 / -1 (the winner's path still led on)
    # s1: the winner's step (return 0.9) against the loser's two steps (0, 0)
    assert gigpo[0][1] > gigpo[0][0] > grpo[0][0]
    assert gigpo[1][1] < grpo[1][1]
    assert gigpo[0][2] == pytest.approx(grpo[0][2])  # s2 is seen once: no step-level term
    with pytest.raises(ValueError, match="algorithm"):
        grpo_env_torch.step_advantages([win, lose], 2, algorithm="ppo", loop_penalty=0, invalid_penalty=0)


def test_returns_are_wins_and_shaping_is_never_the_whole_signal_of_a_group():
    """Win-only returns normalised in the group; the per-step penalties come after, unnormalised, and only in a
    group with a win and a loss; an episode cut by the deadline leaves the update (not scored as a loss)."""
    loops = _rollout(["look", "look", "look"], ["s0", "s1", "s1"], 0.0)
    clean = _rollout(["go to a", "go to b", "go to c"], ["s0", "s2", "s3"], 0.0)
    win = _rollout(["go to a", "take x from a", "look", "look"], ["s0", "s1", "s2", "s2"], 1.0,
                   [False, False, True, False])  # fmt: skip
    cut = _rollout(["go to a"], ["s0"], 0.0)
    cut.cut = True
    adv = grpo_env_torch.step_advantages([loops, clean, win, loops, cut, clean], 3, algorithm="grpo",
                                         loop_penalty=0.1, invalid_penalty=0.05)  # fmt: skip
    # Group 1: two losses and a win: (+-) normalised outcome, then each step's own penalty, as is.
    # (0 - 1/3) / std(0, 0, 1) = -0.7071; (1 - 1/3) / std = 1.4142
    assert adv[0] == pytest.approx([-0.7071, -0.7071 - 0.1, -0.7071 - 0.1], abs=1e-3)
    assert adv[1] == pytest.approx([-0.7071] * 3, abs=1e-3)
    assert adv[2] == pytest.approx([1.4142, 1.4142, 1.4142 - 0.05, 1.4142 - 0.1], abs=1e-3)
    # Group 2: no win among the episodes that finished: no signal, and the loop penalty alone is not one.
    assert adv[3] == [0.0] * 3 and adv[5] == [0.0] * 3 and adv[4] == [0.0]
    # A cut episode is not a loss: with it gone, the win against one loss is +1 / -1.
    win2 = _rollout(["go to a"], ["s0"], 1.0)
    adv = grpo_env_torch.step_advantages([win2, cut, clean], 3, algorithm="grpo", loop_penalty=0, invalid_penalty=0)
    assert adv[0] == [pytest.approx(1.0, abs=1e-3)] and adv[1] == [0.0]
    assert adv[2] == [pytest.approx(-1.0, abs=1e-3)] * 3


def test_household_state_key_tells_states_apart():
    from a2rl_bench.benchmarks import get_task

    task = get_task("alfworld")
    goal = task.load("offline").train[0]
    env_a, env_b = task.make_env("offline")(), task.make_env("offline")()
    env_a.reset(goal)
    env_b.reset(goal)
    assert env_a.state_key() == env_b.state_key()
    recep = goal["receptacles"][0]["name"]
    env_a.step(f"go to {recep}")
    assert env_a.state_key() != env_b.state_key()
    env_b.step(f"go to {recep}")
    assert env_a.state_key() == env_b.state_key()


def test_engine_rollouts_use_the_evaluators_prompts_and_a_seed_reproduces_them(tiny_model_dir, alfworld_data):
    """The decode-engine sampler (CPU here: no graph) in lockstep episodes: every step's prompt is the
    evaluator's prompt as the chat template renders it, actions end at the evaluator's stop, the environment
    state is recorded, and the same seed plays the same episodes."""
    model, tokenizer = _tiny(tiny_model_dir)
    envlib = grpo_env_torch.import_envlib(alfworld_data)
    goals = [g for g in envlib.load_goals(alfworld_data)[:3] for _ in range(2)]  # groups of 2

    def play(seed):
        sample = grpo_env_torch.make_sampler(model, tokenizer, max_new_tokens=6, temperature=1.0, stop=envlib.STOP,
                                             seed=seed, engine="engine")  # fmt: skip
        assert isinstance(sample, grpo_env_torch.EngineSampler)
        return grpo_env_torch.play(envlib, "alfworld", alfworld_data, goals, sample, max_steps=3, seed=0)

    first = play(1)
    assert [len(r.steps) for r in first] == [3] * 6
    prompter = envlib.prompter("alfworld")
    make_env = envlib.make_env("alfworld", alfworld_data)
    for goal, r in zip(goals, first):
        obs = make_env().reset(goal)[0]
        turns = []
        env = make_env()
        env.reset(goal)
        for (prompt_ids, action_ids), action in zip(r.steps, r.actions):
            text = tokenizer.apply_chat_template(prompter(goal, obs, turns), tokenize=False, add_generation_prompt=True)
            assert prompt_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
            assert len(action_ids) <= 6
            result = env.step(action)
            turns.append({"completion": action, "action": action, "observation": result.observation,
                          "reward": result.reward})  # fmt: skip
        fresh = make_env()
        fresh.reset(goal)
        assert len(r.state_keys) == 3 and r.state_keys[0] == fresh.state_key()
    again = play(1)
    assert [(r.steps, r.actions) for r in again] == [(r.steps, r.actions) for r in first]
    other = play(2)
    assert [r.actions for r in other] != [r.actions for r in first]


def test_an_engine_failure_falls_back_to_generate_for_good(tiny_model_dir, alfworld_data, monkeypatch, capsys):
    model, tokenizer = _tiny(tiny_model_dir)
    envlib = grpo_env_torch.import_envlib(alfworld_data)
    sample = grpo_env_torch.make_sampler(model, tokenizer, max_new_tokens=4, temperature=1.0, stop=envlib.STOP,
                                         seed=0, engine="engine")  # fmt: skip

    def broken(*args, **kwargs):
        raise RuntimeError("injected CUDA graph failure")

    monkeypatch.setattr(sample.decoder, "decode", broken)
    goals = envlib.load_goals(alfworld_data)[:2]
    rollouts = grpo_env_torch.play(envlib, "alfworld", alfworld_data, goals, sample, max_steps=2, seed=0)
    assert [len(r.steps) for r in rollouts] == [2, 2]  # the episodes went on, sampled by generate
    assert sample.fallback is not None and sample.decoder is None
    assert "decode engine failed (RuntimeError: injected CUDA graph failure)" in capsys.readouterr().err
    sample.sync()  # a no-op now, not an error


def test_gigpo_step_with_the_engine_sampler_updates_the_policy_and_its_rollout_copy(tiny_model_dir, alfworld_data,
                                                                                     tmp_path):  # fmt: skip
    import torch

    model, tokenizer = _tiny(tiny_model_dir)
    envlib = grpo_env_torch.import_envlib(alfworld_data)
    curve = tmp_path / "curve.jsonl"
    grpo = grpo_env_torch.GRPOEnv(model, tokenizer, envlib, "alfworld", alfworld_data, lr=1e-2, goals_per_step=2,
                                  group_size=3, max_episode_steps=3, temperature=1.5, loop_penalty=0.5, seed=0,
                                  max_new_tokens=6, algorithm="gigpo", engine="engine", curve=curve)  # fmt: skip
    assert isinstance(grpo.sample, grpo_env_torch.EngineSampler)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = grpo.grpo_step()
    assert stats.episodes == 6 and stats.generated_tokens > 0 and stats.mean_steps > 0
    if stats.samples:  # sampled actions differ within a group (almost surely, at temperature 1.5)
        assert max((model.state_dict()[k] - before[k]).abs().max().item() for k in before) > 0
    for mine, theirs in zip(grpo.sample.copy.parameters(), model.parameters()):
        assert torch.equal(mine, theirs.to(mine.dtype))  # the rollout copy follows the policy
    row = json.loads(curve.read_text().splitlines()[-1])
    assert row["algorithm"] == "gigpo" and row["episodes"] == 6


# -- a whole session against the grading server ---------------------------------------------------------------
def _scripted_evaluator(scores: list[float]):
    calls = {"n": 0}

    def evaluate(model_dir: Path, weights_hash: str, spec, device=None) -> EvalResult:
        score = scores[min(calls["n"], len(scores) - 1)]
        calls["n"] += 1
        return EvalResult(task=spec.task, split=spec.split, score=score, n=10, n_correct=int(score // 10),
                          evaluator_id="scripted", weights_hash=weights_hash)  # fmt: skip

    return evaluate


KNOBS = {"A2RL_SFT_MAX_STEPS": "2", "A2RL_SFT_BATCH_SIZE": "2", "A2RL_SFT_LR": "1e-3", "A2RL_SFT_ROUND_S": "30",
         "A2RL_SFT_MAX_LENGTH": "4096", "A2RL_GRPO_MAX_STEPS": "1", "A2RL_GRPO_GOALS_PER_STEP": "2",
         "A2RL_GRPO_NUM_GENERATIONS": "2", "A2RL_GRPO_MAX_EPISODE_STEPS": "2", "A2RL_GRPO_ROUND_S": "30"}  # fmt: skip


def _session(tmp_path, tiny_model_dir, alfworld_data, monkeypatch, mode: str, scores: list[float], cap: int):
    for k, v in KNOBS.items():
        monkeypatch.setenv(k, v)
    paths = RunPaths.for_run(tmp_path / "runs", f"run-{mode}")
    build_workspace(paths, alfworld_data, tiny_model_dir, "# Task\n", f"# Instructions\n- Mode: `{mode}`. x\n")
    agent = get_agent("reference-sft-grpo")
    agent.install(paths.workspace)
    ctx = GradingContext(f"run-{mode}", RunConfig(task="alfworld", max_submissions=cap, mode=mode),
                         paths.workspace, paths.harness_dir, baseline={"validation": 5.0},
                         base_model_dir=tiny_model_dir)  # fmt: skip
    clock = BudgetClock(900)  # one clock, as in a run: the agent's /budget reads the time its session used
    service = GradingService(ctx, clock, evaluate=_scripted_evaluator(scores))
    with GradingServer(service) as server:
        env = AgentEnv("alfworld", "tiny", paths.workspace, server.url, server.token, 0, harness_dir=paths.harness_dir)
        outcome = run_agent(agent, env, clock, paths.harness_dir / "agent.log", grace_s=5)
    service.close(drain_timeout_s=10)
    log = (paths.harness_dir / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    notes = (paths.workspace / "code" / "NOTES.md").read_text()
    methods = [line.split(" | ")[1] for line in notes.splitlines() if line[:3] in {f"| {i}" for i in range(1, 10)}]
    return paths, service, log, methods


def test_session_runs_sft_until_validation_stops_rising_then_grpo(tiny_model_dir, alfworld_data, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    paths, service, log, methods = _session(tmp_path, tiny_model_dir, alfworld_data, monkeypatch, "free",
                                            [10.0, 20.0, 20.0, 20.0, 30.0], cap=5)  # fmt: skip
    assert "stopping: submission cap reached" in log, log[-3000:]
    assert methods == ["SFT", "SFT", "SFT", "SFT", "GRPO"]  # two rounds without a rise end SFT, not one
    notes = (paths.workspace / "code" / "NOTES.md").read_text()
    assert notes.count("no rise: SFT goes on at half the rate (0.0005)") == 1
    # the ties at rounds 3 and 4 are within the noise of the best: SFT goes on from them, and RL from round 4
    assert "restored the best checkpoint" not in log and notes.count("SFT goes on from here") == 2
    # Why SFT stopped and where RL starts from: in the log and as the first row of the RL curve.
    assert "SFT stops after 4 rounds" in log and "GRPO starts from output/v4 (validation 20.0)" in log
    curve = [json.loads(line) for line in (paths.workspace / "code" / "rl_curve.jsonl").read_text().splitlines()]
    assert curve[0]["starts_from"] == "output/v4" and curve[0]["sft_scores"] == [10.0, 20.0, 20.0, 20.0]
    assert curve[0]["sft_stopped"].startswith("validation no longer rises: 20.0, 20.0 after a best of 20.0")
    assert len(curve) > 1 and all("wins" in row for row in curve[1:])  # the updates follow it
    scored = [(e.model_path, e.score) for e in service.submissions() if e.status == "scored"]
    assert scored == [("output/v1", 10.0), ("output/v2", 20.0), ("output/v3", 20.0), ("output/v4", 20.0),
                      ("output/v5", 30.0)]  # fmt: skip
    # each submission names the one its training started from, so RL's share is taken from where RL started
    assert [e.detail.get("parent") for e in service.submissions()] == [None, 1, 2, 3, 4]
    assert route_label(paths.workspace / "code") == "SFT+RL"


def test_a_round_that_fell_beyond_the_noise_is_rolled_back_and_rl_starts_from_the_best(
        tiny_model_dir, alfworld_data, tmp_path, monkeypatch):  # fmt: skip
    """Round 3 fell 15 points below the best (the margin is 10): SFT goes on from round 2's checkpoint, and so
    does RL after round 4 fell too."""
    paths, service, log, methods = _session(tmp_path, tiny_model_dir, alfworld_data, monkeypatch, "free",
                                            [10.0, 30.0, 15.0, 15.0, 40.0], cap=5)  # fmt: skip
    assert methods == ["SFT", "SFT", "SFT", "SFT", "GRPO"]
    assert log.count("restored the best checkpoint output/v2") == 2 and "SFT goes on from here" not in log
    assert "GRPO starts from output/v2 (validation 30.0)" in log
    assert [e.detail.get("parent") for e in service.submissions()] == [None, 1, 2, 2, 2]


def test_sft_gives_way_to_rl_once_its_share_of_the_budget_is_used(tiny_model_dir, alfworld_data, tmp_path,
                                                                   monkeypatch):  # fmt: skip
    """Validation still rising, but SFT has had its share of the budget: the next round is RL. With
    `A2RL_GRPO_HOLDOUT`, RL plays only the training games SFT never saw."""
    monkeypatch.setenv("A2RL_SFT_MAX_SHARE", "0.0001")
    monkeypatch.setenv("A2RL_GRPO_HOLDOUT", "0.25")
    monkeypatch.setenv("A2RL_RL_MIN_SHARE", "0.2")  # a documented knob: it reaches the agent
    paths, service, log, methods = _session(tmp_path, tiny_model_dir, alfworld_data, monkeypatch, "free",
                                            [10.0, 20.0, 30.0], cap=2)  # fmt: skip
    assert methods == ["SFT", "GRPO"]
    notes = (paths.workspace / "code" / "NOTES.md").read_text()
    assert '"rl_min_share": 0.2' in notes and '"rl_holdout": 0.25' in notes
    assert "SFT stops (validation still rises, but SFT's time is used" in notes and "next GRPO" in notes
    assert [e.detail.get("stage") for e in service.submissions()] == ["SFT", "GRPO"]
    curve = [json.loads(line) for line in (paths.workspace / "code" / "rl_curve.jsonl").read_text().splitlines()]
    assert curve[0]["starts_from"] == "output/v1" and curve[0]["sft_scores"] == [10.0]
    games = len(grpo_env_torch.import_envlib(alfworld_data).load_goals(alfworld_data))
    held = round(0.25 * games)
    assert f"{held} of {games} training games held out of SFT for RL" in log
    assert len(curve) > 1 and all(row["goals"] == held for row in curve[1:])


def test_session_in_mode_sft_only_keeps_to_sft(tiny_model_dir, alfworld_data, tmp_path, monkeypatch):
    monkeypatch.setenv("A2RL_GRPO_HOLDOUT", "0.25")  # no RL: SFT keeps every game
    paths, service, log, methods = _session(tmp_path, tiny_model_dir, alfworld_data, monkeypatch, "sft-only",
                                            [10.0, 10.0, 10.0, 15.0], cap=4)  # fmt: skip
    assert methods == ["SFT", "SFT", "SFT", "SFT-anneal"]
    assert "A2RL_GRPO_HOLDOUT=0.25 ignored in mode sft-only" in log and "held out of SFT" not in log
    assert not (paths.workspace / "code" / "grpo_env_torch.py").exists()
    assert route_label(paths.workspace / "code") == "SFT"
    assert [e.detail.get("mode_ok") for e in service.submissions()] == [True, True, True, True]


# -- the GPU table's SQL ----------------------------------------------------------------------------------------
def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre, half = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def test_the_alfworld_table_sql_gives_newcombes_interval_and_the_gpu(tmp_path):
    """bench/alfworld_table.sql on a store with one run (0/134 -> 30/134), and BENCHMARKS.md quotes it whole."""
    import duckdb

    from a2rl_bench.store.results import ResultsStore, add_interval_functions

    repo = Path(__file__).resolve().parents[1]
    sql = (repo / "bench" / "alfworld_table.sql").read_text()
    assert sql.strip() in (repo / "BENCHMARKS.md").read_text()
    store = tmp_path / "a2rl.duckdb"
    ResultsStore(store)
    con = duckdb.connect(str(store))
    con.execute("""INSERT INTO runs (run_id, task, mode, base_model, seed, budget_s, status, baseline_val, best_val,
                                     baseline_test, final_test, delta_test, n_submissions, agent_seconds,
                                     wall_seconds, phase_seconds_json, started_at)
                   VALUES ('r1', 'alfworld', 'free', 'smollm2', 0, 90, 'completed', 0, 30, 0, 22.39, 22.39, 2, 88,
                           280, '{"baseline": 1.0}', now())""")  # fmt: skip
    for kind, k in (("baseline", 0), ("final", 30)):
        con.execute("INSERT INTO evaluations (run_id, eval_key, kind, split, score, n, n_correct, duration_s) "
                    "VALUES ('r1', ?, ?, 'test', ?, 134, ?, 20)", [kind, kind, 100 * k / 134, k])  # fmt: skip
        for i in range(134):  # the final model wins games 0..29, the base model none
            won = kind == "final" and i < k
            con.execute("INSERT INTO item_results (run_id, eval_key, split, item_id, score, correct) "
                        "VALUES ('r1', ?, 'test', ?, ?, ?)", [kind, f"g{i}", float(won), won])  # fmt: skip
    con.execute("""INSERT INTO events (run_id, seq, kind, detail_json)
                   VALUES ('r1', 1, 'session-start', '{"gpus": ["NVIDIA H100 80GB HBM3"]}')""")
    con.close()
    ResultsStore(store)  # rows written by plain SQL get their derived numbers (the final pick's evaluation) on open
    con = add_interval_functions(duckdb.connect(str(store)))  # t975, from the library (the store has no macro)
    rel = con.sql(sql)
    row = dict(zip(rel.columns, rel.fetchall()[0]))
    con.close()
    (l0, u0), (l1, u1) = _wilson(0, 134), _wilson(30, 134)
    d = 30 / 134
    assert row["delta_ci95_lo"] == round(100 * (d - ((d - l1) ** 2 + u0**2) ** 0.5), 1)
    assert row["delta_ci95_hi"] == round(100 * (d + ((u1 - d) ** 2 + l0**2) ** 0.5), 1)
    assert 0 < row["delta_ci95_lo"] < 22.39 < row["delta_ci95_hi"]
    sd = (30 * (1 - d) ** 2 + 104 * d**2) / 133  # variance of the per-game differences (30 ones, 104 zeros)
    half = 1.96 + 2.4 / 133  # the store's t975 beyond 30 degrees of freedom
    assert row["paired_ci95_lo"] == round(100 * (d - half * (sd / 134) ** 0.5), 1)
    assert row["paired_ci95_hi"] == round(100 * (d + half * (sd / 134) ** 0.5), 1)
    assert (row["baseline_test_games"], row["final_test_games"]) == ("0/134", "30/134")
    assert row["gpu"] == "NVIDIA H100 80GB HBM3"


# -- searching demonstrations -----------------------------------------------------------------------------------
def test_searching_demonstrations_look_in_the_learned_order_until_found_and_win(alfworld_data, tiny_model_dir):
    """Built from the training games alone: each fetch visits receptacles most likely first (by how often their
    type held the object's type in the training games), opens closed ones, takes the first object of the wanted
    type it sees; every kept demonstration wins when replayed in the task's environment, and some searched (the
    worked examples never do: their first `go to` holds the object)."""
    from a2rl_bench.agents.reference_sft_grpo import search_demos

    envlib = grpo_env_torch.import_envlib(alfworld_data)
    goals = {g["id"]: g for g in envlib.load_goals(alfworld_data)}
    prior = search_demos.receptacle_prior(list(goals.values()))
    demos = search_demos.demonstrations(envlib, "alfworld", alfworld_data)
    assert len(demos) >= len(goals) // 2
    assert any(d.searched > 0 for d in demos)  # at least one fetch looked where the object was not
    for demo in demos:
        goal = goals[demo.goal_id]
        kind = goal["goal"]["object"]
        assert demo.turns[0]["action"] == f"go to {search_demos.search_order(goal, kind, prior)[0]}"
        env = envlib.make_env("alfworld", alfworld_data)()
        assert env.reset(goal)[0] == demo.first
        results = [env.step(t["action"]) for t in demo.turns]
        assert results[-1].info["won"] and not any(r.done for r in results[:-1])
        assert [r.observation for r in results] == [t["observation"] for t in demo.turns]
        assert len(demo.turns) <= envlib.MAX_STEPS["alfworld"]
    # The rows are in the worked examples' own format: a game's first prompt is the same in both.
    rows = search_demos.sft_rows(envlib, "alfworld", alfworld_data)
    worked = [json.loads(line) for line in (alfworld_data / "sft.jsonl").read_text().splitlines()]
    first = {r["goal_id"]: r["prompt"] for r in worked if len(r["prompt"]) == 2}
    assert any(r["prompt"] == first[r["goal_id"]] for r in rows if r["goal_id"] in first and len(r["prompt"]) == 2)
    # The session's SFT data: the worked examples plus these.
    model, tokenizer = _tiny(tiny_model_dir)
    alone, n = sft_torch.load_examples(alfworld_data / "sft.jsonl", tokenizer, 100_000)
    mixed, m = sft_grpo_session.sft_examples(alfworld_data, alfworld_data / "sft.jsonl", "alfworld", tokenizer,
                                             100_000, search=True)  # fmt: skip
    assert len(mixed) == len(alone) + len(rows) and m == n + len(rows)
    off, _ = sft_grpo_session.sft_examples(alfworld_data, alfworld_data / "sft.jsonl", "alfworld", tokenizer,
                                           100_000, search=False)  # fmt: skip
    assert len(off) == len(alone)
    # RL's held-out games (A2RL_GRPO_HOLDOUT) are in neither: not their worked examples, not their demonstrations.
    held = sft_grpo_session.held_out_games(list(goals), 0.25, seed=3)
    assert len(held) == round(0.25 * len(goals)) and held == sft_grpo_session.held_out_games(list(goals)[::-1], 0.25, 3)
    assert held != sft_grpo_session.held_out_games(list(goals), 0.25, seed=4)
    kept, k = sft_grpo_session.sft_examples(alfworld_data, alfworld_data / "sft.jsonl", "alfworld", tokenizer,
                                            100_000, search=True, exclude=held)  # fmt: skip
    outside = [r for r in worked + rows if r["goal_id"] not in held]
    assert k == len(outside) < m and len(kept) == len(outside)
    with pytest.raises(ValueError, match="A2RL_GRPO_HOLDOUT"):
        sft_grpo_session.held_out_games(list(goals), 1.0, seed=0)


def test_a_round_gives_the_cached_gpu_memory_back_before_it_submits(monkeypatch, tmp_path):
    """The grader evaluates a submission on the card the agent trains on: after SFT an agent held 33 GiB of
    cached blocks there and three of 27 gradings of four runs a card ran out of memory (H200, 2026-11-29)."""
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))

    class Client:
        def budget(self):
            return {"elapsed_s": 10.0}

        def submit(self, path, stage, parent=None):
            calls.append(f"submit {path}")
            return 503, {"detail": "closed"}

    session = object.__new__(sft_grpo_session.InteractiveSession)
    session.client, session.rounds, session.failures_in_a_row = Client(), [], 0
    session.current_path, session.submission_ids = None, {}
    session.s = type("S", (), {"workspace": tmp_path})()
    session.k = Knobs.from_env({})
    session.train_round = lambda seconds: sft_grpo_session.Round(1, "SFT", "base", 1, 0.5, 1.0)
    session.save = lambda: tmp_path / "output" / "v1"
    session.note = lambda r: None
    session.play_round(30.0)
    assert calls == ["empty_cache", "submit output/v1"]
