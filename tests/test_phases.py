"""The one phase-timing wrapper of a run attempt (tasks/phases.py), on a real attempt record and progress file."""

from __future__ import annotations

import json
import time

import pytest

from a2rl_bench.ops.progress import PROGRESS_FILE, ProgressWriter
from a2rl_bench.capture.attempts import AttemptLog, read_attempts
from a2rl_bench.tasks.phases import RunPhases


def test_each_phase_is_timed_into_the_attempt_and_shown_in_the_progress_file(tmp_path):
    attempts = AttemptLog(tmp_path, "flow-1", 1)
    phases = RunPhases(attempts, ProgressWriter("run-1", tmp_path, 60.0))
    with phases.enter("baseline"):
        assert json.loads((tmp_path / PROGRESS_FILE).read_text())["phase"] == "baseline"
        time.sleep(0.05)
    with pytest.raises(RuntimeError):
        with phases.enter("agent_session"):
            raise RuntimeError("the agent could not be launched")
    assert phases.current == "agent_session"  # a failure is reported in the phase it happened in
    attempts.end("failed")
    recorded = read_attempts(tmp_path).attempts[-1]
    assert list(recorded.phases) == ["baseline", "agent_session"] and recorded.phases["baseline"] >= 0.05
    assert recorded.outcome == "failed"
