"""Time across crashes (#29.4): the agent's clock loses and gains nothing, the budget holds with the grace counted
apart, and a run's wall time and phases are summed over its attempts, each one listed.

Real processes, SIGKILLed mid-way, as a dead harness is; the truth is taken from outside them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from a2rl_bench.grading.clock import CLOCK_FILE, BudgetClock, ClockRecorder
from a2rl_bench.capture.attempts import AttemptLog, read_attempts

REPO = Path(__file__).resolve().parents[1]

# A harness's clock and attempt record, running until it is killed; it prints when its clock started.
HARNESS = """
import sys, time
from pathlib import Path
from a2rl_bench.grading.clock import BudgetClock, ClockRecorder
from a2rl_bench.capture.attempts import AttemptLog

h = Path(sys.argv[1])
log = AttemptLog(h, "fr-1", 1)
log.phase("provision")
time.sleep(0.5)
log.phase("agent_session")
clock = BudgetClock(600, already_used_s=float(sys.argv[2]))
with ClockRecorder(clock, h / "clock.json"):
    clock.start()
    print(time.time(), flush=True)
    time.sleep(600)
"""


def _killed_harness(tmp_path: Path, run_s: float, already_used_s: float = 0.0) -> tuple[float, float]:
    """Run the harness, SIGKILL it `run_s` after its clock started; (clock start, kill time) as seen from here."""
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(already_used_s)], env=env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    started = float(proc.stdout.readline())
    time.sleep(max(0.0, started + run_s - time.time()))
    proc.send_signal(signal.SIGKILL)
    killed = time.time()
    proc.wait()
    return started, killed


def test_the_agents_clock_after_a_sigkill_is_within_a_second_of_the_truth(tmp_path):
    started, killed = _killed_harness(tmp_path, run_s=2.2, already_used_s=10.0)
    used = ClockRecorder.used_seconds(tmp_path / CLOCK_FILE)
    truth = 10.0 + (killed - started)
    assert truth - 1.0 <= used <= truth, (used, truth)  # never more than the agent had; at most a second less


def test_an_agent_that_ran_on_after_its_harness_stopped_recording_is_charged_until_it_was_ended(tmp_path):
    clock_file = tmp_path / CLOCK_FILE
    clock_file.write_text(json.dumps({"elapsed_s": 12.0, "at": time.time() - 30.0, "paused": False}))
    ended_at = time.time()
    assert abs(ClockRecorder.charge_until(clock_file, ended_at) - 30.0) < 0.01
    assert abs(ClockRecorder.used_seconds(clock_file) - 42.0) < 0.01
    assert ClockRecorder.charge_until(clock_file, ended_at) == 0.0  # charged once
    # Paused for grading when its harness froze: the grading never ended, so its time never ran again.
    clock_file.write_text(json.dumps({"elapsed_s": 12.0, "at": time.time() - 30.0, "paused": True}))
    assert ClockRecorder.charge_until(clock_file, time.time()) == 0.0
    assert ClockRecorder.used_seconds(clock_file) == 12.0


def test_the_budget_holds_and_the_grace_past_it_is_counted_apart():
    clock = BudgetClock(0.4)
    clock.start()
    time.sleep(0.9)  # the agent overran its budget by 0.5 s while it was being stopped
    clock.stop()
    assert clock.agent_seconds() == 0.4
    assert 0.45 <= clock.grace_seconds() <= clock.elapsed() - 0.4 + 1e-9
    short = BudgetClock(60, already_used_s=5.0)
    assert (short.agent_seconds(), short.grace_seconds()) == (5.0, 0.0)


def test_wall_time_and_phases_are_summed_over_the_attempts_and_each_is_listed(tmp_path):
    started, killed = _killed_harness(tmp_path, run_s=1.5)
    log = AttemptLog(tmp_path, "fr-1", 2)  # the retry
    log.phase("agent_session")
    time.sleep(0.3)
    log.phase("summary")
    log.end("completed")

    attempts = read_attempts(tmp_path)
    first, second = attempts.attempts
    assert (first.number, second.number) == (1, 2) and first.label == "crashed in agent_session"
    assert second.outcome == "completed"
    # The killed attempt counts up to its last heartbeat: within a second of its death.
    assert killed - 1.0 - 0.6 <= first.end <= killed + 0.01
    phases = attempts.phase_seconds()
    assert set(phases) == {"provision", "agent_session", "summary"}
    # Its session counts up to the last heartbeat before the kill: a second at most, plus that beat's lateness in
    # waking on a loaded machine (CI: 0.4 ms past a bound without slack).
    assert phases["provision"] >= 0.5 and phases["agent_session"] >= (killed - started) - 1.0 - 0.2 + 0.3
    assert abs(attempts.wall_s - (first.wall_s + second.wall_s)) < 1e-9
    assert attempts.wall_s <= attempts.span_s  # the time between the attempts is not the run's work
    table = attempts.markdown()
    assert "| 1 | fr-1 |" in table and "crashed in agent_session" in table and "| 2 | fr-1 |" in table


def test_a_harness_going_down_on_a_signal_stops_the_agents_clock_with_its_agent(tmp_path):
    """Ctrl-C, SIGTERM or a crash mid-session: the agent's processes are ended, and its clock stops with them.
    The harness's way down after that (the output's drain, a last code snapshot) is not the agent's time: the
    clock file a retry resumes from reads where the agent stopped."""
    import _thread
    import threading

    from a2rl_bench.agents.base import Agent, AgentEnv, run_agent

    ws = tmp_path / "ws"
    (ws / "code").mkdir(parents=True)
    (ws / "code" / "agent.py").write_text(
        "import time\nopen('ready', 'w').write('1')\nwhile True:\n    time.sleep(0.1)\n")

    class Looper(Agent):
        id = "looper"

        def install(self, workspace):
            pass

        def command(self, workspace):
            return [sys.executable, "code/agent.py"]

    def interrupt_when_ready() -> None:
        deadline = time.monotonic() + 60
        while not (ws / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        _thread.interrupt_main()  # as Ctrl-C or the harness's SIGTERM handler raises in the flow's thread

    clock, clock_file = BudgetClock(600), tmp_path / "harness" / CLOCK_FILE
    (tmp_path / "harness").mkdir()
    env = AgentEnv("gsm8k", "tiny", ws, "http://127.0.0.1:9", "token", 0, harness_dir=tmp_path / "harness")
    # interrupt_main runs the Python-level SIGINT handler: an earlier test of the session (the CLI's own Ctrl-C
    # handling, run in-process) may have left one that does not raise, and the session then ran out its whole
    # 600 s budget instead of being interrupted (the suite's slowest test). Python's default raises.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_when_ready, daemon=True).start()
    at_agent_end, interrupted = None, False
    try:
        with ClockRecorder(clock, clock_file):
            try:
                run_agent(Looper(), env, clock, tmp_path / "harness" / "agent.log")
            finally:
                at_agent_end = clock.elapsed()
                time.sleep(1.5)  # the harness's way down
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGINT, before)
    assert interrupted, "the harness was not interrupted: the session ran to its budget"
    assert at_agent_end is not None and at_agent_end > 0.3
    assert abs(ClockRecorder.used_seconds(clock_file) - at_agent_end) < 0.05, "the clock ran on after the agent ended"


def test_a_retry_goes_on_only_from_the_directory_of_the_attempt_just_before_it(tmp_path, monkeypatch):
    """#44: attempt 1 ran on this host; attempts 2 and 3 ran elsewhere; attempt 4 lands here. It must not resume
    attempt 1's directory (that would drop what 2 and 3 did): the directory is set aside, kept, and the run
    starts over with a fresh one and a store that holds none of the old directory's rows or ledger anchors."""
    from a2rl_bench.records import RunConfig
    from a2rl_bench.store.results import ResultsStore
    from a2rl_bench.tasks import run_steps
    from a2rl_bench.tasks.run_steps import open_run

    monkeypatch.setattr(run_steps.flow_run, "get_id", lambda: "5e7a11fd-0000-4000-8000-000000000001")  # one flow run
    results, runs = tmp_path / "results.duckdb", tmp_path / "runs"
    config = RunConfig()
    first = open_run.fn(config, results, runs)
    attempt = AttemptLog(first.paths.harness_dir, "fr-1", 1)  # Prefect's run count 1, recorded in the directory
    attempt.end("failed")
    (first.paths.harness_dir / "ledger.jsonl").write_text("attempt 1's ledger\n")
    ResultsStore(results).record_ledger_head(first.run_id, 0, "hash-of-attempt-1")

    again = open_run.fn(config, results, runs, 2)  # the next attempt, on the same host: goes on from here
    assert (again.paths.harness_dir / "ledger.jsonl").read_text() == "attempt 1's ledger\n"

    fourth = open_run.fn(config, results, runs, 4)  # attempts 2 and 3 ran on other hosts
    assert fourth.paths.run_dir == first.paths.run_dir
    assert not (fourth.paths.harness_dir / "ledger.jsonl").exists()
    assert read_attempts(fourth.paths.harness_dir).attempts == []
    kept = runs / f"{first.run_id}.attempt-1-set-aside"
    assert (kept / "harness" / "ledger.jsonl").read_text() == "attempt 1's ledger\n"  # nothing is lost
    assert ResultsStore(results).ledger_head(first.run_id) is None  # the new ledger is not checked against it


# A host's harness: its agent's clock and recorder, and an agent process in its process group; it prints when its
# clock started, runs until a line on stdin, then prints when it stopped and what its clock counted.
FROZEN_HOST = """
import json, subprocess, sys, time
from pathlib import Path
from a2rl_bench.grading.clock import BudgetClock, ClockRecorder

h = Path(sys.argv[1])
agent = subprocess.Popen(["sleep", "600"])
clock = BudgetClock(600)
with ClockRecorder(clock, h / "clock.json"):
    clock.start()
    print(time.time(), flush=True)
    sys.stdin.readline()
    clock.stop()
    print(json.dumps({"at": time.time(), "elapsed": clock.elapsed(), "frozen": clock.frozen_seconds()}), flush=True)
agent.kill()
"""


def _host_session(tmp_path: Path, freeze_s: float) -> tuple[float, dict, float]:
    """Run the host's session ~2 s, freeze its whole process group `freeze_s` (0: none), run it ~2 s more and stop
    it; (the agent's wall time as seen from outside less the frozen stretch, the harness's record, frozen wall)."""
    script = tmp_path / "host.py"
    script.write_text(FROZEN_HOST)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        started = float(proc.stdout.readline())
        time.sleep(2.0)
        frozen = 0.0
        if freeze_s:
            stopped = time.time()
            os.killpg(proc.pid, signal.SIGSTOP)  # harness, its threads and its agent: the whole host stands still
            time.sleep(freeze_s)
            os.killpg(proc.pid, signal.SIGCONT)
            frozen = time.time() - stopped
        time.sleep(2.0)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        record = json.loads(proc.stdout.readline())
        proc.wait(timeout=60)  # its recorder's last save is made as it leaves
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return record["at"] - started - frozen, record, frozen


def test_frozen_host_time_is_not_charged_to_the_agent_and_an_unfrozen_run_is_charged_in_full(tmp_path):
    """The harness's process group, its agent with it, SIGSTOPped 7 s mid-session and woken: the agent's clock and
    its saved record leave the frozen stretch out (within a second); a run never frozen is charged its wall time."""
    truth, record, frozen = _host_session(tmp_path, freeze_s=7.0)
    assert frozen >= 7.0
    assert abs(record["elapsed"] - truth) <= 1.0, (record, truth, frozen)
    assert abs(record["frozen"] - frozen) <= 1.0, (record, frozen)
    assert abs(ClockRecorder.used_seconds(tmp_path / CLOCK_FILE) - record["elapsed"]) < 0.01

    truth, record, _ = _host_session(tmp_path, freeze_s=0.0)
    assert record["frozen"] == 0.0
    assert abs(record["elapsed"] - truth) <= 1.0, (record, truth)


def test_a_harness_thread_holding_the_gil_is_not_taken_for_a_frozen_host():
    """A long C call in another harness thread (a huge regex or JSON an agent's input might cause) keeps the
    clock's ticker asleep, waiting for the GIL, as long as a SIGSTOP would; but it wakes every 5 ms to ask for
    it, so the stretch is charged to the agent, not taken off (with any number of wake-ups allowed, one is)."""
    from a2rl_bench.grading.clock import FreezeWatch

    n = 10**7
    started = time.monotonic()
    sum(range(n))
    # a call holding the GIL ~4 s at this load: at least twice the threshold even if the load falls 4x meanwhile
    n = int(n * 4.0 / max(time.monotonic() - started, 1e-3))
    gaps: list[tuple[float, float]] = []
    watch = FreezeWatch(lambda start, end: gaps.append((start, end)), threshold_s=0.5)
    watch.start()
    time.sleep(0.6)
    held = time.monotonic()
    sum(range(n))
    held = time.monotonic() - held
    time.sleep(0.6)
    watch.stop()
    assert held >= 1.0, held  # twice the threshold: time alone would call it frozen
    assert gaps == [], (gaps, held)
