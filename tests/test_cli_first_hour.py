"""A newcomer's first hour, second pass (issue #26): every mistake answered at once with one line and exit 2
(before a Prefect server starts or anything is written), waits that scale with the machine's load, progress
counted per finished item with an ETA, the words for each wait, and the small things (`a2rl agents` says what is
installed, `a2rl drivers` alone is help, no store is not an error, SIGTERM says what it stopped)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

from test_cli_newcomer import a2rl_cli, assert_one_line, cli_env, harness_api_url

# ---- mistakes on the command line: one line, exit 2, nothing started ------------------------------------------

ARGPARSE_ROWS = {
    "budget not a number": (["--budget", "abc"], ["run: --budget", "'abc'", "a2rl run --help"]),
    "seed not a number": (["--seed", "x"], ["run: --seed", "'x'"]),
    "unknown mode": (["--mode", "rl-ish"], ["--mode", "'rl-ish'", "sft-only"]),
    "batch size zero": (["--eval-batch-size", "0"], ["--eval-batch-size 0", "greater than or equal to 1"]),
}


@pytest.mark.parametrize("row", list(ARGPARSE_ROWS))
def test_a_wrong_type_is_one_line_not_a_usage_block(row, tmp_path):
    args, needles = ARGPARSE_ROWS[row]
    proc = a2rl_cli(["run", *args, "--results", str(tmp_path / "out" / "a.duckdb")], cli_env(tmp_path))
    line = assert_one_line(proc, 2, *needles)
    assert "usage:" not in proc.stdout + proc.stderr and "pydantic" not in line and "[type=" not in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "prefect" / "prefect.db").exists()


def test_an_unknown_command_is_one_line(tmp_path):
    assert_one_line(a2rl_cli(["runn"], cli_env(tmp_path)), 2, "unknown command 'runn'", "a2rl --help")
    assert_one_line(a2rl_cli(["drivers", "ad"], cli_env(tmp_path)), 2, "unknown action 'ad'")


def _torn_store(path: Path) -> Path:
    from a2rl_bench.store.results import ResultsStore

    ResultsStore(path)
    os.truncate(path, path.stat().st_size // 2)
    return path


@pytest.mark.parametrize("kind", ["text file", "random bytes", "torn store"])
def test_a_results_path_that_is_no_store_is_refused_before_prefect_starts(kind, tmp_path):
    results = tmp_path / "a.duckdb"
    if kind == "text file":
        results.write_text("my notes\n")
    elif kind == "random bytes":
        results.write_bytes(os.urandom(5000))
    else:
        _torn_store(results)
    before = results.read_bytes()
    started = time.monotonic()
    proc = a2rl_cli(["run", "--results", str(results)], cli_env(tmp_path))
    assert_one_line(proc, 2, f"--results {results}", "not a DuckDB results file", "name a new file")
    assert time.monotonic() - started < 60  # the issue saw 110-185 s and exit 1; no model, no baseline now
    assert results.read_bytes() == before and not (tmp_path / "prefect" / "prefect.db").exists()


def test_an_existing_store_passes_the_check(tmp_path):
    from a2rl_bench.tasks.preflight import check_results_location

    results = tmp_path / "a.duckdb"
    from a2rl_bench.store.results import ResultsStore

    ResultsStore(results)
    check_results_location(results, tmp_path / "runs")  # no error


def test_a_driver_whose_endpoint_is_down_is_refused_before_the_run(tmp_path):
    env = cli_env(tmp_path, ANTHROPIC_API_KEY="k", ANTHROPIC_BASE_URL="http://127.0.0.1:9")  # a closed port
    proc = a2rl_cli(["run", "--agent", "claude-tools", "--driver", "m", "--results",
                       str(tmp_path / "o" / "a.duckdb")], env)
    assert_one_line(proc, 2, "--driver m", "127.0.0.1:9", "does not answer")
    assert not (tmp_path / "o").exists() and not (tmp_path / "prefect" / "prefect.db").exists()


def test_an_agent_and_a_driver_of_another_api_name_the_driver(tmp_path):
    proc = a2rl_cli(["run", "--agent", "codex", "--driver", "mydriver"], cli_env(tmp_path, ANTHROPIC_API_KEY="k"))
    assert_one_line(proc, 2, "--driver mydriver", "speaks the openai API", "speaks anthropic", "a2rl agents")


def test_a_judged_task_without_a_judge_names_the_openai_route(tmp_path):
    proc = a2rl_cli(["run", "--task", "alpacaeval"], cli_env(tmp_path))
    assert_one_line(proc, 2, "ANTHROPIC_API_KEY", "A2RL_JUDGE_API=openai", "A2RL_JUDGE_BASE_URL")


# ---- waits that scale with the load ------------------------------------------------------------------------------


def test_timeouts_grow_with_the_load_per_core(monkeypatch):
    from a2rl_bench.ops import load

    monkeypatch.setattr(load, "cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert load.scaled_timeout(30) == 30  # idle: as given
    monkeypatch.setattr(os, "getloadavg", lambda: (13.0, 12.0, 10.0))  # what the issue saw
    assert load.scaled_timeout(30) == pytest.approx(195) and "load 13.0 on 2 cores" in load.describe_load()
    monkeypatch.setattr(os, "getloadavg", lambda: (500.0, 500.0, 500.0))
    assert load.scaled_timeout(30) == 30 * load.MAX_FACTOR


def _slow_program(tmp_path: Path, seconds: float) -> Path:
    """A `--version` that answers after `seconds` the first time it runs and at once afterwards."""
    marker = tmp_path / "ran-once"
    program = tmp_path / "slowcli"
    program.write_text(f"#!/bin/sh\nif [ ! -e {marker} ]; then touch {marker}; sleep {seconds}; fi\necho 1.0\n")
    program.chmod(0o755)
    return program


def test_a_version_check_that_runs_out_of_time_once_is_tried_again(tmp_path, monkeypatch):
    """`openhands --version` took 26 s against a fixed 30 s limit under load and the check said "reinstall";
    now a slow first answer gets a second, longer try."""
    from a2rl_bench.ops import load
    from a2rl_bench.agents.cli_agents.install import check_starts

    monkeypatch.setattr(load, "load_per_core", lambda: 0.0)
    # no error: the second try answered
    assert check_starts([str(_slow_program(tmp_path, 3)), "--version"], {"PATH": "/usr/bin:/bin"}, timeout_s=1.0) is None


def test_a_version_check_that_never_answers_blames_the_load_not_the_install(tmp_path, monkeypatch):
    from a2rl_bench.ops import load
    from a2rl_bench.agents.cli_agents.install import TOO_BUSY, check_starts

    monkeypatch.setattr(load, "load_per_core", lambda: 0.0)
    hangs = tmp_path / "hangs"
    hangs.write_text("#!/bin/sh\nsleep 30\n")
    hangs.chmod(0o755)
    why = check_starts([str(hangs), "--version"], {"PATH": "/usr/bin:/bin"}, timeout_s=0.5)
    assert why is not None and why.endswith(TOO_BUSY) and "twice" in why and "reinstall" not in why


def test_a_slow_prefect_start_says_what_to_do(monkeypatch):
    from a2rl_bench.cli.starting import STARTUP_TIMEOUT_ENV, TIMED_OUT, start_failure, startup_timeout_s
    from a2rl_bench.ops import load

    monkeypatch.setenv(STARTUP_TIMEOUT_ENV, "90")  # as `a2rl` sets it in its process (and its children inherit)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(load, "cores", lambda: 2)
    assert startup_timeout_s() == pytest.approx(405)  # scaled from 90 however it was set

    line = start_failure(RuntimeError(f"{TIMED_OUT}. Ephemeral server process exited with code 3."))
    assert "did not answer within" in line and "a2rl server start" in line and "PREFECT_API_URL" in line


def test_prefects_draining_notice_is_not_a_line_before_the_error(monkeypatch, request):
    """"Still processing items: N items remaining..." comes from Prefect's background senders as a process exits,
    under their class names (outside the `prefect` logger tree): with Prefect's lines off it is not shown."""
    import logging

    from a2rl_bench.cli.display import PREFECT_QUEUE_SERVICES, set_prefect_console_level
    from test_cli_newcomer import _restore_console_levels_after

    _restore_console_levels_after(request)
    monkeypatch.setenv("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "NOTSET")  # restored after the test
    request.addfinalizer(lambda: [logging.getLogger(n).setLevel(logging.NOTSET) for n in PREFECT_QUEUE_SERVICES])
    set_prefect_console_level("off")
    assert not any(logging.getLogger(name).isEnabledFor(logging.WARNING) for name in PREFECT_QUEUE_SERVICES)
    set_prefect_console_level("info")
    assert logging.getLogger("APILogWorker").isEnabledFor(logging.WARNING)


# ---- the small things ---------------------------------------------------------------------------------------------


def test_no_command_and_drivers_without_an_action_print_the_help(tmp_path):
    env = cli_env(tmp_path)
    for args, words in (([], "run one benchmark run"), (["drivers"], "add,list,rm")):
        proc = a2rl_cli(args, env)
        assert proc.returncode == 0 and words in proc.stdout and not proc.stderr.strip(), proc.stderr


def test_results_and_status_without_a_store_are_not_errors(tmp_path):
    env = cli_env(tmp_path)
    missing = tmp_path / "results" / "a2rl.duckdb"
    for command in ("results", "status"):
        proc = a2rl_cli([command, "--results", str(missing)], env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "no results yet" in proc.stdout and "make run" in proc.stdout and "Traceback" not in proc.stderr


def test_agents_says_which_clis_are_installed(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "claude"
    fake.write_text("#!/bin/sh\necho 1\n")
    fake.chmod(0o755)
    env = cli_env(tmp_path, A2RL_TOOLS_DIR=str(tmp_path / "no-tools"))
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    out = a2rl_cli(["agents"], env).stdout
    assert f"`claude`: installed at {fake}" in out
    assert "`codex`: NOT installed (make tools)" in out and "`openhands`: NOT installed" in out
    reference = out.split("reference-sft", 1)[1].split("\n", 2)[:2]
    assert not any("installed" in line for line in reference)  # scripted agents run no CLI


def test_run_help_shows_each_default_once(tmp_path):
    text = a2rl_cli(["run", "--help"], cli_env(tmp_path)).stdout
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "<results dir>/runs" in " ".join(text.split()) and "(default: 120.0)" in text


def test_drivers_add_has_one_key_option_and_a_plain_saved_line(prefect_harness, tmp_path, monkeypatch, capsys,
                                                               request):  # fmt: skip
    from a2rl_bench.cli import main

    from test_cli_newcomer import _restore_console_levels_after

    _restore_console_levels_after(request)
    help_text = a2rl_cli(["drivers", "add", "--help"], cli_env(tmp_path)).stdout
    assert "--key-env" in help_text and "--api-key-env" not in help_text and "(default: None)" not in help_text
    monkeypatch.setenv("FIRST_HOUR_KEY", "sk-first-hour-SECRET")
    assert main(["drivers", "add", "first-hour", "--model", "m1", "--api", "openai", "--base-url",
                 "http://127.0.0.1:8000/v1", "--key-env", "FIRST_HOUR_KEY", "--input-usd-per-mtok", "3",
                 "--force"]) == 0  # fmt: skip
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("saved driver 'first-hour': model m1; openai API; endpoint http://127.0.0.1:8000/v1")
    assert "3.0 in" in line and "with an API key" in line and "a2rl run --driver first-hour" in line
    assert "SECRET" not in line and "_block" not in line and "api_key_env" not in line and "=" not in line
    main(["drivers", "rm", "first-hour"])


def test_sigterm_before_the_run_has_a_row_is_one_line(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "a2rl_bench.cli", "run", "--results", str(tmp_path / "a.duckdb")],
                            env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()  # the display's first word: the checks passed, the run is starting
        assert "loading Prefect" in first, first
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0] and "nothing was recorded" in lines[0], err
    assert not (tmp_path / "a.duckdb").exists()


def test_a_sigterm_during_the_imports_is_not_lost_in_library_code():
    """A stop that comes while Prefect and the pipeline are imported is raised after the imports: raised inside one,
    pydantic's schema building wrapped it in a SchemaError, Prefect's plug-in start-up caught that and went on,
    and the whole run went on after the user's SIGTERM (a fresh checkout's `make test`: 120 s, then the test's
    timeout)."""
    from a2rl_bench.cli.errors import Terminated, stops_deferred, terminate_like_ctrl_c

    def library_code() -> bool:  # what Prefect's import did: whatever is raised inside is caught, it goes on
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs here
        except BaseException:
            return False
        return True

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        terminate_like_ctrl_c()
        with pytest.raises(Terminated):
            with stops_deferred():
                assert library_code(), "the stop was raised inside the deferring block"
        with stops_deferred():  # nothing came: nothing is raised
            time.sleep(0.01)
        with pytest.raises(Terminated):  # a second stop does not wait for the block's end
            with stops_deferred():
                assert library_code()
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                pytest.fail("the second stop waited")
        assert not library_code()  # outside the block a stop is raised at once, as before
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])


def test_sigterm_during_a_run_records_it_interrupted_and_says_so(prefect_harness, tiny_model_dir, tmp_path):
    """`kill PID` (a scheduler's stop, a closed session) is answered like Ctrl-C: the row ends `interrupted` and
    the terminal gets one line saying so (it printed nothing, and the row stayed `running`)."""
    results = tmp_path / "a.duckdb"
    env = cli_env(tmp_path, A2RL_SFT_TRAIN_S="60", **harness_api_url())
    cmd = [sys.executable, "-m", "a2rl_bench.cli", "run", "--base-model", str(tiny_model_dir), "--budget", "300",
           "--val-limit", "1", "--test-limit", "1", "--results", str(results), "--sandbox", "off"]  # fmt: skip
    with (tmp_path / "out.log").open("w") as out_f, (tmp_path / "err.log").open("w") as err_f:
        proc = subprocess.Popen(cmd, env=env, stdout=out_f, stderr=err_f, text=True)
    from a2rl_bench.ops.load import scaled_timeout

    try:
        deadline = time.monotonic() + scaled_timeout(300)  # the machine's load stretches every phase before it
        while time.monotonic() < deadline and not list((tmp_path / "runs").glob("*/harness/agent.log")):
            assert proc.poll() is None, (tmp_path / "err.log").read_text()[-2000:]
            time.sleep(0.5)  # stop it during the agent session
        assert list((tmp_path / "runs").glob("*/harness/agent.log")), "the agent session never started"
        assert proc.poll() is None, (tmp_path / "err.log").read_text()[-2000:]
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=scaled_timeout(240))
    finally:
        if proc.poll() is None:
            proc.kill()
    err = (tmp_path / "err.log").read_text()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 143, err[-3000:]
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0] and "recorded as 'interrupted'" in lines[0], err
    with duckdb.connect(str(results), read_only=True) as db:
        assert db.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"


# ---- progress that moves ------------------------------------------------------------------------------------------


def test_generation_counts_items_as_they_finish_not_per_batch(tiny_model_dir, one_torch_thread):
    """One batch of prompts whose completions end at different steps: the count moves within the batch."""
    from a2rl_bench.inference.generation import generate

    counts: list[int] = []
    conversations = [[{"role": "user", "content": f"q{i} " * (i % 5 + 1)}] for i in range(10)]
    for engine in ("generate", "static"):
        counts.clear()
        # The tiny model's replies reach a stop string ("e") after 1 to 15 characters: rows end at many steps.
        out = generate(tiny_model_dir, conversations, max_new_tokens=40, batch_size=10, engine=engine, stop=("e",),
                       on_done=counts.append)  # fmt: skip
        assert sum(counts) == 10 and len(out.completions) == 10
        assert len(counts) >= 3 and max(counts) < 10, (engine, counts)  # not all ten at the batch's end


def test_an_evaluation_counts_into_its_progress_file(tiny_model_dir, tmp_path, monkeypatch):
    from a2rl_bench.inference.evaluation import EvalSpec, evaluate
    from a2rl_bench.ops.progress import EVAL_PROGRESS_ENV, ItemProgress
    from a2rl_bench.benchmarks import get_task

    progress = tmp_path / "eval_progress.json"
    monkeypatch.setenv(EVAL_PROGRESS_ENV, str(progress))
    result = evaluate(tiny_model_dir, EvalSpec.of(get_task("gsm8k"), "offline", "validation", 3, batch_size=2))
    final = ItemProgress.model_validate_json(progress.read_text())
    assert (final.what, final.done, final.total) == ("validation", 3, 3) == ("validation", result.n, 3)


def test_a_new_evaluation_never_shows_the_last_ones_count_while_it_starts(tmp_path, monkeypatch):
    """The final evaluation read 'test items 32/32' (the baseline's) for its first half minute, then 0/32."""
    from a2rl_bench.inference import evaluation
    from a2rl_bench.isolation import procs
    from a2rl_bench.benchmarks import get_task

    progress = tmp_path / "eval_progress.json"
    progress.write_text('{"what": "test", "done": 32, "total": 32}')
    seen_at_start = []

    def start(*args, **kwargs):
        seen_at_start.append(progress.exists())
        raise OSError("stop here: only the start matters")

    monkeypatch.setattr(procs, "start", start)
    with pytest.raises(OSError, match="stop here"):
        evaluation.evaluate_in_subprocess(tmp_path, evaluation.EvalSpec.of(get_task("gsm8k"), "offline", "test", 2),
                                          progress_file=progress)  # fmt: skip
    assert seen_at_start == [False]


def test_episodes_are_counted_as_they_end():
    """Interactive tasks run episodes in lockstep; each one is counted at the step it ends (the issue's webshop
    line read 0/200 for 140 s)."""
    from a2rl_bench.benchmarks import get_task

    task = get_task("deepsearchqa")
    goals = task.load_split("offline", "validation", 4)
    ended: list[int] = []

    def policy(conversations):  # at each step the first episode still going answers; the others search
        return ["Action: answer[Paris]"] + ["Action: search[capital of France]"] * (len(conversations) - 1)

    task.play(goals, policy, on_done=ended.append)
    assert ended[:4] == [1, 1, 1, 1] and sum(ended) == 4


def test_eta_comes_from_the_measured_rate():
    from a2rl_bench.ops.progress import ItemProgress, RunProgress, Snapshot, baseline_items, eta_text

    items = ItemProgress(what="validation", done=4, total=16, started_at=1000.0, at=1040.0, loaded=True)
    assert items.eta_s(now=1040.0) == pytest.approx(120.0)  # 10 s per item, 12 left
    assert ItemProgress(what="validation", total=16, started_at=1000.0, at=1000.0).left() == "loading the model"
    assert ItemProgress(what="validation", total=16, at=1000.0, loaded=True).left() == "measuring the rate"
    run = RunProgress(run_id="r", harness_dir=Path("."), phase="baseline", baseline_done=0, baseline_total=48,
                      baseline_split="validation")  # fmt: skip
    done, eta = baseline_items(Snapshot(progress=run, items=items), now=1040.0)
    assert done == 4 and eta == pytest.approx(120.0 + 32 * 10.0, abs=5)  # the test split still to come
    assert eta_text(None) == "measuring the rate" and "2 min" in eta_text(150)
    test_split = run.model_copy(update={"baseline_done": 16, "baseline_split": "test", "baseline_item_s": 12.0})
    fresh = ItemProgress(what="test", total=32, started_at=1100.0, at=1100.0, loaded=True)
    assert baseline_items(Snapshot(progress=test_split, items=fresh), now=1100.0) == (16, 32 * 12.0)


def test_a_library_warning_is_never_the_agents_latest_action(tmp_path):
    from a2rl_bench.ops.progress import ProgressWriter, read_snapshot

    harness = tmp_path / "harness"
    harness.mkdir()
    ProgressWriter("r", harness, budget_s=60).update(phase="agent_session")
    (harness / "agent.log").write_text(
        "[agent 10:00:01] round 1 (first round, checkpoint due in 53s): train_sft.py ...\n"
        "  | /x/site-packages/transformers/trainer.py:100: FutureWarning: `tokenizer` is deprecated\n"
        "  |   warnings.warn(\n"
        "/x/site-packages/peft/tuners/lora.py:9: UserWarning: fan_in_fan_out is set to False\n"
        "  self._warn()\n"
    )
    snap = read_snapshot(harness / "progress.json")
    assert "round 1 (first round" in snap.last_activity and "Warning" not in snap.last_activity


def test_tokens_and_cost_so_far_for_an_llm_agent(tmp_path):
    from a2rl_bench.ops.progress import ProgressWriter, read_snapshot, status_line

    harness = tmp_path / "harness"
    harness.mkdir()
    ProgressWriter("r", harness, budget_s=60).update(phase="agent_session")
    calls = harness / "llm_calls.jsonl"
    calls.write_text(json.dumps({"call": 1, "input_tokens": 1200, "output_tokens": 300, "cost_usd": 0.0081}) + "\n")
    assert "1 LLM calls, 1.2k in / 300 out tokens, $0.01" in status_line(read_snapshot(harness / "progress.json"))
    with calls.open("a") as f:
        f.write(json.dumps({"call": 2, "input_tokens": 2000, "cache_read_tokens": 800, "output_tokens": 700,
                            "cost_usd": 0.02}) + "\n" + '{"call": 3, "input_to')  # a line being written  # fmt: skip
    assert "2 LLM calls, 4.0k in / 1.0k out tokens, $0.03" in status_line(read_snapshot(harness / "progress.json"))


def test_every_wait_has_a_word(tmp_path):
    """Before the run has a row the display names what it waits on; inside a phase, the step."""
    import io

    from a2rl_bench.cli.display import RunDisplay
    from a2rl_bench.ops.progress import ANNOUNCE_ENV, ProgressWriter, note_step

    out = io.StringIO()
    announce = tmp_path / "announce.json"
    with RunDisplay(announce, stream=out, live=False, interval_s=0.05) as display:
        display.waiting("starting a local Prefect server")
        time.sleep(0.3)
        harness = tmp_path / "harness"
        harness.mkdir()
        os.environ[ANNOUNCE_ENV] = str(announce)
        try:
            writer = ProgressWriter("r1", harness, budget_s=60)
        finally:
            del os.environ[ANNOUNCE_ENV]
        writer.update(phase="provision")
        note_step(harness, "converting the base model smollm2-135m-instruct (first use on this machine; once)")
        time.sleep(0.3)
    text = out.getvalue()
    assert "starting a local Prefect server" in text
    assert "preparing data, base model and workspace: converting the base model" in text and "elapsed" in text


def test_a_run_without_a_submission_says_why_in_one_line(tmp_path):
    from a2rl_bench.ops.progress import why_no_submission

    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "ledger.jsonl").write_text(json.dumps({"kind": "event", "detail": {
        "event": "session-end", "ended_by": "budget", "agent_seconds": 120.0, "exit_code": None}}) + "\n")  # fmt: skip
    (harness / "agent.log").write_text("[agent 10:00:01] round 1 (first round): train_sft.py ...\n"
                                       "  | x.py:1: FutureWarning: soon\n"
                                       "[agent 10:02:00] stopped by SIGTERM\n")  # fmt: skip
    line = why_no_submission(harness, 120.0)
    assert "its 120 s budget ended before the agent submitted" in line and "round 1 (first round)" in line
    assert "\n" not in line and "FutureWarning" not in line


# ---- the default agent on a loaded machine --------------------------------------------------------------------------

LOAD_PER_CORE = 3
"""Busy-loop processes per core beside the agent: a load like the issue's (10-19 on 2 cores, with the harness)."""


@contextmanager
def busy_cores(per_core: int):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(per_core * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def io_stall_s() -> tuple[float, float]:
    """Seconds since boot that some / all tasks waited on the disk (PSI), (0, 0) where the kernel has no PSI."""
    try:
        lines = Path("/proc/pressure/io").read_text().splitlines()
    except OSError:
        return 0.0, 0.0
    total = {ln.split()[0]: float(ln.rsplit("total=", 1)[1]) / 1e6 for ln in lines}
    return total.get("some", 0.0), total.get("full", 0.0)


def scored_50(model_dir: Path, weights_hash: str, spec, device=None):
    """A stand-in evaluator (the grader's clock is paused while it runs, so its speed is not under test)."""
    from a2rl_bench.records import EvalResult

    return EvalResult(task=spec.task, split=spec.split, score=50.0, n=4, n_correct=2, evaluator_id="stand-in",
                      weights_hash=weights_hash)  # fmt: skip


def test_the_default_agent_submits_well_inside_its_budget_on_a_loaded_machine(tmp_path, monkeypatch):
    """The default run's agent (reference-sft on SmolLM2-135M, 120 s) with every core busy several times over:
    its first round is due by two fifths of the budget left and takes one-example steps stopped at the measured
    step time, so it asks to submit by half the budget, or after its first step where the machine is slower still
    (on 2d3f374 its first round trained for up to 61 s of 4-example steps after loading: it asked at 69-80 s here,
    and under the issue's load never inside the budget)."""
    from a2rl_bench.base_models.registry import resolve_base_model
    from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
    from a2rl_bench.records import RunConfig
    from a2rl_bench.workspace import RunPaths, build_workspace
    from a2rl_bench.agents import AgentEnv, get_agent, run_agent
    from a2rl_bench.benchmarks import get_task

    class Service(GradingService):
        """The real service, noting the agent's clock when a submission is asked for (before the checkpoint is
        copied and hashed, which takes the grader, not the agent, tens of seconds on this load)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.asked_at: list[float] = []

        def submit(self, model_path: str, *args, **kwargs) -> dict:
            self.asked_at.append(self.clock.elapsed())
            return super().submit(model_path, *args, **kwargs)

    for name in [k for k in os.environ if k.startswith("A2RL_SFT_")]:
        monkeypatch.delenv(name)  # the agent's own defaults, as `make run` has them
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # as `a2rl run` sets it
    # The default run but for its cap of one submission: what is asserted is the first round, which the agent plans
    # from the budget alone (the cap stops it only after that round's submission), and the cap ends the session
    # there instead of after more rounds that nothing here looks at (the whole budget: ~55 s of the test's ~115).
    config = RunConfig(max_submissions=1)
    base = resolve_base_model(config.base_model)  # converted once per machine
    paths = RunPaths.for_run(tmp_path / "runs", "loaded")
    build_workspace(paths, get_task("gsm8k").prepare("offline").public_dir, base, "# GSM8K\n", "# Submit output/vN\n")
    clock = BudgetClock(config.budget_s)
    ctx = GradingContext("loaded", config, paths.workspace, paths.harness_dir, baseline={"validation": 0.0})
    service = Service(ctx, clock, evaluate=scored_50)
    agent = get_agent(config.agent)
    agent.install(paths.workspace)
    io_before, load_before = io_stall_s(), os.getloadavg()[0]
    with busy_cores(LOAD_PER_CORE), GradingServer(service) as server:
        env = AgentEnv("gsm8k", config.base_model, paths.workspace, server.url, server.token, 0,
                       harness_dir=paths.harness_dir)  # fmt: skip
        run_agent(agent, env, clock, paths.harness_dir / "agent.log", grace_s=5)
        service.close(drain_timeout_s=60)
    io_after = io_stall_s()
    log = (paths.harness_dir / "agent.log").read_text(errors="replace")
    print(log)  # whole, in pytest's captured output: the assertion's message is cut
    print(f"load before the run {load_before:.1f}; disk waits during it: some {io_after[0] - io_before[0]:.1f}s, "
          f"full {io_after[1] - io_before[1]:.1f}s")
    submissions = service.submissions()
    assert submissions and submissions[0].status == "scored", log[-3000:]
    assert submissions[0].agent_elapsed_s < config.budget_s  # queued inside the budget
    first = json.loads(next(ln for ln in log.splitlines() if "TRAIN_SUMMARY " in ln).split("TRAIN_SUMMARY ", 1)[1])
    trained_in = float(log.split("round 1: trained in ", 1)[1].split("s,", 1)[0])
    assert service.asked_at[0] <= trained_in + 10.0, (service.asked_at, log[-3000:])  # asked once it had one
    # By half the budget; or, on a machine so slow that starting, loading, one step and the save overran the
    # first round's due time (CI, cause not known: a 35 s load, an 18 s step and a 12 s save, against 4, 2
    # and 1 s under this test's own load), after the one step a trainer always takes: it cannot stop sooner.
    assert service.asked_at[0] <= 0.5 * config.budget_s or first["steps"] == 1, (service.asked_at, log[-3000:])


def test_the_default_agent_lands_a_graded_submission_with_every_core_busy(prefect_harness, tiny_model_dir, tmp_path):
    """#26's 'done when': the default run (`a2rl run`: the reference agent with its own settings, the default
    120 s budget) shows a graded submission while another job keeps every core busy; at 2d3f374 its one training
    round took the whole budget and nothing was submitted. The agent's time never reads above its budget.

    The default run but for its cap of one submission, as in the test above: the agent plans its first round from
    the budget alone, and the cap ends the session after that round's grading instead of after the rounds that
    fill the rest of the budget, which nothing here looks at (on two busy cores they took ~100 of the test's ~150 s,
    and the busy processes burn both cores all the while)."""
    results = tmp_path / "a.duckdb"
    env = {k: v for k, v in cli_env(tmp_path, **harness_api_url()).items() if not k.startswith("A2RL_SFT_")}
    cmd = [sys.executable, "-m", "a2rl_bench.cli", "run", "--base-model", str(tiny_model_dir), "--val-limit", "2",
           "--test-limit", "2", "--results", str(results), "--sandbox", "off", "--max-submissions", "1"]  # fmt: skip
    with busy_cores(1):  # one busy process per core, beside everything else the machine runs
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with duckdb.connect(str(results), read_only=True) as db:
        status, budget, agent_s = db.execute("SELECT status, budget_s, agent_seconds FROM runs").fetchone()
        scored = db.execute("SELECT count(*) FROM submissions WHERE status = 'scored'").fetchone()[0]
    assert status == "completed" and budget == 120
    assert scored >= 1, proc.stdout[-3000:]
    assert agent_s <= budget
