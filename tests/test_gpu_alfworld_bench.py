"""bench/gpu_alfworld.py, the GPU table's driver, in the parts that need no GPU: the order the runs start in and
a collect that waits without ending the runs (a call of the GPU tool lasts 10 minutes; the runs last longer)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import gpu_alfworld  # noqa: E402


def test_each_setting_runs_on_every_card():
    """start_all fills the cards round-robin in this order: with 2 cards, both settings of a table on both cards
    (one setting per card would confound the setting with its card's load)."""
    order = gpu_alfworld.run_order(["agent:sft-only", "agent:free"], [0, 1, 2, 3])
    assert sorted(order) == sorted((m, s) for m in ("agent:sft-only", "agent:free") for s in range(4))
    for mode in ("agent:sft-only", "agent:free"):
        cards = {i % 2 for i, (m, _) in enumerate(order) if m == mode}
        assert cards == {0, 1}, (mode, order)


def test_a_collect_with_wait_only_leaves_the_runs_running(tmp_path):
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        state = {"started_at": time.time(), "facts": {},
                 "runs": [{"name": "r", "pid": run.pid, "results": str(tmp_path / "r.duckdb"), "gpu": None,
                           "log": str(tmp_path / "r.log")}]}  # fmt: skip
        (tmp_path / gpu_alfworld.STATE).write_text(json.dumps(state))
        code = gpu_alfworld.main(["--collect", "--wait-only", "0", "--deadline-s", "0", "--work", str(tmp_path),
                                  "--out", str(tmp_path / "out")])  # fmt: skip
        assert code == 5
        assert run.poll() is None  # not interrupted: a later collect goes on with it
        assert not (tmp_path / "out" / "a2rl.duckdb").exists()
    finally:
        run.kill()
        run.wait()
