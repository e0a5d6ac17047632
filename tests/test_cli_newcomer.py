"""A newcomer's mistakes, through the real `a2rl` command line: each answers with one line on stderr, exit 2,
no traceback and no run spent; failures inside a run end its row `failed` with a class; a terminal shows a
live progress display (issue #15)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from a2rl_bench.records import RunConfig
from a2rl_bench.run_options import RunOptions
from sandbox_support import needs_bwrap

REPO = Path(__file__).resolve().parents[1]


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "A2RL_NARRATIVE_MODEL",
                        "A2RL_DEBUG")}  # fmt: skip
    env["PREFECT_HOME"] = str(tmp_path / "prefect")  # no server, no saved block: nothing is started
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # no `claude`, no `codex`
    return env | extra


def a2rl_cli(args: list[str], env: dict[str, str], timeout: float = 120, prefix: list[str] | None = None):
    return subprocess.run([*(prefix or []), sys.executable, "-m", "a2rl_bench.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=env.get("A2RL_TEST_CWD"))  # fmt: skip


def assert_one_line(proc, rc: int, *needles: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == rc, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("a2rl: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


ONLINE_BUT_NO_NETWORK = {"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0",
                         "HF_ENDPOINT": "http://127.0.0.1:9"}  # a closed local port: refused at once
# Each row: the mistake (extra arguments, extra environment) and words the one line must contain.
PREFLIGHT_ROWS = {
    "negative budget": (["--budget", "-5"], {}, ["--budget", "-5"]),
    "absolute path that does not exist": (["--base-model", "/path/that/does/not/exist"], {},
                                          ["no such local directory"]),
    "relative path under an existing dir": (["--base-model", "models/nope"], {"MKDIR": "models"},
                                            ["no such local directory"]),
    "relative path, no such dir, offline": (["--base-model", "models/nope"], {},
                                            ["neither a local directory nor a hub model", "HF_HUB_OFFLINE"]),
    "hub id, hub off": (["--base-model", "Qwen/Qwen2.5-0.5B"], {}, ["nor a hub model in the cache", "HF_HUB_OFFLINE"]),
    "hub id, hub unreachable": (["--base-model", "Qwen/Qwen2.5-0.5B"], ONLINE_BUT_NO_NETWORK, ["not reachable"]),
    "full variant, hub off": (["--variant", "full"], {}, ["--variant full", "--variant offline"]),
    "full variant, hub unreachable": (["--variant", "full"], ONLINE_BUT_NO_NETWORK, ["nor reachable", "--variant offline"]),
    "driver without key or block": (["--agent", "claude-tools", "--driver", "claude-sonnet-4-5"], {},
                                    ["ANTHROPIC_API_KEY", "a2rl drivers add"]),
    "LLM agent without driver": (["--agent", "claude-tools"], {}, ["needs a driver LLM", "--driver"]),
    "claude-code without claude": (["--agent", "claude-code", "--driver", "m"],
                                   {"ANTHROPIC_API_KEY": "k", "A2RL_TOOLS_DIR": "/nonexistent-a2rl-tools"},
                                   ["`claude`", "npm install"]),
    "codex with an Anthropic driver": (["--agent", "codex", "--driver", "m"], {"ANTHROPIC_API_KEY": "k"},
                                       ["openai", "anthropic"]),
    "judged task without a judge": (["--task", "alpacaeval"], {}, ["judge", "ANTHROPIC_API_KEY"]),
    "narrative model without key": ([], {"A2RL_NARRATIVE_MODEL": "claude-x"}, ["A2RL_NARRATIVE_MODEL"]),
    "scripted agent given a driver": (["--driver", "m"], {}, ["scripted", "drop --driver"]),
    "unknown agent": (["--agent", "nope"], {}, ["unknown agent", "a2rl agents"]),
    "zero submissions": (["--max-submissions", "0"], {}, ["--max-submissions"]),
    "sandbox required, no bubblewrap": (["--sandbox", "required"], {"PATH": str(Path(sys.executable).parent)},
                                        ["--sandbox required", "not installed", "--sandbox auto"]),
    "negative item limit": (["--val-limit", "-3"], {}, ["--val-limit", "-3"]),
    "checkpoint dir without weights": (["--base-model", "."], {"CONFIG_JSON": "{}"}, ["no *.safetensors"]),
}


@pytest.mark.parametrize("row", list(PREFLIGHT_ROWS))
def test_each_mistake_gives_one_line_exit_2_and_spends_nothing(row, tmp_path):
    args, extra, needles = PREFLIGHT_ROWS[row]
    extra = dict(extra)
    if mkdir := extra.pop("MKDIR", None):
        (tmp_path / mkdir).mkdir()
    if config := extra.pop("CONFIG_JSON", None):
        (tmp_path / "config.json").write_text(config)
    env = cli_env(tmp_path, A2RL_TEST_CWD=str(tmp_path), **extra)
    results = tmp_path / "out" / "a.duckdb"
    proc = a2rl_cli(["run", *args, "--results", str(results)], env)
    assert_one_line(proc, 2, *needles)
    assert not results.exists() and not (tmp_path / "out").exists()  # no row, no run directory, nothing made
    assert not (tmp_path / "prefect" / "prefect.db").exists()  # and no Prefect server was started


@pytest.mark.parametrize("where", ["under a file", "/proc", "read-only mount"])
def test_an_unwritable_results_location_gives_one_line(where, tmp_path):
    env = cli_env(tmp_path)
    prefix = None
    if where == "under a file":
        (tmp_path / "afile").write_text("x")
        results = tmp_path / "afile" / "sub" / "a.duckdb"
    elif where == "/proc":
        results = Path("/proc/a2rl/a.duckdb")
    else:
        if (problem := _bwrap_problem()) is not None:
            pytest.skip(problem)
        (tmp_path / "ro").mkdir()
        results = tmp_path / "ro" / "a.duckdb"
        prefix = ["bwrap", "--bind", "/", "/", "--ro-bind", str(tmp_path / "ro"), str(tmp_path / "ro"),
                  "--dev", "/dev", "--proc", "/proc", "--"]  # fmt: skip
    line = assert_one_line(a2rl_cli(["run", "--results", str(results)], env, prefix=prefix), 2, "--results")
    assert "writ" in line or "is a file" in line


def _bwrap_problem() -> str | None:
    from sandbox_support import bwrap_problem

    return bwrap_problem()


def test_debug_shows_the_traceback(tmp_path):
    proc = a2rl_cli(["run", "--budget", "-5", "--debug"], cli_env(tmp_path))
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "PreflightError" in proc.stderr
    proc = a2rl_cli(["run", "--budget", "-5"], cli_env(tmp_path, A2RL_DEBUG="1"))
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_agents_and_help_say_what_each_agent_needs(tmp_path):
    env = cli_env(tmp_path)
    out = a2rl_cli(["agents"], env).stdout
    for agent_id in ("reference-sft", "claude-tools", "claude-code", "codex"):
        assert agent_id in out
    assert "`claude` on PATH" in out and "openai API (a saved driver: a2rl drivers add" in out and "scripted" in out
    help_text = " ".join(a2rl_cli(["run", "--help"], env).stdout.split())
    assert "need --driver: claude-code, claude-tools, codex" in help_text and "--strict-mode" in help_text


def test_drivers_add_list_rm_round_trip(prefect_harness, tmp_path, monkeypatch, capsys, request):
    """Saved as DriverConfig blocks on the Prefect server in use; the key comes from a variable and is never
    printed; a run's preflight resolves the saved block (no key in the environment)."""
    from a2rl_bench.cli import main

    _restore_console_levels_after(request)
    monkeypatch.setenv("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "NOTSET")  # restored after the test
    monkeypatch.setenv("MY_KEY", "sk-test-SECRET-42")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    from a2rl_bench.agents.cli_agents import install

    monkeypatch.setattr(install, "LOCAL_BINS", (tmp_path / "no-prefix",))  # nor in the project's .tools prefix
    add = ["drivers", "add", "sonnet", "--model", "claude-sonnet-4-5", "--key-env", "MY_KEY",
           "--input-usd-per-mtok", "3", "--output-usd-per-mtok", "15"]  # fmt: skip
    assert main(add) == 0
    assert main(["drivers", "add", "sonnet", "--model", "x"]) == 2  # no silent replacement
    assert main(["drivers", "list"]) == 0
    out, err = capsys.readouterr()
    assert "with an API key" in out and "--force" in err and "SECRET" not in out + err
    assert "sonnet" in out and "claude-sonnet-4-5" in out and "input_usd_per_mtok=3.0" in out
    assert main(["run", "--agent", "claude-code", "--driver", "sonnet", "--results", str(tmp_path / "a.db")]) == 2
    assert "`claude`" in capsys.readouterr().err  # the driver resolved; the missing CLI is what is wrong
    assert main(["drivers", "rm", "sonnet"]) == 0
    capsys.readouterr()
    main(["drivers", "list"])
    listed = capsys.readouterr().out  # other tests of the session may have saved drivers of their own
    assert not any(line.split()[:1] == ["sonnet"] for line in listed.splitlines())


def _restore_console_levels_after(request) -> None:
    """`a2rl drivers` quiets Prefect's console handlers in its process; here that is the test session's."""
    import logging

    handlers = {h for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
                if isinstance(logger, logging.Logger) for h in logger.handlers}  # fmt: skip
    levels = {h: h.level for h in handlers}
    request.addfinalizer(lambda: [h.setLevel(level) for h, level in levels.items()])


def harness_api_url() -> dict[str, str]:
    """The session's Prefect test server, for CLI subprocesses (saves each one starting its own)."""
    from prefect.settings import PREFECT_API_URL

    return {"PREFECT_API_URL": PREFECT_API_URL.value()}


def test_a_failure_inside_the_run_gives_one_line_and_a_failed_row(prefect_harness, tiny_model_dir, tmp_path):
    """A checkpoint that passes the preflight (config and weights files are there) but cannot be loaded (the
    weights file is garbage): the run fails in its baseline; the terminal gets one line naming the phase, the
    report and the log with the traceback."""
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.is_file():
            (broken / f.name).write_bytes(f.read_bytes() if f.suffix != ".safetensors" else b"not a tensor file")
    results = tmp_path / "a.duckdb"
    proc = a2rl_cli(["run", "--base-model", str(broken), "--results", str(results), "--val-limit", "1",
                 "--test-limit", "1", "--sandbox", "off"], cli_env(tmp_path, **harness_api_url()),
                 timeout=300)  # fmt: skip
    line = assert_one_line(proc, 1, "failed", "report", "log")
    with duckdb.connect(str(results), read_only=True) as db:
        status, error, failure_class, harness = db.execute(
            "SELECT status, error, failure_class, harness_dir FROM runs").fetchone()
    assert status == "failed" and failure_class == "infrastructure failure"
    phase = error.split(" in ", 1)[1].split(":", 1)[0]
    assert phase in ("provision", "baseline") and f"in {phase}" in line
    assert "Traceback" in (Path(harness) / "run.log").read_text()
    assert str(Path(harness) / "report.md") in line and (Path(harness) / "report.md").exists()


def test_a_failure_while_recording_a_failure_still_ends_the_row_failed(prefect_harness, tiny_model_dir, tmp_path,
                                                                       monkeypatch):  # fmt: skip
    """`--variant full` offline, started around the CLI (as a deployment would): the flow's own preflight stops
    it, and the leak audit of the failure report cannot load the data either. The row must not stay `running`."""
    from a2rl_bench.tasks.preflight import PreflightError
    from a2rl_bench.flows.benchmark_run import benchmark_run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    results = tmp_path / "a.duckdb"
    with pytest.raises(PreflightError, match="--variant full"):
        benchmark_run(RunConfig(variant="full", base_model=str(tiny_model_dir), val_limit=1, test_limit=1),
                      RunOptions(results=results))
    with duckdb.connect(str(results), read_only=True) as db:
        status, error, failure_class = db.execute("SELECT status, error, failure_class FROM runs").fetchone()
    assert status == "failed" and failure_class == "infrastructure failure"
    assert error.startswith("PreflightError in preflight") and "while recording it" in error


def test_an_agent_that_never_started_makes_the_run_failed(prefect_harness, tiny_model_dir, tmp_path, monkeypatch):
    """claude-code with no `claude` on PATH, started around the CLI: failed (infrastructure), not completed."""
    from a2rl_bench.tasks.preflight import PreflightError
    from a2rl_bench.flows.benchmark_run import benchmark_run

    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    from a2rl_bench.agents.cli_agents import install

    monkeypatch.setattr(install, "LOCAL_BINS", (tmp_path / "no-prefix",))  # nor in the project's .tools prefix
    results = tmp_path / "a.duckdb"
    with pytest.raises(PreflightError, match="`claude`"):
        benchmark_run(RunConfig(agent="claude-code", driver="m", base_model=str(tiny_model_dir), val_limit=1,
                                test_limit=1), RunOptions(results=results))  # fmt: skip
    with duckdb.connect(str(results), read_only=True) as db:
        status, failure_class = db.execute("SELECT status, failure_class FROM runs").fetchone()
    assert (status, failure_class) == ("failed", "infrastructure failure")


def test_did_not_start_reads_a_launch_error_as_the_harness_failure(tmp_path):
    from a2rl_bench.records import RunConfig
    from a2rl_bench.run import RunContext
    from a2rl_bench.workspace import RunPaths
    from a2rl_bench.agents import SessionOutcome
    from a2rl_bench.tasks.summary_steps import did_not_start

    ctx = RunContext(run_id="r", config=RunConfig(agent="claude-tools", driver="m"),
                     paths=RunPaths.for_run(tmp_path, "r"), results_path=tmp_path / "a.duckdb")  # fmt: skip
    ctx.paths.create()
    launch = SessionOutcome(exit_code=None, ended_by="launch-error", agent_seconds=0, wall_seconds=0, error="no CLI")
    assert "could not be launched: no CLI" in did_not_start(ctx, launch)
    quit_at_once = SessionOutcome(exit_code=1, ended_by="exited", agent_seconds=2, wall_seconds=2)
    assert "without one successful LLM call" in did_not_start(ctx, quit_at_once)
    (ctx.paths.harness_dir / "llm_calls.jsonl").write_text(json.dumps({"call": 1, "output_tokens": 12}) + "\n")
    assert did_not_start(ctx, quit_at_once) is None  # it worked, then stopped: the agent's own result


def test_progress_display_and_mode_breaches_on_a_terminal(prefect_harness, tiny_model_dir, tmp_path):
    """`a2rl run --mode rl-only --agent reference-sft` on a pty: a live display (phases, baseline items, the
    agent's clock moving, submissions) and the SFT submission's mode breach in the display, the summary, the
    report's headline table and `a2rl status`."""
    # Its own A2RL_HOME: a baseline cached by an earlier test would skip the evaluation this test watches.
    env = cli_env(tmp_path, A2RL_SFT_TRAIN_S="4", A2RL_SFT_MAX_STEPS="4", A2RL_SFT_BATCH_SIZE="4",
                  A2RL_SFT_MAX_LENGTH="512", COLUMNS="160", LINES="40", A2RL_HOME=str(tmp_path / "a2rl-home"),
                  **harness_api_url())  # fmt: skip
    results = tmp_path / "a.duckdb"
    # One submission is all the display has to show; the cap ends the session after its grading instead of after
    # the rounds that fill the rest of the 45 s.
    cmd = [sys.executable, "-m", "a2rl_bench.cli", "run", "--base-model", str(tiny_model_dir), "--budget", "45",
           "--val-limit", "1", "--test-limit", "1", "--mode", "rl-only", "--results", str(results),
           "--sandbox", "off", "--max-submissions", "1"]  # fmt: skip
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, env=env, stdin=follower, stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    screen = ""
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 1.0)[0]:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the CLI exited and closed the terminal
                    break
                if not chunk:
                    break
                screen += chunk.decode("utf-8", "replace")
        assert proc.wait(timeout=60) == 0, screen[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    (tmp_path / "screen.txt").write_text(screen)  # for a failure's post-mortem
    clock_readings = set(re.findall(r"(\d+)/45 s", screen))
    assert len(clock_readings) >= 3, screen[-3000:]  # the agent's clock moved on screen
    assert "\x1b[" in screen  # drawn in place with terminal control sequences, not printed line after line
    with duckdb.connect(str(results), read_only=True) as db:
        status, harness, n = db.execute("SELECT status, harness_dir, n_submissions FROM runs").fetchone()
    assert status == "completed" and n == 1
    for shown in ("evaluating the base model", "agent session", "graded: #1",
                  "1 submission(s) broke the mode", f"mode rl-only: {n} of {n} submissions BROKE THE MODE"):
        assert shown in screen, shown
    # The baseline's item count on screen, and once done, its row stays through the session (its two items can
    # finish, and the session begin, between two frames: on the fast machine of 2026-12-02 the screen went from
    # 0/2 to the session).
    assert re.search(r"\b[0-2]/2 items \(validation\+test\)", screen), "the baseline's item count"
    assert "2/2 items, done: validation" in screen, "the finished baseline's row"
    assert f"| mode breaches (mode rl-only) | **{n}** of {n} submissions |" in (Path(harness) / "report.md").read_text()
    table = a2rl_cli(["status", "--results", str(results)], env).stdout
    assert "mode_breaches" in table and f"│ rl-only │ {n} " in table


def test_status_tells_a_live_running_row_from_one_whose_process_died(tmp_path):
    """`running` in the store: `a2rl status` says whether the run's process is still there."""
    import socket

    from a2rl_bench.ops.progress import RunProgress
    from a2rl_bench.records import RunConfig
    from a2rl_bench.store.results import ResultsStore

    gone = subprocess.Popen(["true"])
    gone.wait()
    store = ResultsStore(tmp_path / "a.duckdb")
    for name, pid in (("alive", os.getpid()), ("dead", gone.pid)):
        harness = tmp_path / name / "harness"
        harness.mkdir(parents=True)
        (harness / "progress.json").write_text(RunProgress(run_id=name, harness_dir=harness, phase="agent_session",
                                                           pid=pid, host=socket.gethostname()).model_dump_json())
        store.start_run(name, RunConfig(seed=pid), str(harness), "label")
    table = a2rl_cli(["status", "--results", str(tmp_path / "a.duckdb")], cli_env(tmp_path)).stdout
    assert f"running (pid {os.getpid()}, agent_session)" in table and f"process {gone.pid} is gone" in table


def test_without_a_terminal_the_display_prints_plain_lines_when_something_happens(tmp_path):
    """Piped output gets one line per change (phase, a submission queued or graded), no control sequences."""
    import io

    from a2rl_bench.cli.display import RunDisplay
    from a2rl_bench.ops.progress import ProgressWriter

    harness = tmp_path / "harness"
    harness.mkdir()
    announce = tmp_path / "announce.json"
    out = io.StringIO()
    os.environ["A2RL_RUN_ANNOUNCE"] = str(announce)
    try:
        writer = ProgressWriter("r1", harness, budget_s=60)
    finally:
        del os.environ["A2RL_RUN_ANNOUNCE"]
    ledger = harness / "ledger.jsonl"
    with RunDisplay(announce, stream=out, live=False, interval_s=0.05):
        writer.update(phase="agent_session")
        time.sleep(0.5)
        (harness / "clock.json").write_text(json.dumps({"elapsed_s": 12.0, "at": time.time()}))
        (harness / "agent.log").write_text("[agent] round 1: training\n")
        ledger.write_text(json.dumps({"kind": "submission", "submission_id": 1, "status": "queued",
                                      "detail": {"mode_ok": False}}) + "\n")  # fmt: skip
        time.sleep(0.5)
        with ledger.open("a") as f:
            f.write(json.dumps({"kind": "submission", "submission_id": 1, "status": "scored", "score": 37.5}) + "\n")
        time.sleep(0.5)
    lines = out.getvalue().splitlines()
    assert "\x1b[" not in out.getvalue() and 3 <= len(lines) <= 6, lines
    assert any("1 queued, 0 graded" in line and "paused: grading" in line for line in lines)
    assert "1 graded [#1 37.5]" in lines[-1] and "MODE BREACHES 1" in lines[-1]
    # 12 s saved in clock.json, plus the time since it was saved while nothing is graded
    assert re.search(r"agent time 1[234]/60 s", lines[-1]) and "round 1: training" in lines[-1]


def test_server_start_on_another_port_serves_a_ui_that_talks_to_its_own_api(tmp_path):
    """Issue #36: on --port 4277 the UI's settings named port 4200 and the UI could not reach its API."""
    import httpx

    from live_server import free_port, keep_migrated_db, seed_migrated_db

    port = free_port()
    env = cli_env(tmp_path)
    try:
        seed_migrated_db(Path(env["PREFECT_HOME"]))
        proc = a2rl_cli(["server", "start", "--port", str(port), "--no-worker"], env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        keep_migrated_db(Path(env["PREFECT_HOME"]))
        settings = httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=10).json()
        assert settings["api_url"] == f"http://127.0.0.1:{port}/api"
        assert httpx.get(f"{settings['api_url']}/health", timeout=10).status_code == 200
    finally:
        a2rl_cli(["server", "stop"], env, timeout=120)


def _linked_cli(tmp_path: Path, body: str, name: str = "opencode") -> tuple[Path, Path]:
    """A tiny CLI reached as `.tools` reaches the pinned ones: PATH holds link/.bin, `link` is a link to the real
    directory, and .bin/NAME a relative link into its package. Returns (the PATH directory, the real file)."""
    real = tmp_path / "cache"
    (real / ".bin").mkdir(parents=True)
    (real / "pkg" / "bin").mkdir(parents=True)
    program = real / "pkg" / "bin" / name
    program.write_text(f"#!/bin/sh\n{body}\n")
    program.chmod(0o755)
    (real / ".bin" / name).symlink_to(f"../pkg/bin/{name}")
    (tmp_path / "link").symlink_to(real)
    return tmp_path / "link" / ".bin", program


@needs_bwrap
def test_a_cli_on_path_through_a_linked_directory_is_resolved_and_starts_in_the_sandbox(tmp_path, monkeypatch):
    """Issue #36: a CLI found through the checkout's `.tools` link passed the checks, then every run failed with
    exit 127 in the sandbox: the sandbox saw the linked path, not what it resolves to."""
    from a2rl_bench.isolation.sandbox import SandboxPolicy
    from a2rl_bench.agents import LLMDriver, get_agent
    from a2rl_bench.agents.cli_agents.install import check_starts, which_cli

    bin_dir, real = _linked_cli(tmp_path, 'echo "fake 1.0"')
    path = f"{bin_dir}:/usr/bin:/bin"
    agent = get_agent("opencode", driver=LLMDriver(model="m", api="openai", api_key="k"))
    assert agent.find(path) == real  # one rule: the link resolved before anything is spent
    (tmp_path / "ws").mkdir()
    policy = SandboxPolicy(tmp_path / "ws")
    assert agent.check(sandbox=policy, path=path) is None  # the probe: `--version` inside the sandbox
    # What the runs did before: the linked path, bound as seen, does not start inside the sandbox.
    monkeypatch.setenv("PATH", path)
    assert check_starts([str(which_cli("opencode", path)), "--version"], {"PATH": path}, policy) is not None


@needs_bwrap
def test_a_cli_that_starts_on_the_host_but_not_in_the_sandbox_is_refused_before_the_baseline(tmp_path):
    helper = tmp_path / "elsewhere" / "helper"  # a file the sandbox does not bind (its /tmp is its own)
    helper.parent.mkdir()
    helper.write_text("#!/bin/sh\necho 1.0\n")
    helper.chmod(0o755)
    bin_dir, _ = _linked_cli(tmp_path, f"exec {helper} \"$@\"")
    env = cli_env(tmp_path, ANTHROPIC_API_KEY="k", ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    assert subprocess.run([str(bin_dir / "opencode"), "--version"], capture_output=True).returncode == 0  # on the host
    results = tmp_path / "out" / "a.duckdb"
    proc = a2rl_cli(["run", "--agent", "opencode", "--driver", "m", "--sandbox", "required", "--results", str(results)], env)
    assert_one_line(proc, 2, "opencode", "does not start in the sandbox")
    assert not results.exists() and not (tmp_path / "out").exists()


def test_an_old_node_on_path_is_named_with_how_to_choose_another(tmp_path):
    """Issue #36: Node 18 first on PATH gave "reinstall …/.bin/codex"; the line now names that Node."""
    from a2rl_bench.agents.cli_agents.install import node_mismatch

    package = tmp_path / "lib" / "node_modules" / "@openai" / "codex"
    (package / "bin").mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"name": "@openai/codex", "engines": {"node": ">=20"}}))
    cli = package / "bin" / "codex.js"
    cli.write_text("#!/usr/bin/env node\n")
    old_node = tmp_path / "node18" / "node"
    old_node.parent.mkdir()
    old_node.write_text("#!/bin/sh\necho v18.19.0\n")
    old_node.chmod(0o755)
    line = node_mismatch(cli, f"{old_node.parent}:/usr/bin:/bin")
    assert line is not None and str(old_node) in line and "v18.19.0" in line and ">= 20" in line and "PATH" in line
    new_node = tmp_path / "node22" / "node"
    new_node.parent.mkdir()
    new_node.write_text("#!/bin/sh\necho v22.1.0\n")
    new_node.chmod(0o755)
    assert node_mismatch(cli, f"{new_node.parent}:/usr/bin:/bin") is None


def test_the_preflight_names_an_old_node_where_the_package_asks_for_less(tmp_path):
    """Issue #45: codex's package asks for node >=16, so under Node 18 the run's preflight blamed the install
    ("reinstall ...") where `make tools` named the Node; both now hold the CLIs to Node >= 20."""
    from a2rl_bench.agents import LLMDriver, get_agent

    package = tmp_path / "lib" / "node_modules" / "@openai" / "codex"
    (package / "bin").mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"name": "@openai/codex", "engines": {"node": ">=16"}}))
    cli = package / "bin" / "codex.js"
    cli.write_text("#!/usr/bin/env node\n")
    cli.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "codex").symlink_to(cli)
    old_node = tmp_path / "node18" / "node"  # answers its version, and fails on codex's modern syntax
    old_node.parent.mkdir()
    old_node.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo v18.19.0; exit 0; }\n'
                        'echo "SyntaxError: Unexpected token \'??=\'" >&2\nexit 1\n')
    old_node.chmod(0o755)
    agent = get_agent("codex", driver=LLMDriver(model="m", api="openai", api_key="k"))
    line = agent.check(path=f"{tmp_path / 'bin'}:{old_node.parent}:/usr/bin:/bin")
    assert line is not None and str(old_node) in line and "v18.19.0" in line and "Node >= 20" in line, line
    assert "reinstall" not in line and "npm" not in line, line


def _in_bwrap(*mounts: str) -> list[str]:
    if (problem := _bwrap_problem()) is not None:
        pytest.skip(problem)
    return ["bwrap", "--bind", "/", "/", *mounts, "--dev", "/dev", "--proc", "/proc", "--"]


def test_a_read_only_home_is_named_before_prefect_starts(tmp_path):
    """Issue #36: a read-only HOME (no PREFECT_HOME, no A2RL_HOME) ran 883 s of Prefect retries, then blamed
    the load; now one line names HOME and what to do, in seconds."""
    home = tmp_path / "home"
    home.mkdir()
    env = cli_env(tmp_path, HOME=str(home))
    for name in ("PREFECT_HOME", "A2RL_HOME", "XDG_CACHE_HOME"):
        env.pop(name, None)
    results = tmp_path / "out" / "a.duckdb"
    start = time.monotonic()
    proc = a2rl_cli(["run", "--results", str(results)], env, prefix=_in_bwrap("--ro-bind", str(home), str(home)))
    line = assert_one_line(proc, 2, f"HOME {home}", "not writable", "PREFECT_HOME", "A2RL_HOME")
    assert "quieter" not in line and time.monotonic() - start < 60
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["A2RL_HOME", "TMPDIR", "PREFECT_HOME"])
def test_each_unwritable_home_is_one_line_naming_it(tmp_path, which):
    ro = tmp_path / "ro"
    ro.mkdir()
    env = cli_env(tmp_path, **{which: str(ro / "sub")})
    proc = a2rl_cli(["run", "--results", str(tmp_path / "out" / "a.duckdb")], env, prefix=_in_bwrap("--ro-bind", str(ro), str(ro)))
    assert_one_line(proc, 2, f"{which} {ro}", "not writable", f"export {which}=")


def test_a_results_folder_without_room_for_the_run_is_one_line(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    env = cli_env(tmp_path, A2RL_HOME=str(tmp_path / "a2rl-home"))
    proc = a2rl_cli(["run", "--results", str(small / "a.duckdb")], env, prefix=_in_bwrap("--size", str(8 * 1024**2), "--tmpfs", str(small)))
    assert_one_line(proc, 2, "not enough free space", f"--runs-dir {small / 'runs'}", "needed")


FILL_THE_DISK = """
import errno, json, os, sys
from pathlib import Path
import duckdb
from a2rl_bench import workspace
from a2rl_bench.records import RunConfig
from a2rl_bench.run_options import RunOptions
from a2rl_bench.flows.benchmark_run import benchmark_run

small, model = Path(sys.argv[1]), sys.argv[2]
copy = workspace._copy_model

def copy_on_a_disk_that_fills(src, dst):  # the disk fills (for real) while the workspace is built
    with open(small / "filler", "wb") as f:
        try:
            while True:
                f.write(b"x" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    copy(src, dst)

workspace._copy_model = copy_on_a_disk_that_fills
try:
    benchmark_run(RunConfig(base_model=model, val_limit=1, test_limit=1, sandbox="off"),
                  RunOptions(results=small / "a.duckdb"))
except OSError as e:
    print("raised", e.errno)
with duckdb.connect(str(small / "a.duckdb"), read_only=True) as db:
    print(json.dumps(db.execute("SELECT status, error FROM runs").fetchone()))
"""


def test_a_disk_that_fills_during_a_run_ends_its_row_failed_naming_the_path(prefect_harness, tiny_model_dir, tmp_path):
    """Issue #36: on a full disk the run said "recorded as 'failed'" while its row stayed `running`, and the
    message had no path. The store and the run directory share a small file system here that fills for real."""
    small = tmp_path / "small"
    small.mkdir()
    env = cli_env(tmp_path, A2RL_HOME=str(tmp_path / "a2rl-home"), **harness_api_url())
    prefix = _in_bwrap("--size", str(160 * 1024**2), "--tmpfs", str(small))
    proc = subprocess.run([*prefix, sys.executable, "-c", FILL_THE_DISK, str(small), str(tiny_model_dir)], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "raised 28" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    status, error = json.loads(proc.stdout.strip().splitlines()[-1])
    assert status == "failed" and "the disk is full at" in error and str(small) in error, error


# ---- every wait named, with a count that moves (issue #36) ---------------------------------------------------------


def test_the_eta_does_not_jump_by_more_than_2x_once_shown():
    """The baseline's ETA read 13 -> 84 -> 53 -> 23 min; the shown one moves toward new estimates gradually and
    counts down in between."""
    from a2rl_bench.ops.progress import EtaSmoother

    eta = EtaSmoother()
    assert eta(None, now=0.0) is None  # nothing shown before the rate is measured
    shown = [eta(13 * 60, now=0.0)]
    for t, estimate in [(0.5, 84 * 60), (1.0, 84 * 60), (1.5, 53 * 60), (2.0, 23 * 60), (2.5, None), (3.0, 23 * 60)]:
        shown.append(eta(estimate, now=t))
    for a, b in zip(shown, shown[1:]):
        assert 0.5 <= b / a <= 2.0, shown
    assert max(shown) / min(shown) <= 2.0, shown  # over 3 s, well inside 2x
    late = [eta(20 * 60, now=t) for t in range(10, 200, 5)]  # a steady estimate is reached, never overshot
    assert abs(late[-1] - (20 * 60 - 0)) < 20 * 60 * 0.1 and all(0.5 <= b / a <= 2.0 for a, b in zip(late, late[1:]))
    assert eta(None, now=205.0) == pytest.approx(late[-1] - 10.0)  # no estimate: it counts down


def test_counters_never_go_backwards_and_a_phases_next_evaluation_continues_the_count():
    """A final counter read 2/2, then 0/2 (the final pick's evaluation, then each submission's for analysis)."""
    from a2rl_bench.ops.progress import CountView, ItemProgress, RunProgress, Snapshot

    run = RunProgress(run_id="r", harness_dir=Path("."), phase="final_grading")
    view = CountView()

    def shown(items):
        (count,) = view.counts(Snapshot(progress=run, items=items), now=2000.0)
        return count.done, count.total

    final = ItemProgress(what="test", id="a", done=2, total=2, started_at=1000.0, at=1010.0, loaded=True)
    assert shown(final) == (2, 2)
    posthoc = ItemProgress(what="test", id="b", done=0, total=2, started_at=1020.0, at=1020.0, loaded=False)
    assert shown(posthoc) == (2, 4)
    assert shown(posthoc.model_copy(update={"done": 1, "loaded": True})) == (3, 4)
    assert shown(posthoc.model_copy(update={"done": 0})) == (3, 4)  # a rewritten file never lowers what was shown


def test_a_submissions_grading_shows_its_items_as_they_finish(tmp_path):
    """Grading a submission showed "1 queued, 0 graded" for 373 s; now its items count like the baseline's."""
    from a2rl_bench.ops.progress import (
        GRADING_PROGRESS_FILE, ItemProgressWriter, ProgressWriter, read_snapshot, status_line,
    )

    harness = tmp_path / "harness"
    harness.mkdir()
    ProgressWriter("r", harness, budget_s=60).update(phase="agent_session")
    (harness / "ledger.jsonl").write_text(json.dumps({"kind": "submission", "submission_id": 3, "status": "queued"}) + "\n")
    items = ItemProgressWriter(harness / GRADING_PROGRESS_FILE, total=16, what="validation")
    items.begin()
    items.add(5)
    items._write(force=True)
    line = status_line(read_snapshot(harness / "progress.json"))
    assert "grading #3 items 5/16" in line and "1 queued, 0 graded" in line


def test_the_live_display_fits_80_columns_with_its_labels_whole(tmp_path):
    """Labels were cut to "elap…", "base…"; at 80 columns every label is whole and no line is wider."""
    import io

    from rich.console import Console

    from a2rl_bench.cli.display import RunDisplay
    from a2rl_bench.ops.progress import ItemProgressWriter, ProgressWriter, EVAL_PROGRESS_FILE, read_snapshot

    harness = tmp_path / "harness"
    harness.mkdir()
    ProgressWriter("gsm8k-reference-sft-0d4720-7c9ed3c8", harness, budget_s=120).update(
        phase="baseline", baseline_total=48, baseline_split="validation", step="x" * 300)
    items = ItemProgressWriter(harness / EVAL_PROGRESS_FILE, total=16, what="validation")
    items.begin()
    items.add(4)
    items._write(force=True)
    (harness / "agent.log").write_text("[agent] " + "a very long line of the agent " * 20 + "\n")
    out = io.StringIO()
    Console(file=out, width=80).print(RunDisplay(tmp_path / "none")._render(read_snapshot(harness / "progress.json")))
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    labels = [line[:12].strip() for line in lines]
    assert {"run", "phase", "elapsed", "baseline", "agent"} <= set(labels), labels
    assert "4/48 items (validation)" in out.getvalue()


def test_the_finished_baseline_stays_on_the_display_with_its_validation_score_only(tmp_path):
    """After its phase the baseline's count vanished, often before a frame showed it complete; it now stays, with
    the score the agent's submissions must beat. The test split's score is not on screen before the report."""
    import io
    import json

    from rich.console import Console

    from a2rl_bench.cli.display import RunDisplay
    from a2rl_bench.ops.progress import ProgressWriter, read_snapshot

    harness = tmp_path / "harness"
    harness.mkdir()
    writer = ProgressWriter("gsm8k-reference-sft-0d4720-7c9ed3c8", harness, budget_s=120)
    writer.update(phase="baseline", baseline_total=48, baseline_done=0, baseline_split="validation+test")

    def screen() -> str:
        out = io.StringIO()
        Console(file=out, width=80).print(RunDisplay(tmp_path / "none")._render(read_snapshot(harness / "progress.json")))
        return out.getvalue()

    assert "items, done" not in screen()  # still counting
    with (harness / "ledger.jsonl").open("w") as f:
        for seq, (split, score) in enumerate([("validation", 12.5), ("test", 71.875)]):
            f.write(json.dumps({"seq": seq, "kind": "baseline", "run_id": "r", "split": split, "score": score}) + "\n")
    writer.update(phase="agent_session", baseline_done=48, baseline_split=None)
    shown = screen()
    assert "48/48 items, done: validation 12.5" in shown, shown
    assert "71.9" not in shown and "71.8" not in shown
    writer.update(phase="final_grading")
    assert "48/48 items, done: validation 12.5" in screen()


def test_building_a_model_draws_no_progress_bars_over_the_display(tmp_path, capfd):
    """The GGUF conversion's tqdm bars were drawn over the live display and stayed above it."""
    from tqdm.auto import tqdm

    from a2rl_bench.base_models.build import build_once, model_provenance

    def build(out: Path):
        for _ in tqdm(range(50), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        return model_provenance(key="tiny", source="test", label="a test build")

    build_once(tmp_path / "model", build)
    assert "Converting" not in capfd.readouterr().err
    for _ in tqdm(range(3), desc="after the build"):  # bars elsewhere are left alone
        pass
    assert "after the build" in capfd.readouterr().err


def test_set_up_compiles_bytecode_with_a_count_and_no_ignored_error(tmp_path):
    """Set-up printed nothing for 332 s (bytecode), then `make: ... Error 1 (ignored)`, which read as a failure."""
    makefile = (REPO / "Makefile").read_text()
    assert "compileall" not in makefile and "scripts/compile_bytecode.py" in makefile
    assert all(f"set-up {i}/4" in makefile for i in range(1, 5))
    for i in range(30):
        (tmp_path / f"m{i}.py").write_text(f"X = {i}\n")
    (tmp_path / "template.py").write_text("{% if python2 %}print \"x\"{% endif %}\n")  # as some packages ship
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "compile_bytecode.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert "31/31 files done (1 are not Python 3 source" in proc.stdout
    assert len(list((tmp_path / "__pycache__").glob("*.pyc"))) == 30
