"""What the live display says while it waits (issue #45): never "measuring the rate" once every item is counted,
and not "about 2 s left" held for minutes while a last slow item or the evaluation's end takes its time."""

from __future__ import annotations

from pathlib import Path


def test_a_complete_count_says_finishing_and_a_late_last_item_is_not_seconds_left():
    from a2rl_bench.ops.progress import CountView, ItemProgress, RunProgress, Snapshot

    run = RunProgress(run_id="r", harness_dir=Path("."), phase="final_grading")
    view = CountView()
    done = ItemProgress(what="test", id="a", done=32, total=32, started_at=1000.0, at=1100.0, loaded=True)
    (count,) = view.counts(Snapshot(progress=run, items=done), now=1101.0)
    assert (count.done, count.total, count.left) == (32, 32, "finishing")
    assert done.left() == "finishing"
    # 31 of 32 at 3 s an item: the estimate runs out while the last item takes 150 s more. It said "about 2 s left"
    # for those 150 s; past the estimate it says so and counts up.
    late = ItemProgress(what="test", id="b", done=31, total=32, started_at=2000.0, at=2093.0, loaded=True)
    view = CountView()
    shown = [view.counts(Snapshot(progress=run, items=late), now=2093.0 + t)[0].left for t in range(0, 150, 5)]
    assert shown[0] == "finishing" and all("left" not in x for x in shown), shown
    assert shown[-1] == "overdue by 2 min 22 s", shown  # run out at 3 s, shown at 145 s


def test_the_eta_moves_gradually_when_the_rate_slows_and_counts_up_once_overdue():
    """The ETA jumped 9 -> 17 -> 33 -> 53 min within a minute: few items measured, and the next batch slower than
    the first. On a synthetic clock: 400 items finishing in batches of 8, the first batch after 8 s, each later
    one 120 s after the one before; the display is read every 5 s for 15 minutes."""
    from a2rl_bench.ops.progress import CountView, ItemProgress, RunProgress, Snapshot

    run = RunProgress(run_id="r", harness_dir=Path("."), phase="final_grading")
    view, shown, raw = CountView(), [], []
    for t in range(5, 900, 5):
        done = 0 if t < 8 else 8 * (1 + (t - 8) // 120)
        finished_at = 0.0 if t < 8 else 8.0 + 120.0 * ((t - 8) // 120)
        items = ItemProgress(what="test", id="a", done=done, total=400, started_at=0.0, at=finished_at, loaded=True)
        (count,) = view.counts(Snapshot(progress=run, items=items), now=float(t))
        if done:
            raw.append(items.eta_s(float(t)))
            minutes, _, seconds = count.left.removeprefix("about ").removesuffix(" s left").rpartition(" min ")
            shown.append(int(minutes or 0) * 60 + int(seconds))
    assert max(raw[:12]) / raw[0] > 4  # the estimate itself went up several-fold within a minute
    for i in range(len(shown) - 6):  # over any 30 s the shown ETA at most doubles (it was 5.9x within a minute)
        assert shown[i + 6] <= 2.0 * shown[i] + 1, (i, shown[i:i + 7])
    assert abs(shown[-1] - raw[-1]) < 0.2 * raw[-1], (shown[-1], raw[-1])  # and it does get there: nothing hidden


def test_an_overdue_count_starts_a_new_estimate_when_an_item_finishes():
    from a2rl_bench.ops.progress import EtaSmoother, eta_text

    eta = EtaSmoother()
    assert eta(20.0, now=0.0, done=5) == 20.0
    assert eta(0.0, now=25.0, done=5) == 0.0 and eta.overdue_s(25.0) == 5.0  # ran out at 20 s
    assert eta(10.0, now=40.0, done=5) == 0.0 and eta.overdue_s(40.0) == 20.0  # no creeping back by seconds
    assert eta_text(0.0, overdue_s=eta.overdue_s(40.0)) == "overdue by 20 s"
    assert eta(60.0, now=41.0, done=6) == 60.0 and eta.overdue_s(41.0) is None  # an item finished: the new rate
    assert eta_text(60.0, complete=True) == "finishing"


def test_a_long_wait_says_what_it_waits_on_and_counts_the_seconds():
    """`a2rl deploy` (543 s), `a2rl analyze` (350 s) and `a2rl drivers add` (319-556 s) printed nothing while they
    waited; a wait now says what it is, then again with the seconds it has lasted, and a quick one says nothing."""
    import io
    import re
    import time

    from a2rl_bench.cli.display import Waiting

    out = io.StringIO()
    with Waiting("deploying all deployments of prefect.yaml", first_s=0.0, every_s=0.01, stream=out):
        deadline = time.monotonic() + 60
        while out.getvalue().count("still") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("deploying all deployments of prefect.yaml ..."), lines
    assert all(re.search(r"still deploying all deployments of prefect\.yaml \(\d+ s\)$", x) for x in lines[1:3]), lines
    quick = io.StringIO()
    with Waiting("asking the server", stream=quick):  # over long before its first word is due
        pass
    assert quick.getvalue() == ""


def test_asyncio_lines_of_the_harness_runner_are_not_the_agents_latest_line():
    """A harness-internal "Task was destroyed but it is pending!" showed as the agent's latest log line."""
    from a2rl_bench.ops.progress import agent_lines

    log = ["[agent 10:01:59] tool bash: python train.py --epochs 1",
           "Task was destroyed but it is pending!",
           "task: <Task pending name='Task-7' coro=<Runner._heartbeat() running at runner.py:88> wait_for=<Future "
           "pending cb=[Task.task_wakeup()]>>"]  # fmt: skip
    assert agent_lines(log)[-1] == log[0]


def test_codex_records_the_command_the_sessions_end_cut_off():
    """codex's tool-call records missed the `/submit` call (5 of 6 commands): the budget's end stopped the session
    while it ran, and only completed items were recorded."""
    from a2rl_bench.agents.cli_agents.codex import CodexStreamParser

    p = CodexStreamParser()
    submit = "curl -s -X POST $A2RL_GRADER_URL/submit -d '{\"path\": \"output/v1\"}'"
    p.feed({"type": "item.started", "item": {"id": "i1", "type": "command_execution", "command": "ls"}})
    p.feed({"type": "item.completed", "item": {"id": "i1", "type": "command_execution", "command": "ls",
                                               "aggregated_output": "x", "exit_code": 0, "status": "completed"}})
    p.feed({"type": "item.started", "item": {"id": "i2", "type": "command_execution", "command": submit}})
    calls = p.finish()
    assert [(c.tool, c.ok, c.input["command"]) for c in calls] == [("command_execution", False, submit)]
    assert p.tool_calls == 2 and p.finish() == []


def test_the_final_phase_does_not_count_the_baselines_items_as_its_own(tmp_path):
    """A fresh checkout's `make run`, 2026-11-29: the final phase showed "final test items 48/48" (the baseline's
    file, still there), then "78/80" for a final test of 32 items. An evaluation that started before the phase
    did is not the phase's: nothing is counted until the final evaluation writes its own."""
    from a2rl_bench.ops.progress import EVAL_PROGRESS_FILE, CountView, ItemProgress, RunProgress, read_snapshot

    run = RunProgress(run_id="r", harness_dir=tmp_path, phase="final_grading", phase_started_at=5000.0)
    (tmp_path / "progress.json").write_text(run.model_dump_json())
    baseline = ItemProgress(what="validation+test", id="b", done=48, total=48, started_at=4900.0, at=4950.0,
                            loaded=True)  # fmt: skip
    (tmp_path / EVAL_PROGRESS_FILE).write_text(baseline.model_dump_json())
    view = CountView()
    assert read_snapshot(tmp_path / "progress.json").items is None
    final = ItemProgress(what="test", id="f", done=30, total=32, started_at=5010.0, at=5040.0, loaded=True)
    (tmp_path / EVAL_PROGRESS_FILE).write_text(final.model_dump_json())
    snap = read_snapshot(tmp_path / "progress.json")
    (count,) = view.counts(snap, now=5041.0)
    assert (count.label, count.done, count.total) == ("final test", 30, 32)


def test_a_killed_run_process_its_worker_has_not_reaped_yet_reads_gone(tmp_path):
    """A SIGKILLed flow run is a zombie until its worker reaps it; `a2rl retry` and `a2rl status` must see it
    gone at once (a retry pressed meanwhile was refused as 'still Running': the CI run of 34a0e21)."""
    import signal
    import socket
    import subprocess
    import time

    from a2rl_bench.isolation import procs
    from a2rl_bench.ops.progress import PROGRESS_FILE, RunProgress
    from a2rl_bench.ops.status import run_process

    child = subprocess.Popen(["sleep", "60"])  # its parent (this test) reaps it only at wait(), as a busy worker
    try:
        run = RunProgress(run_id="r", harness_dir=tmp_path, pid=child.pid, host=socket.gethostname())
        (tmp_path / PROGRESS_FILE).write_text(run.model_dump_json())
        assert run_process(tmp_path) == (child.pid, "alive")
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while procs.proc_stat(child.pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert Path(f"/proc/{child.pid}").exists(), "the child is a zombie, not yet reaped"
        assert run_process(tmp_path) == (child.pid, "gone")
    finally:
        child.kill()
        child.wait()
    assert run_process(tmp_path) == (child.pid, "gone")
