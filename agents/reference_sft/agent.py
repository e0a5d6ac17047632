"""Scripted reference agent: repeated SFT rounds, each submitted to the grading server, while budget remains.

Stand-alone (standard library only): the harness copies this file and ``train_sft.py`` (with its siblings
``train_common.py``, ``train_precision.py``) into the workspace's ``code/`` and runs ``python code/agent.py``
with the workspace as working directory.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

SUMMARY_PREFIX = "TRAIN_SUMMARY "
DEMONSTRATIONS = "sft.jsonl"
"""The task's worked examples, where it ships them (prompt-completion rows in the evaluation format)."""
FIRST_ROUND_OVERHEAD_S = 45.0
"""Guess for start-up, loading, merging and saving before any round has been timed."""
MIN_TRAIN_S = 10.0
"""A round with less training time than this is not worth starting (after the first round)."""
FIRST_ROUND_SHARE = 0.4
"""The first round's checkpoint is due by this share of the budget left (after the margin): however slow the
machine (a loaded CPU takes tens of seconds to import and load, and a step may take as long), the first
submission lands well inside the budget. Two fifths, not a half: under CI's load the first step and the save
ran up to 10 s past a due time of half the budget (asked at 64 s of 120). Later rounds are sized from the
times the first one measured."""
FIRST_SAVE_RESERVE_S = 15.0
"""Seconds kept for merging and saving the checkpoint before any round has measured it."""
MAX_FAILURES_IN_A_ROW = 3


@dataclass(frozen=True)
class Settings:
    """What the agent reads from its environment."""

    workspace: Path
    model_path: Path
    data_path: Path
    output_dir: Path
    server_url: str
    token: str
    seed: int
    max_steps: int
    batch_size: int
    first_batch_size: int
    """Batch size of the first round, whose step time nothing has measured yet: one example per step, so that on
    a loaded machine the first step (which always runs) ends in a quarter of the time (the same examples, in
    more steps, if time allows)."""
    max_length: int
    lr: float | None
    train_s: float
    """Training-time cap per round, passed to ``train_sft.py --time-limit``."""

    @property
    def train_file(self) -> Path:
        """The task's worked examples in its evaluation prompt format (``sft.jsonl``) where it ships them, else
        the raw training rows (question / answer, formatted by ``train_sft.py``)."""
        demos = self.data_path / DEMONSTRATIONS
        return demos if demos.exists() else self.data_path / "train.jsonl"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Read the workspace's environment variables; the ``A2RL_SFT_*`` knobs are optional."""
        env = dict(os.environ if env is None else env)
        workspace = Path(os.path.abspath(env.get("WORKSPACE", os.getcwd())))
        lr = env.get("A2RL_SFT_LR")
        data_path = Path(env.get("DATA_PATH", workspace / "data"))
        # Worked examples carry the evaluator's whole prompt (episode history, instructions): longer.
        default_length = "1024" if (data_path / DEMONSTRATIONS).exists() else "256"
        return cls(
            workspace=workspace,
            model_path=Path(env.get("MODEL_PATH", workspace / "models" / "base")),
            data_path=data_path,
            output_dir=Path(env.get("OUTPUT_DIR", workspace / "output")),
            server_url=env["GRADING_SERVER_URL"].rstrip("/"),
            token=env.get("GRADING_TOKEN", ""),
            seed=int(env.get("AGENT_SEED", "0")),
            max_steps=int(env.get("A2RL_SFT_MAX_STEPS", "14")),
            batch_size=int(env.get("A2RL_SFT_BATCH_SIZE", "4")),
            first_batch_size=int(env.get("A2RL_SFT_FIRST_BATCH_SIZE", "1")),
            max_length=int(env.get("A2RL_SFT_MAX_LENGTH", default_length)),
            lr=float(lr) if lr else None,
            train_s=float(env.get("A2RL_SFT_TRAIN_S", "90")),
        )


class RoundPlan(NamedTuple):
    """Whether to start another round, with how many seconds of training, and by when it must be saved."""

    start: bool
    time_limit_s: float
    reason: str
    ends_in_s: float = math.inf
    """Seconds from now by which the round's checkpoint must be written (the trainer's ``--deadline``)."""


def plan_round(
    remaining_s: float,
    overhead_s: float,
    train_s: float,
    margin_s: float,
    submitted: bool,
    step_s: float = 0.0,
) -> RoundPlan:
    """Decide the next round from the budget left and the last round's timing.

    Args:
        remaining_s: agent seconds left (grading time excluded).
        overhead_s: seconds a round spends outside training steps (start-up, loading, merging, saving).
        train_s: training seconds a full round gets.
        margin_s: seconds kept free at the end of the budget.
        submitted: whether a round was already tried; the first one is always started.
        step_s: the last round's seconds per training step (0: not measured yet).

    Returns:
        The first round always starts, due by ``FIRST_ROUND_SHARE`` of the budget left, so that its submission
        lands well inside the budget on any machine. A later round is full when it fits, shortened when at
        least ``MIN_TRAIN_S`` (and one and a half measured steps) of training fit, and otherwise not started.
    """
    if not submitted:  # loading time is unknown yet: the trainer's deadline, not a guess of it, ends the steps
        ends_in = max(0.0, FIRST_ROUND_SHARE * (remaining_s - margin_s))
        return RoundPlan(True, max(1.0, min(train_s, ends_in)), f"first round, checkpoint due in {ends_in:.0f}s", ends_in)
    usable = remaining_s - margin_s - overhead_s
    ends_in = remaining_s - margin_s
    if usable >= train_s:
        return RoundPlan(True, train_s, "full round", ends_in)
    needed = max(MIN_TRAIN_S, 1.5 * step_s)
    if usable >= needed:
        return RoundPlan(True, usable, "shortened round", ends_in)
    return RoundPlan(False, 0.0, f"{remaining_s:.0f}s left, a round needs {overhead_s + needed + margin_s:.0f}s")


def kill_after_s(time_limit_s: float, overhead_s: float) -> float:
    """Seconds after which a training process is killed: its training time plus generous room for the rest."""
    return time_limit_s + max(120.0, 2.0 * overhead_s)


def next_version(output_dir: Path) -> int:
    """Smallest N above every existing ``output/vN``, so an earlier checkpoint is never overwritten."""
    taken = [int(p.name[1:]) for p in output_dir.glob("v*") if p.name[1:].isdigit()]
    return max(taken, default=0) + 1


def parse_summary(lines: list[str]) -> dict | None:
    """The JSON summary ``train_sft.py`` prints last, if any."""
    for line in reversed(lines):
        if line.startswith(SUMMARY_PREFIX):
            try:
                return json.loads(line[len(SUMMARY_PREFIX) :])
            except json.JSONDecodeError:
                return None
    return None


def is_better(score: float | None, best: float | None) -> bool:
    """Strictly higher validation score than the best so far (the earlier submission wins ties)."""
    return score is not None and (best is None or score > best)


def log(message: str) -> None:
    """One progress line on stdout, which the harness keeps as the agent log."""
    print(f"[agent {time.strftime('%H:%M:%S')}] {message}", flush=True)


class GradingClient:
    """The grading server's HTTP API, as any agent would call it."""

    def __init__(self, url: str, token: str):
        self.url = url
        self.token = token

    def request(self, method: str, route: str, body: dict | None = None, timeout: float = 60.0) -> tuple[int, dict]:
        """(HTTP status, JSON body); 4xx/5xx come back as a status, not an exception."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + route, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                payload = json.loads(e.read() or b"{}")
            except json.JSONDecodeError:
                payload = {}
            return e.code, payload if isinstance(payload, dict) else {"detail": payload}

    def wait_healthy(self, tries: int = 30) -> bool:
        """Poll ``/health`` for up to ``tries`` seconds."""
        for _ in range(tries):
            try:
                if self.request("GET", "/health", timeout=5)[0] == 200:
                    return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        return False

    def budget(self) -> dict:
        """``GET /budget``."""
        status, body = self.request("GET", "/budget")
        if status != 200:
            raise RuntimeError(f"/budget answered {status}: {body}")
        return body

    def submit(self, model_path: str, stage: str | None = None, parent: int | None = None) -> tuple[int, dict]:
        """``POST /submit`` and wait for the score (grading can take minutes); `stage` names the training stage
        that made the checkpoint (SFT, GRPO, ...) and `parent` the earlier submission whose checkpoint its training
        started from, for the harness's analysis of what each stage added. A stop asked for meanwhile (the budget
        ended while the grader copied the checkpoint) is honoured once the submission is in."""
        _submitting.set()
        body = {"model_path": model_path, "wait": True, **({"stage": stage} if stage else {}),
                **({"parent": parent} if parent is not None else {})}  # fmt: skip
        try:
            return self.request("POST", "/submit", body, timeout=6 * 3600)
        finally:
            _submitting.clear()
            if _stop_asked:
                raise Stopped(_stop_asked[0])


class TrainResult(NamedTuple):
    """How one ``train_sft.py`` process ended."""

    ok: bool
    wall_s: float
    summary: dict | None
    error: str | None


class Stopped(Exception):
    """The harness asked the agent to stop (SIGTERM at the end of the budget)."""


_submitting = threading.Event()
_stop_asked: list[str] = []


def raise_stopped(signum, frame) -> None:
    name = signal.Signals(signum).name
    if _submitting.is_set():  # the grace after the budget is for exactly this: let the checkpoint land
        _stop_asked.append(name)
        log(f"{name} while submitting: finishing the submission first")
        return
    raise Stopped(name)


def run_training(cmd: list[str], kill_after: float, cwd: Path) -> TrainResult:
    """Run the trainer as its own process group, echo its output, kill it past ``kill_after`` seconds.

    The group stays in the agent's session, so the harness's end-of-session clean-up still reaches it.
    """
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0
    )
    lines: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            print(f"  | {line.rstrip()}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=kill_after)
    except subprocess.TimeoutExpired:
        return TrainResult(False, time.monotonic() - t0, None, f"killed after {kill_after:.0f}s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=5)
    wall = time.monotonic() - t0
    if rc != 0:
        return TrainResult(False, wall, None, f"exit code {rc}")
    return TrainResult(True, wall, parse_summary(lines), None)


class Notes:
    """``code/NOTES.md``: what each round did and scored."""

    def __init__(self, path: Path):
        self.path = path

    def start(self, settings: Settings, budget: dict) -> None:
        """Write the header."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(
            "# reference-sft notes\n\n"
            "Scripted SFT (TRL SFTTrainer, LoRA merged for models over 50M parameters) on "
            f"data/{settings.train_file.name} in the\nevaluation prompt format, one submission per round, next round from the best checkpoint so far.\n\n"
            f"- base model: {settings.model_path}\n- budget: {budget.get('budget_s')} s, "
            f"{budget.get('max_submissions')} submissions\n- per round: max_steps={settings.max_steps}, "
            f"batch_size={settings.batch_size}, max_length={settings.max_length}, lr={settings.lr or 'default'}, "
            f"train time cap {settings.train_s:.0f} s\n\n"
            "| round | init | seed | steps | train loss | wall s | submission | score | note |\n"
            "|---|---|---|---|---|---|---|---|---|\n",
            encoding="utf-8",
        )

    def add(self, n: int, init: str, seed: int, result: TrainResult, sub: str, score: str, note: str) -> None:
        """Append one round."""
        s = result.summary or {}
        row = [n, init, seed, s.get("steps", "-"), s.get("train_loss", "-"), f"{result.wall_s:.0f}", sub, score, note]
        with self.path.open("a", encoding="utf-8") as f:
            f.write("| " + " | ".join(str(x) for x in row) + " |\n")


def relative_to_workspace(path: Path, workspace: Path) -> str:
    """The path as the grader expects it: relative to the workspace when inside it (symlinks not followed)."""
    for inner, outer in (
        (Path(os.path.abspath(path)), Path(os.path.abspath(workspace))),
        (path.resolve(), workspace.resolve()),
    ):
        if inner.is_relative_to(outer):
            return str(inner.relative_to(outer))
    return str(Path(os.path.abspath(path)))


class Session:
    """The agent's state across rounds: budget, timing, best submission."""

    def __init__(self, settings: Settings, client: GradingClient, budget: dict):
        self.settings = settings
        self.client = client
        self.budget = budget
        self.trainer = Path(__file__).resolve().parent / "train_sft.py"
        self.notes = Notes(settings.workspace / "code" / "NOTES.md")
        self.margin_s = 10.0 + 0.03 * float(budget["budget_s"])
        self.overhead_s = FIRST_ROUND_OVERHEAD_S
        self.step_s = 0.0
        """Seconds per training step in the last round that trained (0 before the first)."""
        self.save_reserve_s = FIRST_SAVE_RESERVE_S
        self.best_score: float | None = None
        self.best_path: Path | None = None
        self.baseline_score: float | None = None
        self.submitted = False
        self.rounds = 0
        self.failures_in_a_row = 0

    def rel(self, path: Path) -> str:
        return relative_to_workspace(path, self.settings.workspace)

    def best_improves(self) -> bool:
        """Whether the best submission beats the base model (unknown baseline: any scored one does)."""
        return self.best_path is not None and is_better(self.best_score, self.baseline_score)

    def next_plan(self) -> RoundPlan:
        """The plan for the next round, or why to stop."""
        cap = self.budget.get("max_submissions")
        if cap is not None and self.budget.get("submissions_used", 0) >= cap:
            return RoundPlan(False, 0.0, "submission cap reached")
        if self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
            return RoundPlan(False, 0.0, f"{self.failures_in_a_row} failed rounds in a row")
        tried = self.submitted or self.rounds > 0
        return plan_round(self.budget["remaining_s"], self.overhead_s, self.settings.train_s, self.margin_s, tried,
                          self.step_s)

    def train(self, plan: RoundPlan, init: Path, out: Path, seed: int) -> TrainResult:
        """One ``train_sft.py`` process; updates the overhead estimate from its timing."""
        s = self.settings
        batch = s.batch_size if self.step_s else min(s.first_batch_size, s.batch_size)  # not measured: small steps
        steps = s.max_steps * s.batch_size // batch
        cmd = [sys.executable, str(self.trainer), "--init", str(init), "--out", str(out),
               "--data", str(s.train_file), "--max-steps", str(steps),
               "--batch-size", str(batch), "--max-length", str(s.max_length),
               "--time-limit", f"{plan.time_limit_s:.0f}", "--seed", str(seed)]  # fmt: skip
        if math.isfinite(plan.ends_in_s):
            # A wall-clock deadline: the clock runs while training (it stops only while a submission is graded),
            # so the trainer can stop stepping in time to save, however long its start-up took.
            cmd += ["--deadline", f"{time.time() + plan.ends_in_s:.1f}", "--save-reserve", f"{self.save_reserve_s:.0f}"]
        if s.lr is not None:
            cmd += ["--lr", str(s.lr)]
        log(f"round {self.rounds} ({plan.reason}, up to {plan.time_limit_s:.0f}s of training): {' '.join(cmd[1:])}")
        result = run_training(cmd, kill_after_s(plan.time_limit_s, self.overhead_s), s.workspace)
        if result.summary:
            # The slowest round seen so far: on a shared machine, loading and saving times vary a lot.
            measured = result.wall_s - result.summary["train_s"]
            self.overhead_s = max(measured, self.overhead_s if self.rounds > 1 else 0.0, 5.0)
            # Per step of the full batch (a step's time grows with its examples).
            self.step_s = float(result.summary.get("s_per_step") or 0.0) * s.batch_size / batch
            self.save_reserve_s = max(5.0, 1.5 * float(result.summary.get("save_s") or 0.0) + 2.0)
        elif not result.ok:
            self.overhead_s = max(self.overhead_s, result.wall_s - plan.time_limit_s)
        return result

    def play_round(self, plan: RoundPlan) -> bool:
        """Train, submit, record; False when the grader refuses further submissions."""
        self.rounds += 1
        n = next_version(self.settings.output_dir)
        out = self.settings.output_dir / f"v{n}"
        init = self.best_path if self.best_improves() else self.settings.model_path
        seed = self.settings.seed * 1000 + self.rounds
        result = self.train(plan, init, out, seed)

        def record(submission: str, score: str, note: str) -> None:
            self.notes.add(self.rounds, self.rel(init), seed, result, submission, score, note)

        if not result.ok or not out.is_dir():
            log(f"round {self.rounds}: training failed ({result.error or 'no checkpoint written'}); continuing")
            record("-", "-", f"training failed: {result.error}")
            self.failures_in_a_row += 1
            return True
        model_path = self.rel(out)
        log(f"round {self.rounds}: trained in {result.wall_s:.0f}s, submitting {model_path}")
        status, reply = self.client.submit(model_path, stage="SFT")
        if status != 200:
            detail = reply.get("detail", reply)
            log(f"round {self.rounds}: submit answered {status}: {detail}")
            record(model_path, "-", f"submit {status}: {detail}")
            self.failures_in_a_row += 1
            return status not in (403, 429)
        self.submitted = True
        if reply.get("status") != "scored":
            log(f"round {self.rounds}: grader error: {reply.get('error')}")
            record(model_path, "error", str(reply.get("error")))
            self.failures_in_a_row += 1
            return True
        self.failures_in_a_row = 0
        score = reply.get("score")
        if reply.get("baseline_score") is not None:
            self.baseline_score = reply["baseline_score"]
        better = is_better(score, self.best_score)
        log(f"round {self.rounds}: score {score} (baseline {self.baseline_score}, best so far {self.best_score})")
        if better:
            self.best_score, self.best_path = score, out
        record(model_path, str(score), "new best" if better else "")
        return True

    def run(self) -> None:
        """Rounds until the budget, the submission cap or repeated failures stop them."""
        self.notes.start(self.settings, self.budget)
        try:
            while True:
                plan = self.next_plan()
                if not plan.start:
                    log(f"stopping: {plan.reason}")
                    break
                if not self.play_round(plan):
                    break
                self.budget = self.client.budget()
        finally:
            best = self.rel(self.best_path) if self.best_path else "none"
            verdict = "above" if self.best_improves() else "not above"
            summary = f"best {best}, validation score {self.best_score}, {verdict} baseline {self.baseline_score}"
            log(f"done after {self.rounds} rounds; {summary}")
            with self.notes.path.open("a", encoding="utf-8") as f:
                f.write(f"\nAfter {self.rounds} rounds: {summary}.\n")


def main() -> int:
    """Train, submit, repeat while the budget allows; exits 0 after logging whatever went wrong."""
    settings = Settings.from_env()
    client = GradingClient(settings.server_url, settings.token)
    if not client.wait_healthy():
        log(f"grading server {settings.server_url} is not healthy; giving up")
        return 0
    signal.signal(signal.SIGTERM, raise_stopped)
    try:
        budget = client.budget()
        log(f"budget: {json.dumps(budget)}")
        Session(settings, client, budget).run()
    except Stopped as stop:
        log(f"stopped by {stop}")
    except (OSError, RuntimeError, urllib.error.URLError) as error:
        # The grading server went away or refused us: nothing more can be submitted.
        log(f"stopping on error: {error!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
