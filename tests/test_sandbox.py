"""The sandbox's parts: the bubblewrap command line, the environment scrub, the limits, the forwarder, the
quota check and the leak audit. The hostile end-to-end session is in test_redteam.py."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from sandbox_support import needs_bwrap

from a2rl_bench.summary.leak_audit import audit_leaks, hidden_texts
from a2rl_bench.paths import a2rl_home
from a2rl_bench.isolation.sandbox import FORWARDER, Limits, SandboxPolicy, SandboxUnavailable, data_package_paths, sandbox_label, sandbox_mode, workspace_bytes, workspace_over_quota, wrap

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20


@pytest.fixture
def workspace(tmp_path) -> Path:
    ws = tmp_path / "runs" / "r1" / "workspace"
    for sub in ("code", "output", "data", "models/base"):
        (ws / sub).mkdir(parents=True)
    (ws / "data" / "train.jsonl").write_text('{"question": "1+1?"}\n')
    (tmp_path / "runs" / "r1" / "harness").mkdir()
    return ws


def _child(argv: list[str]) -> list[str]:
    """The command line the shim starts (bubblewrap's, or the launcher's in the fallback)."""
    assert argv[3].endswith("a2rl_bench/isolation/sandbox.py") and argv[4] == "--shim"
    return json.loads(argv[5])["child"]


def _pairs(args: list[str], flag: str) -> list[tuple[str, str]]:
    return [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == flag]


# -- the command line -----------------------------------------------------------------------------------------
@needs_bwrap
def test_wrap_binds_the_workspace_rw_and_its_inputs_read_only(workspace):
    policy = SandboxPolicy(workspace, forward_ports=(8123,))
    args = _child(wrap(["python", "code/agent.py"], {}, policy)[0])
    assert {"--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net"} <= set(args) or (
        "--unshare-all" in args)
    assert (str(workspace), str(workspace)) in _pairs(args, "--bind")
    ro = _pairs(args, "--ro-bind")
    for sub in ("models/base", "data"):
        assert (str(workspace / sub), str(workspace / sub)) in ro
        assert args.index(str(workspace / sub)) > args.index(str(workspace))  # mounted over the rw bind
    assert args[args.index("--chdir") + 1] == str(workspace)
    assert args[-2:] == ["python", "code/agent.py"]
    assert "--forward" in args and "8123=/run/a2rl/p8123.sock" in args


@needs_bwrap
def test_wrap_shows_nothing_of_the_harness_the_caches_or_the_repo(workspace):
    args = _child(wrap(["true"], {}, SandboxPolicy(workspace))[0])
    sources = {Path(s) for flag in ("--bind", "--ro-bind", "--dev-bind-try") for s, _ in _pairs(args, flag)}
    masked = {Path(args[i + 1]) for i, a in enumerate(args) if a == "--tmpfs"}
    for hidden in (workspace.parent / "harness", workspace.parent.parent / "r2", a2rl_home(), REPO):
        exposed = [s for s in sources if s == hidden or s in hidden.parents]
        assert not exposed or hidden in masked, (hidden, exposed)
    assert not {Path("/"), Path("/etc"), Path("/root"), Path("/home"), Path("/tmp")} & sources


@needs_bwrap
def test_wrap_masks_the_task_data_wheels_in_site_packages(workspace):
    wheels = [p for p in data_package_paths() if p.is_dir()]
    if not wheels:
        pytest.skip("no task-data wheel installed")
    args = _child(wrap(["true"], {}, SandboxPolicy(workspace))[0])
    masked = {args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"}
    assert {str(p) for p in wheels} <= masked


@needs_bwrap
def test_wrap_refuses_a_read_only_input_swapped_for_a_link(workspace):
    """An agent that replaced models/ in an earlier session of the run must not get a link's target bound in."""
    (workspace / "models" / "base").rmdir()
    (workspace / "models" / "base").symlink_to("/")
    with pytest.raises(SandboxUnavailable, match="tampered"):
        wrap(["true"], {}, SandboxPolicy(workspace))


def test_every_task_data_wheel_is_masked():
    from a2rl_bench.isolation.sandbox import DATA_DISTRIBUTIONS, data_distributions

    reqs = (REPO / "requirements-data.txt").read_text().splitlines()
    names = {line.split("#")[0].split("==")[0].strip() for line in reqs} - {""}
    assert names <= set(data_distributions())
    missing = names - set(DATA_DISTRIBUTIONS)  # covered here through the file; add them for installed harnesses
    if missing:
        pytest.skip(f"add to DATA_DISTRIBUTIONS (installed harnesses have no requirements-data.txt): {missing}")


@needs_bwrap
def test_wrap_scrubs_secrets_and_keeps_the_token_off_the_command_line(workspace):
    env = {"PATH": "/usr/bin", "GRADING_TOKEN": "tok-123", "ANTHROPIC_API_KEY": "sk-x", "A2RL_HARNESS_API_KEY": "k",
           "A2RL_HOME": "/secret", "TASK": "gsm8k"}  # fmt: skip
    argv, clean = wrap(["true"], env, SandboxPolicy(workspace))
    assert clean == {"PATH": "/usr/bin", "GRADING_TOKEN": "tok-123", "TASK": "gsm8k"}
    assert not any("tok-123" in a or "sk-x" in a for a in argv)
    _, kept = wrap(["true"], env, SandboxPolicy(workspace, env_keep=("ANTHROPIC_API_KEY",)))
    assert kept["ANTHROPIC_API_KEY"] == "sk-x" and "A2RL_HARNESS_API_KEY" not in kept


@needs_bwrap
def test_wrap_applies_the_limits_and_gpus(workspace):
    limits = Limits(nproc=100, address_space_bytes=8 << 30, file_size_bytes=MiB, open_files=512, core_bytes=0)
    args = _child(wrap(["true"], {}, SandboxPolicy(workspace, limits=limits, gpus=("1",)))[0])
    for spec in ("nproc=100", f"as={8 << 30}", f"fsize={MiB}", "nofile=512", "core=0"):
        assert spec in args
    assert ("/dev/nvidia1", "/dev/nvidia1") in _pairs(args, "--dev-bind-try")
    assert ("/dev/nvidia0", "/dev/nvidia0") not in _pairs(args, "--dev-bind-try")
    setenv = {args[i + 1]: args[i + 2] for i, a in enumerate(args) if a == "--setenv"}
    # Only /dev/nvidia1 exists inside, and CUDA calls it device 0 (seen on a 2-GPU host).
    assert setenv["CUDA_VISIBLE_DEVICES"] == "0" and setenv["TMPDIR"] == "/tmp"
    assert _child(wrap(["true"], {}, SandboxPolicy(workspace))[0]).count("--dev-bind-try") == 0


def test_without_bubblewrap_wrap_refuses_unless_the_weaker_fallback_is_allowed(workspace):
    with pytest.raises(SandboxUnavailable, match="allow_unsandboxed"):
        wrap(["true"], {}, SandboxPolicy(workspace, bwrap="no-such-bwrap"))
    policy = SandboxPolicy(workspace, bwrap="no-such-bwrap", allow_unsandboxed=True, limits=Limits(open_files=123),
                           status_path=workspace.parent / "harness" / "sandbox.json")  # fmt: skip
    assert sandbox_mode(policy) == "none" and sandbox_label(policy).startswith("none (weaker)")
    argv, env = wrap(["sh", "-c", "ulimit -n; echo $CUDA_VISIBLE_DEVICES-"], {"PATH": "/usr/bin:/bin"}, policy)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == ["123", "-"], out.stderr
    assert json.loads(policy.status_path.read_text())["mode"] == "none"


# -- running sandboxed ----------------------------------------------------------------------------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"pong")

    def log_message(self, *args):
        pass


@pytest.fixture
def host_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


AGENT_WITH_LAST_CALL = """
import os, signal, sys, time, urllib.request
url = "http://127.0.0.1:%d/"
def last_call(signum, frame):
    # The signal may land while the main code is still inside print(): writing through sys.stdout here would be
    # a reentrant call into its BufferedWriter. A raw write on fd 1 and os._exit make the handler deterministic.
    os.write(1, b"last call " + urllib.request.urlopen(url, timeout=5).read() + b"\\n")
    os._exit(3)
signal.signal(signal.SIGTERM, last_call)
print("uid", os.getuid(), "sees", sorted(os.listdir("..")), flush=True)
print("first call", urllib.request.urlopen(url, timeout=5).read().decode(), flush=True)
time.sleep(60)
"""


@needs_bwrap
def test_sigterm_reaches_the_agent_which_can_still_reach_the_grader(workspace, host_server):
    policy = SandboxPolicy(workspace, forward_ports=(host_server,))
    argv, env = wrap([sys.executable, "-c", AGENT_WITH_LAST_CALL % host_server], {"PATH": "/usr/bin:/bin"}, policy)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    lines = [proc.stdout.readline() for _ in range(2)]
    os.killpg(proc.pid, signal.SIGTERM)  # what run_agent does at the end of the budget
    rest = proc.stdout.read()
    assert proc.wait(timeout=20) == 3
    assert lines[0].split()[3:] == ["['workspace']"]  # no harness dir, no other run next to it
    if sandbox_mode(policy) == "bwrap-root":
        assert lines[0].split()[1] != "0"
    assert lines[1].strip() == "first call pong" and "last call pong" in rest


@needs_bwrap
def test_import_torch_works_inside_the_sandbox(workspace):
    argv, env = wrap([sys.executable, "-c", "import torch; print(torch.ones(2).sum().item())"],
                     {"PATH": "/usr/bin:/bin"}, SandboxPolicy(workspace))  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "2.0", out.stderr[-2000:]


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists() or not shutil.which("setpriv"),
                    reason="needs root (to become another user), setpriv and a system /usr/bin/python3")
def test_an_unprivileged_harness_gets_a_user_namespace_sandbox():
    """The same wrap() from a non-root harness: bwrap-user mode, NPROC bound, no nested user namespaces."""
    tmp_path = Path(tempfile.mkdtemp(prefix="a2rl-userns-"))  # pytest's tmp dirs are closed to other users
    try:
        _run_as_nobody(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _run_as_nobody(tmp_path: Path) -> None:
    # A copy of the package where the other user can read it: a checkout under a private directory (a fresh
    # clone in a 0700 temporary folder) is not, and its import error is not what this test is about.
    src = tmp_path / "src"
    shutil.copytree(REPO / "a2rl_bench", src / "a2rl_bench", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in [src, *(p for p in src.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    for file in (p for p in src.rglob("*") if p.is_file()):
        file.chmod(0o644)
    script = f"""
import subprocess, sys
from pathlib import Path
sys.path.insert(0, {str(src)!r})
from a2rl_bench.isolation.sandbox import Limits, SandboxPolicy, sandbox_mode, wrap
ws = Path({str(tmp_path)!r}) / "ws"
(ws / "data").mkdir(parents=True)
policy = SandboxPolicy(ws, limits=Limits(nproc=32))
print(sandbox_mode(policy), flush=True)
cmd = "touch data/x 2>/dev/null || echo ro; unshare --user true 2>/dev/null || echo no-userns; " \\
      "(for i in $(seq 64); do sleep 2 & done) 2>/dev/null || echo forks-stopped"
argv, env = wrap(["sh", "-c", cmd], {{"PATH": "/usr/bin:/bin"}}, policy)
print(subprocess.run(argv, env=env, capture_output=True, text=True).stdout, flush=True)
"""
    tmp_path.chmod(0o777)
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                          script], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "A2RL_HOME": str(tmp_path / "home")})
    if "bwrap-user" not in out.stdout:
        pytest.skip(f"unprivileged user namespaces are not available here: {out.stdout} {out.stderr[-300:]}")
    assert out.stdout.split()[1:] == ["ro", "no-userns", "forks-stopped"], out.stderr


# -- the forwarder ----------------------------------------------------------------------------------------------
def test_forwarder_carries_http_to_a_uvicorn_unix_socket_server(tmp_path):
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    sock = Path(tempfile.mkdtemp(prefix="a2rl-fwd-")) / "grader.sock"
    server = uvicorn.Server(uvicorn.Config(app, uds=str(sock), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fetch = f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/health', timeout=5).read().decode())"
    client = ("import time, subprocess, sys\n"
              "for _ in range(100):\n"
              f"    r = subprocess.run([sys.executable, '-c', {fetch!r}], capture_output=True, text=True)\n"
              "    if r.returncode == 0: print(r.stdout, end=''); break\n"
              "    time.sleep(0.05)\n")  # fmt: skip
    try:
        out = subprocess.run([sys.executable, "-I", "-S", str(FORWARDER), "--forward", f"{port}={sock}", "--",
                              sys.executable, "-c", client], capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        shutil.rmtree(sock.parent, ignore_errors=True)
    assert json.loads(out.stdout) == {"status": "ok"}, out.stderr


def test_forwarder_applies_rlimits_and_returns_the_exit_code():
    out = subprocess.run([sys.executable, "-I", "-S", str(FORWARDER), "--rlimit", "nofile=77", "--rlimit", "core=0",
                          "--", "sh", "-c", "ulimit -n; ulimit -c; exit 5"], capture_output=True, text=True)
    assert out.stdout.split() == ["77", "0"] and out.returncode == 5


# -- quota ----------------------------------------------------------------------------------------------------
def test_quota_counts_files_once_at_their_larger_size_and_skips_excluded_dirs(tmp_path):
    (tmp_path / "a.bin").write_bytes(os.urandom(2 * MiB))
    os.link(tmp_path / "a.bin", tmp_path / "a-link.bin")  # hard link: counted once
    (tmp_path / "sym").symlink_to("/usr")  # not followed
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "w.bin").write_bytes(os.urandom(4 * MiB))
    used = workspace_bytes(tmp_path, exclude=(tmp_path / "base",))
    assert 2 * MiB <= used < 3 * MiB
    assert workspace_over_quota(tmp_path, 1 * MiB, exclude=(tmp_path / "base",))
    assert not workspace_over_quota(tmp_path, 3 * MiB, exclude=(tmp_path / "base",))
    assert workspace_over_quota(tmp_path, 3 * MiB)  # the excluded 4 MiB count when not excluded
    # A sparse file occupies almost nothing, but every copy of it (a submission snapshot) is its full size: it
    # counts at its apparent size (issue 24: 0.9 MiB counted became 4 GiB in snapshots).
    with open(tmp_path / "sparse.bin", "wb") as f:
        f.truncate(1 << 30)
    assert workspace_bytes(tmp_path, exclude=(tmp_path / "base",)) >= (1 << 30) + 2 * MiB
    assert workspace_over_quota(tmp_path, 512 * MiB, exclude=(tmp_path / "base",))


# -- leak audit -----------------------------------------------------------------------------------------------
HIDDEN = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How "
                 "much did she earn?"},
    {"question": "What is the capital of Burkina Faso today?"},  # shorter than 13 tokens: matched whole
]


def test_leak_audit_finds_planted_items_in_the_workspace_and_the_transcript(workspace, tmp_path):
    items = hidden_texts(HIDDEN)
    (workspace / "code" / "train.py").write_text(
        "EXTRA = ['weng earns $12 AN HOUR for babysitting yesterday she just did 50 minutes of babysitting']\n")
    (workspace / "output" / "notes.txt").write_text("q: what is the capital of burkina faso today\n")
    (workspace / "output" / "model.safetensors").write_bytes(items[0].encode())  # not tensors: text, read
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text(json.dumps({"role": "tool", "content": "found: " + items[0]}) + "\n")
    report = audit_leaks(workspace, [transcript], items)
    assert report.leaked_items == 3 and not report.clean
    found = {(h.item, Path(h.path).name, h.kind) for h in report.examples}
    assert found == {(0, "transcript.jsonl", "ngram"), (1, "train.py", "ngram"), (2, "notes.txt", "exact")}
    assert report.files_skipped == 0 and report.hits_by_path[str(transcript)] == 1
    assert report.hits_by_path[str(workspace / "output" / "model.safetensors")] == 1
    assert report.verdict == "found"


def test_leak_audit_of_a_clean_workspace_is_clean(workspace, tmp_path):
    (workspace / "code" / "train.py").write_text("print('training on data/train.jsonl')\n" * 100)
    report = audit_leaks(workspace, [tmp_path / "missing.jsonl"], hidden_texts(HIDDEN))
    assert report.clean and report.leaked_items == 0 and report.examples == []
    assert report.files_scanned == 2 and not report.truncated  # train.py and data/train.jsonl


def test_leak_audit_is_bounded_on_large_workspaces_and_then_says_incomplete(workspace):
    """Every file is read whole, whatever its size; a budget that runs out makes the verdict "incomplete",
    never "not found" (issue 24: a flood first and a hidden item later was reported clean)."""
    (workspace / "output" / "huge.txt").write_text("x " * MiB)
    report = audit_leaks(workspace, [], hidden_texts(HIDDEN))
    assert report.files_skipped == 0 and not report.truncated and report.verdict == "not found" and report.clean
    (workspace / "output" / "huge.txt").unlink()
    for i in range(5):
        (workspace / "code" / f"f{i}.txt").write_text(f"file {i} " * 10_000)
    report = audit_leaks(workspace, [], hidden_texts(HIDDEN), max_total_bytes=150_000)
    assert report.truncated and report.files_scanned < 6 and report.files_skipped >= 2
    assert report.verdict == "incomplete" and not report.clean and "budget" in report.unread[0]


def test_policy_round_trips_through_json_for_harness_side_runners(workspace):
    from a2rl_bench.isolation.sandbox import describe, policy_from_dict

    policy = SandboxPolicy(workspace, forward_ports=(8123, 9000), gpus=("0", "1"), limits=Limits(nproc=64),
                           extra_ro=(Path("/opt/tools"),), env_keep=("ANTHROPIC_API_KEY",),
                           status_path=workspace.parent / "harness" / "sandbox.json")  # fmt: skip
    assert policy_from_dict(json.loads(json.dumps(describe(policy)))) == policy


def test_leak_audit_skips_what_the_harness_provided(tmp_path):
    from a2rl_bench.summary.leak_audit import audit_leaks

    hidden = "A farmer has seventeen sheep and all but nine run away; how many sheep does the farmer have left now"
    (tmp_path / "data").mkdir()
    (tmp_path / "code").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(hidden)  # provided input, checked at data build time
    assert audit_leaks(tmp_path, [], [hidden], exclude=("data",)).leaked_items == 0
    (tmp_path / "code" / "notes.txt").write_text("copied: " + hidden)
    assert audit_leaks(tmp_path, [], [hidden], exclude=("data",)).leaked_items == 1


@needs_bwrap
def test_read_only_binds_under_tmp_stay_visible(workspace, tmp_path):
    """A checkout and its venv under /tmp (a fresh clone, a CI folder) must not vanish under the empty /tmp."""
    tool = tmp_path / "checkout" / ".venv" / "bin"
    tool.mkdir(parents=True)
    (tool / "marker.txt").write_text("visible")
    argv, env = wrap(["cat", str(tool / "marker.txt")], {"PATH": "/usr/bin:/bin"},
                     SandboxPolicy(workspace, extra_ro=(tool.parent,)))  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "visible", out.stderr[-2000:]
