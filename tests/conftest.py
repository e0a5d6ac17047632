"""Shared test set-up: an isolated A2RL_HOME and PREFECT_HOME, one Prefect test harness, a tiny model."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

# Set before Prefect or HF are imported anywhere in the test session.
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="a2rl-tests-"))
os.environ.setdefault("PREFECT_HOME", str(_SESSION_TMP / "prefect"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "90"
os.environ["A2RL_HOME"] = str(_SESSION_TMP / "a2rl-home")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["MPLBACKEND"] = "Agg"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# Evaluations in fp32 whatever this CPU's bf16 speed (a2rl_bench.inference.numerics): the suite compares decoding paths
# token for token, which bf16 rounding would make machine-dependent; tests that want bf16 ask for it.
os.environ["A2RL_CPU_EVAL_DTYPE"] = "fp32"
# Several torch processes share 2 cores in tests: busy-waiting OpenMP threads slow them several-fold.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Prefect 3.9 ends each flow run by joining its heartbeat thread, which sleeps in 1 s slices: every flow run in this
# process waited up to a second for it (a trivial flow 1.26 -> 0.52 s; BENCHMARKS.md "Suite wall time, sixteenth
# pass"). a2rl does not use Prefect's flow-run heartbeats (its own leases: docs/scale-out.md), so the flow runs of the
# test process send none; the flow-run processes that workers start keep Prefect's default. (An environment variable
# cannot turn them off: Prefect reads no null from one.)
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings  # noqa: E402

temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}).__enter__()  # for the whole session


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test server for the whole session; request it only in tests that run flows."""
    from prefect.testing.utilities import prefect_test_harness

    from a2rl_bench.ops.load import scaled_timeout

    # 90 s on an idle machine; a loaded one (other jobs on the same cores) needs proportionally longer.
    with prefect_test_harness(server_startup_timeout=int(scaled_timeout(90))):
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A ~100k-parameter Llama with a locally trained BPE tokenizer and a chat template."""
    from tests.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "tiny")


@pytest.fixture(scope="module")
def one_torch_thread():
    """A 100k-parameter model is all per-op overhead: 2 OpenMP threads only add barrier waits, several
    times slower when the 2 cores are shared with other processes (measured 0.39 s vs 0.06 s per call)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path):
    """The tiny model loaded on the CPU (`a2rl_bench.inference.generation.LoadedModel`), once per module."""
    from a2rl_bench.inference.generation import load_model

    return load_model(tiny_model_dir, "cpu")


# The test process ends without Python's finalization. Daemon threads of the harness outlive the tests that
# started them (a run's lease renewer whose test server is gone, grader workers, DuckDB's scan threads over a
# registered frame), and a thread that wakes in C++ code while the interpreter finalizes is unwound by force:
# a fresh checkout's `make test` aborted that way ("FATAL: exception not rethrown") after 1,009 tests passed.
# Every result is reported by then; the exit status stays pytest's.
_exit_status: int | None = None
# The terminal's own stderr, kept before any test runs: where pytest's own failure is told in full, whatever became
# of sys.stderr (CI once ended on an INTERNALERROR whose traceback was cut at the exception, sys.stderr a closed file,
# with no word of the test it happened in).
_real_stderr: int | None = None


def _tell(text: str) -> None:
    if _real_stderr is not None:
        try:
            os.write(_real_stderr, text.encode("utf-8", "replace"))
        except OSError:
            pass


def pytest_configure(config):
    global _real_stderr
    _real_stderr = os.dup(2)  # global capture is suspended between the conftests' loading and the first test


SUITE_NEEDS_BYTES = 3 * 2**30
"""Free space the suite wants in the temporary folder: its session folder (~550 MB of converted models and caches),
pytest's folders (the tiny model, every test's runs) and the runs' own checks of free space."""


def pytest_sessionstart(session):
    """Said first (on the terminal's stderr: `make test` runs quiet, without pytest's header), where a full disk would
    otherwise show up as many unrelated failures (a fresh checkout's run failed tests from 20% on, 407 MiB free)."""
    import shutil

    free = shutil.disk_usage(_SESSION_TMP).free
    if free < SUITE_NEEDS_BYTES:
        _tell(f"warning: {free / 2**30:.1f} GiB free in {_SESSION_TMP.parent}; the suite needs about "
              f"{SUITE_NEEDS_BYTES / 2**30:.0f} GiB there, and tests will fail for want of space\n")


def _machine_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent (user, nice, system, irq, softirq, steal), from /proc/stat: what a
    test costs with the servers and daemons it starts, which its own process's clock does not see."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


_cpu_by_test: dict[str, float] = {}
"""Machine CPU seconds per test (setup, call and teardown): `make test` prints the largest at its end, since the
suite's time on a 2-core machine is bounded by its CPU seconds whatever runs in parallel (BENCHMARKS.md, suite
passes)."""
_wall_by_test: dict[str, float] = {}
"""Wall seconds per test (setup, call and teardown): beside its CPU seconds, the time it left the machine's cores
idle (waits, polls, timeouts), which a shorter wait takes off the suite's wall without a CPU second less."""


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Outside every other hook of a test: an error of pytest's own there (not the test's, which pytest reports)
    ends the session as INTERNALERROR; this names the test it happened in, with the whole traceback. It also
    takes the machine's CPU seconds over the test (`_cpu_by_test`)."""
    import traceback

    before, started = _machine_cpu_s(), time.monotonic()
    try:
        return (yield)
    except BaseException as e:
        if not isinstance(e, (KeyboardInterrupt, pytest.exit.Exception)):  # a stop asked for, not a fault
            _tell(f"\nINTERNALERROR in or after {item.nodeid}:\n{''.join(traceback.format_exception(e))}\n")
        raise
    finally:
        after = _machine_cpu_s()
        _wall_by_test[item.nodeid] = time.monotonic() - started
        if before is not None and after is not None:
            _cpu_by_test[item.nodeid] = after - before


def pytest_terminal_summary(terminalreporter):
    """The tests and files that cost the machine the most CPU seconds (anything else running on it counts too: the
    figures are for a quiet machine's `make test`)."""
    if not _cpu_by_test:
        return
    by_file: dict[str, float] = {}
    for nodeid, seconds in _cpu_by_test.items():
        by_file[nodeid.split("::")[0]] = by_file.get(nodeid.split("::")[0], 0.0) + seconds
    total = sum(_cpu_by_test.values())
    write = terminalreporter.write_line
    write(f"machine CPU seconds over the tests: {total:.0f} in {len(_cpu_by_test)} tests (/proc/stat, whole machine)")
    write("largest files:")
    for name, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:15]:
        write(f"{seconds:9.1f}s cpu  {100 * seconds / total:4.1f}%  {name}")
    write("largest tests:")
    for nodeid, seconds in sorted(_cpu_by_test.items(), key=lambda kv: -kv[1])[:25]:
        write(f"{seconds:9.1f}s cpu  {nodeid}")
    cores = os.cpu_count() or 1
    idle = {nodeid: cores * _wall_by_test[nodeid] - cpu
            for nodeid, cpu in _cpu_by_test.items() if nodeid in _wall_by_test}
    write(f"most core-seconds left idle (cores x wall - machine CPU, {cores} cores; waits rather than work):")
    for nodeid, seconds in sorted(idle.items(), key=lambda kv: -kv[1])[:15]:
        write(f"{seconds:9.1f}s idle  {_wall_by_test[nodeid]:7.1f}s wall  {_cpu_by_test[nodeid]:7.1f}s cpu  {nodeid}")


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _exit_status is not None:
        import sys

        _leave_no_temporaries(config)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:  # a stream a test closed must not cost the others their last lines, nor the exit status
                stream.flush()
            except (ValueError, OSError, AttributeError):
                pass
        os._exit(_exit_status)


def _leave_no_temporaries(config) -> None:
    """What the exit skips, done first: this session's folder (A2RL_HOME with its converted models and evaluation
    cache, PREFECT_HOME: ~550 MB after a whole suite) and pytest's own clean-up of its numbered temporary folders
    (it unlocks this session's and prunes the older ones). Without it every run left both behind: 36 session
    folders and their pytest folders, with the checkouts beside them, filled this machine's disk, and a suite
    then failed for want of space."""
    import shutil

    shutil.rmtree(_SESSION_TMP, ignore_errors=True)
    stack = getattr(getattr(config, "_tmp_path_factory", None), "_exit_stack", None)
    try:
        if stack is not None:
            stack.close()
    except Exception as e:  # noqa: BLE001 - a clean-up that fails must not change the exit status
        _tell(f"pytest's temporary folders were not cleaned up: {type(e).__name__}: {e}\n")
