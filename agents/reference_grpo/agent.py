"""Scripted reference agent: GRPO rounds (optionally after one SFT warm-up round), each submitted to the
grading server, while budget remains.

GRPO uses the task's rule reward (``train_grpo.py``: GSM8K's exact final number) or, for an interactive task
(one that ships ``data/envlib.zip``), the episode reward of online rollouts in its environment
(``train_grpo_env.py``). The SFT warm-up trains on the task's worked examples (``data/sft.jsonl``) where it
ships them.

Stand-alone: the harness copies this file, ``train_grpo.py``, ``train_grpo_env.py``, the reference-sft agent's
``train_common.py``, ``train_precision.py`` and loop helpers (as ``round_loop.py``; with ``--sft-warmup`` also
``train_sft.py``) into ``code/`` and runs ``python code/agent.py [--sft-warmup]`` with the workspace as working
directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import urllib.error
from dataclasses import dataclass
from pathlib import Path

try:  # in a workspace: the copy beside this file
    import round_loop as loop
except ImportError:  # in the harness's source tree
    from a2rl_bench.agents.reference_sft import agent as loop


class Stopped(Exception):
    """The harness asked the agent to stop (SIGTERM at the end of the budget)."""


def raise_stopped(signum, frame) -> None:
    raise Stopped(signal.Signals(signum).name)


@dataclass(frozen=True)
class GRPOSettings:
    """GRPO knobs, from the optional ``A2RL_GRPO_*`` variables (tests shrink them for tiny models)."""

    max_steps: int
    batch_size: int
    num_generations: int
    max_completion_length: int
    max_prompt_tokens: int
    temperature: float
    max_episode_steps: int
    """Interactive tasks: cap on the steps of a training episode."""
    lr: float | None
    train_s: float
    """Training-time cap per round, passed to ``train_grpo.py --time-limit``."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> GRPOSettings:
        env = dict(os.environ if env is None else env)
        lr = env.get("A2RL_GRPO_LR")
        return cls(
            max_steps=int(env.get("A2RL_GRPO_MAX_STEPS", "8")),
            batch_size=int(env.get("A2RL_GRPO_BATCH_SIZE", "4")),
            num_generations=int(env.get("A2RL_GRPO_NUM_GENERATIONS", "4")),
            max_completion_length=int(env.get("A2RL_GRPO_MAX_COMPLETION_LENGTH", "128")),
            max_prompt_tokens=int(env.get("A2RL_GRPO_MAX_PROMPT_TOKENS", "256")),
            temperature=float(env.get("A2RL_GRPO_TEMPERATURE", "0.9")),
            max_episode_steps=int(env.get("A2RL_GRPO_MAX_EPISODE_STEPS", "10")),
            lr=float(lr) if lr else None,
            train_s=float(env.get("A2RL_GRPO_TRAIN_S", "90")),
        )


class Session:
    """Rounds of (train, submit); GRPO starts from the best checkpoint so far, else the warm-up, else base."""

    def __init__(self, settings: loop.Settings, grpo: GRPOSettings, client: loop.GradingClient, budget: dict,
                 sft_warmup: bool):  # fmt: skip
        self.s, self.grpo, self.client, self.budget = settings, grpo, client, budget
        self.grpo_script = Path(__file__).resolve().parent / "train_grpo.py"
        self.grpo_env_script = self.grpo_script.with_name("train_grpo_env.py")
        self.interactive = (settings.data_path / "envlib.zip").exists()  # the task ships its environments
        self.sft_script = Path(loop.__file__).resolve().parent / "train_sft.py"  # beside the loop helpers
        self.warmup_pending = sft_warmup
        self.warm_path: Path | None = None
        self.notes = settings.workspace / "code" / "NOTES.md"
        self.margin_s = 10.0 + 0.02 * float(budget["budget_s"])
        self.overhead_s = loop.FIRST_ROUND_OVERHEAD_S
        self.best_score: float | None = None
        self.best_path: Path | None = None
        self.rounds = 0
        self.failures_in_a_row = 0

    def rel(self, path: Path) -> str:
        return loop.relative_to_workspace(path, self.s.workspace)

    def next_plan(self) -> loop.RoundPlan:
        cap = self.budget.get("max_submissions")
        if cap is not None and self.budget.get("submissions_used", 0) >= cap:
            return loop.RoundPlan(False, 0.0, "submission cap reached")
        if self.failures_in_a_row >= loop.MAX_FAILURES_IN_A_ROW:
            return loop.RoundPlan(False, 0.0, f"{self.failures_in_a_row} failed rounds in a row")
        train_s = self.s.train_s if self.warmup_pending else self.grpo.train_s
        return loop.plan_round(self.budget["remaining_s"], self.overhead_s, train_s, self.margin_s, self.rounds > 0)

    def command(self, plan: loop.RoundPlan, init: Path, out: Path, seed: int) -> tuple[str, list[str]]:
        """(method, argv) of this round's trainer."""
        common = ["--init", str(init), "--out", str(out), "--data", str(self.s.data_path / "train.jsonl"),
                  "--time-limit", f"{plan.time_limit_s:.0f}", "--seed", str(seed)]  # fmt: skip
        if self.warmup_pending:
            common[common.index("--data") + 1] = str(self.s.train_file)  # the task's worked examples, if any
            cmd = [sys.executable, str(self.sft_script), *common, "--max-steps", str(self.s.max_steps),
                   "--batch-size", str(self.s.batch_size), "--max-length", str(self.s.max_length)]  # fmt: skip
            return "SFT", cmd + (["--lr", str(self.s.lr)] if self.s.lr is not None else [])
        g = self.grpo
        if self.interactive:  # online rollouts in the task's environment, episode reward
            common[common.index("--data") + 1] = str(self.s.data_path)
            cmd = [sys.executable, str(self.grpo_env_script), *common, "--task", os.environ.get("TASK", ""),
                   "--max-steps", str(g.max_steps), "--goals-per-step", str(max(1, g.batch_size // g.num_generations)),
                   "--num-generations", str(g.num_generations), "--max-episode-steps", str(g.max_episode_steps),
                   "--temperature", str(g.temperature)]  # fmt: skip
            return "GRPO-env", cmd + (["--lr", str(g.lr)] if g.lr is not None else [])
        cmd = [sys.executable, str(self.grpo_script), *common, "--max-steps", str(g.max_steps),
               "--batch-size", str(g.batch_size), "--num-generations", str(g.num_generations),
               "--max-completion-length", str(g.max_completion_length),
               "--max-prompt-tokens", str(g.max_prompt_tokens), "--temperature", str(g.temperature)]  # fmt: skip
        return "GRPO", cmd + (["--lr", str(g.lr)] if g.lr is not None else [])

    def play_round(self, plan: loop.RoundPlan) -> bool:
        """Train, submit, record; False when the grader refuses further submissions."""
        self.rounds += 1
        out = self.s.output_dir / f"v{loop.next_version(self.s.output_dir)}"
        init = self.best_path or self.warm_path or self.s.model_path
        seed = self.s.seed * 1000 + self.rounds
        method, cmd = self.command(plan, init, out, seed)
        loop.log(f"round {self.rounds} {method} ({plan.reason}, {plan.time_limit_s:.0f}s): {' '.join(cmd[1:])}")
        result = loop.run_training(cmd, loop.kill_after_s(plan.time_limit_s, self.overhead_s), self.s.workspace)
        if result.summary:
            # The slowest round seen so far: on a shared machine, loading and saving times vary a lot.
            measured = result.wall_s - result.summary["train_s"]
            self.overhead_s = max(measured, self.overhead_s if self.rounds > 1 else 0.0, 5.0)
        elif not result.ok:
            self.overhead_s = max(self.overhead_s, result.wall_s - plan.time_limit_s)
        if method == "SFT":
            self.warmup_pending = False  # one warm-up attempt; GRPO follows either way
        if not result.ok or not out.is_dir():
            loop.log(f"round {self.rounds}: training failed ({result.error or 'no checkpoint written'})")
            self.note(method, init, result, "-", "-", f"training failed: {result.error}")
            self.failures_in_a_row += 1
            return True
        if method == "SFT":
            self.warm_path = out
        status, reply = self.client.submit(self.rel(out), stage=method)
        if status != 200:
            detail = reply.get("detail", reply)
            loop.log(f"round {self.rounds}: submit answered {status}: {detail}")
            self.note(method, init, result, self.rel(out), "-", f"submit {status}: {detail}")
            self.failures_in_a_row += 1
            return status not in (403, 429)
        if reply.get("status") != "scored":
            self.note(method, init, result, self.rel(out), "error", str(reply.get("error")))
            self.failures_in_a_row += 1
            return True
        self.failures_in_a_row = 0
        score, baseline = reply.get("score"), reply.get("baseline_score")
        better = loop.is_better(score, self.best_score) and loop.is_better(score, baseline)
        loop.log(f"round {self.rounds} {method}: score {score} (baseline {baseline}, best {self.best_score})")
        if better:
            self.best_score, self.best_path = score, out
        self.note(method, init, result, self.rel(out), str(score), "new best" if better else "")
        return True

    def note(self, method: str, init: Path, result: loop.TrainResult, sub: str, score: str, note: str) -> None:
        s = result.summary or {}
        row = [self.rounds, method, self.rel(init), s.get("steps", "-"), s.get("reward_mean", "-"),
               s.get("train_loss", "-"), f"{result.wall_s:.0f}", sub, score, note]  # fmt: skip
        with self.notes.open("a", encoding="utf-8") as f:
            f.write("| " + " | ".join(str(x) for x in row) + " |\n")

    def run(self) -> None:
        self.notes.parent.mkdir(parents=True, exist_ok=True)
        self.notes.write_text(
            "# reference-grpo notes\n\nScripted GRPO (TRL GRPOTrainer; reward: "
            f"{'the episode reward of online rollouts in the environment' if self.interactive else 'exact final number + 0.2 x format'})"
            f"{' after one SFT warm-up round' if self.warmup_pending else ''}, one submission per round.\n\n"
            f"- GRPO per round: {json.dumps(self.grpo.__dict__)}\n\n"
            "| round | method | init | steps | mean reward | loss | wall s | submission | score | note |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n",
            encoding="utf-8",
        )
        try:
            while True:
                plan = self.next_plan()
                if not plan.start:
                    loop.log(f"stopping: {plan.reason}")
                    break
                if not self.play_round(plan):
                    break
                self.budget = self.client.budget()
        finally:
            best = self.rel(self.best_path) if self.best_path else "none above baseline"
            loop.log(f"done after {self.rounds} rounds; best {best} with score {self.best_score}")
            with self.notes.open("a", encoding="utf-8") as f:
                f.write(f"\nAfter {self.rounds} rounds: best {best}, validation score {self.best_score}.\n")


def interactive_session():
    """reference-sft-grpo's in-process session for interactive tasks (`sft_grpo_session.py`), if installed."""
    try:  # in a workspace: the copy beside this file
        import sft_grpo_session
    except ImportError:
        try:  # in the harness's source tree
            from a2rl_bench.agents.reference_sft_grpo import sft_grpo_session
        except ImportError:
            return None
    return sft_grpo_session


def main(argv: list[str] | None = None) -> int:
    """Train, submit, repeat while the budget allows; exits 0 after logging whatever went wrong."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sft-warmup", action="store_true", help="start with one SFT round (train_sft.py)")
    parser.add_argument("--rl", choices=("grpo", "gigpo"), default=None,
                        help="interactive tasks: the RL rounds' advantages (default: A2RL_GRPO_ALGORITHM, else grpo)")
    args = parser.parse_args(argv)
    settings = loop.Settings.from_env()
    client = loop.GradingClient(settings.server_url, settings.token)
    if not client.wait_healthy():
        loop.log(f"grading server {settings.server_url} is not healthy; giving up")
        return 0
    signal.signal(signal.SIGTERM, raise_stopped)
    try:
        budget = client.budget()
        loop.log(f"budget: {json.dumps(budget)}")
        interactive = interactive_session() if args.sft_warmup else None
        if interactive is not None and interactive.applies(settings.data_path):
            # Worked examples and environments: one process, SFT rounds, then GRPO with online rollouts.
            knobs = interactive.Knobs.from_env()
            if args.rl:
                knobs = dataclasses.replace(knobs, algorithm=args.rl)
            interactive.InteractiveSession(settings, knobs, client, budget).run()
        else:
            Session(settings, GRPOSettings.from_env(), client, budget, args.sft_warmup).run()
    except Stopped as stop:
        loop.log(f"stopped by {stop}")
    except (OSError, RuntimeError, urllib.error.URLError) as error:
        loop.log(f"stopping on error: {error!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
