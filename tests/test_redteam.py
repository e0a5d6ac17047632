"""Red team: a scripted hostile agent (tests/redteam_agent.py) runs in the real sandbox, started by the real
`run_agent`, against a real grading server; every cheating, spying or harming attempt must fail.

One session runs all attempts (module fixture); each attempt is then one test. A second, short session fills
the disk with many files until the workspace quota stops it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from a2rl.inference.evaluation import EvalSpec
from a2rl.grading import BudgetClock, GradingContext, GradingServer, GradingService, Ledger
from a2rl.paths import a2rl_home
from a2rl.records import EvalResult, LedgerEntry, RunConfig
from a2rl.isolation.sandbox import Limits, SandboxPolicy, agent_uid, sandbox_mode, wrap
from a2rl.workspace import RunPaths
from agents.base import Agent, AgentEnv, agent_environment, run_agent
from benchmarks import get_task
from tests.redteam_agent import ATTEMPTS, QUOTA_ATTEMPT
from tests.sandbox_support import needs_bwrap

AGENT_SCRIPT = Path(__file__).with_name("redteam_agent.py")
CANARY = f"REDTEAM-CANARY-{secrets.token_hex(4)}"
FAKE_KEY = f"sk-ant-redteam-{secrets.token_hex(8)}"
MiB = 1 << 20


pytestmark = needs_bwrap


class DoneClock(BudgetClock):
    """The budget runs out early once the agent says it has finished its attempts (saves the test's time)."""

    def __init__(self, budget_s: float, done: Path):
        super().__init__(budget_s)
        self.done = done

    @property
    def expired(self) -> bool:
        return super().expired or self.done.exists()


class HostileAgent(Agent):
    id = "redteam"

    def __init__(self, policy: SandboxPolicy, args: list[str]):
        self.policy, self.args = policy, args
        self.env: AgentEnv | None = None

    def install(self, workspace: Path) -> None:
        shutil.copy2(AGENT_SCRIPT, workspace / "code" / AGENT_SCRIPT.name)

    def command(self, workspace: Path) -> list[str]:
        # The integration proposed for run_agent: the agent's command line, wrapped.
        cmd = [sys.executable, f"code/{AGENT_SCRIPT.name}", *self.args]
        return wrap(cmd, agent_environment(self.env), self.policy)[0]


@dataclass
class Session:
    mode: str
    paths: RunPaths
    policy: SandboxPolicy
    attempts: dict[str, dict]
    started: list[str]
    ledger_before: bytes
    ledger_after: bytes
    health_after: int
    budget_after: int
    decoy_connections: int
    survivors: list[str]
    agent_uid_processes: list[str]
    status: dict | None
    ended_by: str


def _constant(model_dir: Path, weights_hash: str, spec: EvalSpec, device=None) -> EvalResult:
    return EvalResult(task=spec.task, split=spec.split, score=50.0, n=4, n_correct=2, evaluator_id="constant",
                      weights_hash=weights_hash)  # fmt: skip


def _make_run(root: Path, run_id: str, tiny_model_dir: Path) -> RunPaths:
    paths = RunPaths.for_run(root / "runs", run_id)
    paths.create()
    ws = paths.workspace
    (ws / "description.md").write_text("Solve grade-school maths.\n")
    (ws / "instructions.md").write_text("Submit checkpoints to $GRADING_SERVER_URL.\n")
    (ws / "data" / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    (ws / "models" / "base").mkdir(exist_ok=True)
    for f in tiny_model_dir.iterdir():
        if f.is_file():
            shutil.copy2(f, ws / "models" / "base" / f.name)
            (ws / "models" / "base" / f.name).chmod(0o444)
    return paths


def _plant_hidden_set() -> Path:
    """A fake hidden test set laid out as `prepare()` lays out the real ones (A2RL_HOME is per test session), under
    a task id of its own: planted over gsm8k's, it replaced the hidden items every later test of the session graded."""
    private = a2rl_home() / "task-data" / "redteam-planted" / "offline-v1" / "private"
    private.mkdir(parents=True, exist_ok=True)
    (private / "test.jsonl").write_text(json.dumps({"question": f"What is {CANARY}?", "answer": "42"}) + "\n")
    return private / "test.jsonl"


def _processes(match) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if match(entry):
                    cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")[:100]
                    found.append(f"{entry.name}: {cmdline!r}")
            except OSError:
                continue
    return found


def _decoy_listener() -> tuple[socket.socket, list]:
    """A host loopback port the sandbox must not reach (it is not forwarded)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.settimeout(0.2)
    hits: list = []

    def accept() -> None:
        while sock.fileno() != -1:
            try:
                conn, _ = sock.accept()
                hits.append(1)
                conn.close()
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    return sock, hits


def _run_session(root: Path, run_id: str, tiny_model_dir: Path, limits: Limits, quota: int | None,
                 agent_args: list[str], budget_s: float = 240.0) -> Session:  # fmt: skip
    paths = _make_run(root, run_id, tiny_model_dir)
    secret = _plant_hidden_set()
    os.environ["ANTHROPIC_API_KEY"] = FAKE_KEY  # as the harness of an LLM agent would hold it
    decoy, decoy_hits = _decoy_listener()
    nonce = secrets.token_hex(4)
    service = GradingService(
        GradingContext(run_id, RunConfig(max_submissions=3), paths.workspace, paths.harness_dir, {"validation": 10.0}),
        BudgetClock(budget_s),
        evaluate=_constant,
    )
    try:
        with GradingServer(service, request_log=paths.harness_dir / "requests.jsonl") as server:
            service.record_event("session-start", url=server.url)
            ledger_before = (paths.harness_dir / "ledger.jsonl").read_bytes()
            policy = SandboxPolicy.for_grader(
                paths.workspace, server.url, limits=limits, max_workspace_bytes=quota, quota_check_s=0.2,
                tmp_bytes=32 * MiB, shm_bytes=16 * MiB, status_path=paths.harness_dir / "sandbox.json",
            )  # fmt: skip
            args = ["--log", "redteam.jsonl", "--canary", CANARY, "--secret-path", str(secret),
                    "--grader-pid", str(os.getpid()), "--decoy-port", str(decoy.getsockname()[1]),
                    "--nonce", nonce, "--fill-limit", str(2 << 30), *agent_args]  # fmt: skip
            agent = HostileAgent(policy, args)
            env = AgentEnv("gsm8k", "tiny", paths.workspace, server.url, server.token, seed=0)
            agent.env = env
            agent.install(paths.workspace)
            clock = DoneClock(budget_s, paths.workspace / "redteam.jsonl.done")
            outcome = run_agent(agent, env, clock, paths.harness_dir / "agent.log", grace_s=2.0)
            health = httpx.get(f"{server.url}/health").status_code
            budget = httpx.get(f"{server.url}/budget", headers={"Authorization": f"Bearer {server.token}"}).status_code
    finally:
        service.close(drain_timeout_s=5)
        os.environ.pop("ANTHROPIC_API_KEY", None)
        decoy.close()
    uid = agent_uid(policy)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _processes(lambda e: e.stat().st_uid == uid):
        time.sleep(0.1)  # the kernel tears the PID namespace down asynchronously
    log = [json.loads(line) for line in (paths.workspace / "redteam.jsonl").read_text().splitlines()]
    status_file = paths.harness_dir / "sandbox.json"
    return Session(
        mode=sandbox_mode(policy),
        paths=paths,
        policy=policy,
        attempts={r["attempt"]: r for r in log if "blocked" in r},
        started=[r["attempt"] for r in log if r.get("started")],
        ledger_before=ledger_before,
        ledger_after=(paths.harness_dir / "ledger.jsonl").read_bytes(),
        health_after=health,
        budget_after=budget,
        decoy_connections=len(decoy_hits),
        survivors=_processes(lambda e: f"redteam-survivor-{nonce}".encode() in (e / "cmdline").read_bytes()),
        agent_uid_processes=_processes(lambda e: e.stat().st_uid == uid),
        status=json.loads(status_file.read_text()) if status_file.exists() else None,
        ended_by=outcome.ended_by,
    )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, tiny_model_dir) -> Session:
    root = tmp_path_factory.mktemp("redteam")
    other = root / "runs" / "other-run"
    (other / "workspace").mkdir(parents=True)
    (other / "harness").mkdir()
    (other / "workspace" / "secret.txt").write_text(CANARY)
    (other / "harness" / "ledger.jsonl").write_text("{}\n")
    limits = Limits(nproc=256, file_size_bytes=64 * MiB)
    session = _run_session(root, "redteam-run", tiny_model_dir, limits, quota=1 << 30,
                           agent_args=["--fork-limit", "10000", "--then-linger"])  # fmt: skip
    yield session
    shutil.rmtree(root, ignore_errors=True)


# Found by this red team and fixed in the grader (checkpoints with symbolic links are refused).
KNOWN_GAPS: dict = {}


@pytest.mark.parametrize("attempt", [pytest.param(a, marks=KNOWN_GAPS.get(a, ())) for a in ATTEMPTS
                                     if not a.startswith("control_")])  # fmt: skip
def test_hostile_attempt_is_blocked(hostile: Session, attempt: str) -> None:
    assert attempt in hostile.attempts, f"{attempt} never finished (started: {attempt in hostile.started})"
    record = hostile.attempts[attempt]
    assert record["blocked"], f"{attempt} got through: {record['detail']}"


@pytest.mark.parametrize("attempt", [a for a in ATTEMPTS if a.startswith("control_")])
def test_control_attempt_succeeds_so_the_blocks_mean_something(hostile: Session, attempt: str) -> None:
    record = hostile.attempts[attempt]
    assert not record["blocked"], record["detail"]


def test_hostile_session_runs_in_bubblewrap_and_is_stopped_by_the_budget(hostile: Session) -> None:
    assert hostile.mode in ("bwrap-root", "bwrap-user")
    assert hostile.ended_by == "budget"  # it ignored SIGTERM and was killed after the grace period


def test_ledger_verifies_and_is_untouched_by_the_agent(hostile: Session) -> None:
    """Only the grading service wrote to it, and only for what came through the API."""
    assert hostile.ledger_after.startswith(hostile.ledger_before)
    entries = Ledger(hostile.paths.harness_dir / "ledger.jsonl").entries()
    added = entries[hostile.ledger_before.count(b"\n") :]
    # The one submission the grader accepts today is the symlinked checkpoint (KNOWN_GAPS); nothing else.
    assert all(e.kind == "submission" and e.model_path == "output/linked" for e in added), added


def test_no_grader_response_carries_hidden_content(hostile: Session) -> None:
    assert "canary in a response: False" in hostile.attempts["submit_symlinked_file_in_checkpoint"]["detail"]


def test_nothing_of_the_agent_survives_the_kill(hostile: Session) -> None:
    assert hostile.survivors == []
    assert hostile.agent_uid_processes == []


def test_grader_is_still_healthy_after_the_session(hostile: Session) -> None:
    assert hostile.health_after == 200 and hostile.budget_after == 200


def test_unforwarded_host_port_saw_no_connection(hostile: Session) -> None:
    assert hostile.decoy_connections == 0


def test_base_model_and_data_are_intact(hostile: Session, tiny_model_dir: Path) -> None:
    ws = hostile.paths.workspace
    for f in tiny_model_dir.iterdir():
        if f.is_file():
            assert (ws / "models" / "base" / f.name).read_bytes() == f.read_bytes()
    assert json.loads((ws / "data" / "train.jsonl").read_text())["question"] == "1+1?"


def test_many_files_filling_the_disk_are_stopped_by_the_quota(tmp_path, tiny_model_dir) -> None:
    session = _run_session(tmp_path, "quota-run", tiny_model_dir, Limits(file_size_bytes=64 * MiB), quota=96 * MiB,
                           agent_args=["--only", QUOTA_ATTEMPT], budget_s=60)  # fmt: skip
    assert session.status is not None and session.status["ended_by"] == "quota", session.status
    assert QUOTA_ATTEMPT not in session.attempts  # stopped mid-attempt: it never got to report success
    progress = [json.loads(line).get("progress_bytes", 0)
                for line in (session.paths.workspace / "redteam.jsonl").read_text().splitlines()]  # fmt: skip
    assert max(progress) < 2 << 30
    assert session.agent_uid_processes == []


def test_reference_agent_trains_and_submits_inside_the_sandbox(tmp_path, tiny_model_dir, monkeypatch):
    """The sandbox is no use if it breaks honest agents: TRL training, tokenizers, HTTP submission all work."""
    from agents.reference_sft.adapter import ReferenceSFT

    for key, value in {"A2RL_SFT_MAX_STEPS": "2", "A2RL_SFT_BATCH_SIZE": "2", "A2RL_SFT_MAX_LENGTH": "128",
                       "A2RL_SFT_TRAIN_S": "20", "A2RL_SFT_LR": "5e-3"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    paths = _make_run(tmp_path, "reference-run", tiny_model_dir)
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(16)]
    (paths.workspace / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    service = GradingService(
        GradingContext("reference-run", RunConfig(max_submissions=1), paths.workspace, paths.harness_dir, {}),
        BudgetClock(90),
        evaluate=_constant,
    )
    agent = ReferenceSFT()
    agent.install(paths.workspace)
    with GradingServer(service) as server:
        env = AgentEnv("gsm8k", "tiny", paths.workspace, server.url, server.token, seed=0)
        policy = SandboxPolicy.for_grader(paths.workspace, server.url, status_path=paths.harness_dir / "sandbox.json")

        class Sandboxed(ReferenceSFT):
            def command(self, workspace: Path) -> list[str]:
                return wrap(super().command(workspace), agent_environment(env), policy)[0]

        outcome = run_agent(Sandboxed(), env, BudgetClock(90), paths.harness_dir / "agent.log", grace_s=10)
        service.close(drain_timeout_s=30)
    log = (paths.harness_dir / "agent.log").read_text()
    assert outcome.ended_by == "exited" and outcome.exit_code == 0, log[-3000:]
    assert [e.status for e in service.submissions()] == ["scored"], log[-3000:]
    assert json.loads((paths.harness_dir / "sandbox.json").read_text())["mode"] in ("bwrap-root", "bwrap-user")


# -- one hostile case per integrity class, straight against the real server (issue 13) -----------------------
def _served(tmp_path: Path, tiny_model_dir: Path, evaluate=_constant, **config):
    paths = _make_run(tmp_path, "integrity-run", tiny_model_dir)
    shutil.copytree(tiny_model_dir, paths.workspace / "output" / "honest")
    from a2rl.store.results import ResultsStore

    store = ResultsStore(tmp_path / "results.duckdb")
    ctx = GradingContext("integrity-run", RunConfig(**{"max_submissions": 4, "val_limit": 2, **config}),
                         paths.workspace, paths.harness_dir, {"validation": 10.0}, base_model_dir=tiny_model_dir,
                         ledger_anchor=store.ledger_anchor("integrity-run"), task=get_task("gsm8k"))  # fmt: skip
    service = GradingService(ctx, BudgetClock(600), evaluate=evaluate)
    return paths, store, service


def _still_healthy(server: GradingServer) -> None:
    """The service answers and grades an honest submission after the attack."""
    auth = {"Authorization": f"Bearer {server.token}"}
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    body = {"model_path": "output/honest", "wait": True}
    r = httpx.post(f"{server.url}/submit", json=body, headers=auth, timeout=300)
    assert r.status_code == 200 and r.json()["status"] == "scored", r.text


def test_a_chat_template_cannot_carry_hidden_items_out(tmp_path, tiny_model_dir):
    """Class 1: a template that raises with the hidden prompt. Grading renders with the base model's template
    (harness copy), so the evaluation scores; no response carries any hidden item's text."""
    from a2rl.inference.evaluation import evaluate_cached

    task = get_task("gsm8k")
    task.prepare("offline")
    hidden = [item["question"][:40] for item in task.load_split("offline", "validation", 2)]
    paths, _, service = _served(tmp_path, tiny_model_dir, evaluate=evaluate_cached)
    evil = paths.workspace / "output" / "evil"
    shutil.copytree(tiny_model_dir, evil)
    template = "{{ raise_exception('LEAK:' + messages[-1].content) }}"
    cfg = json.loads((evil / "tokenizer_config.json").read_text())
    (evil / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    (evil / "chat_template.jinja").write_text(template)
    (evil / "generation_config.json").write_text(json.dumps({"max_new_tokens": 1}))
    with GradingServer(service) as server:
        auth = {"Authorization": f"Bearer {server.token}"}
        r = httpx.post(f"{server.url}/submit", json={"model_path": "output/evil", "wait": True}, headers=auth,
                       timeout=300)  # fmt: skip
        bodies = r.text + "".join(httpx.get(f"{server.url}{route}", headers=auth).text
                                  for route in ("/submissions", "/best", "/budget"))  # fmt: skip
        assert r.json()["status"] == "scored", r.text  # the agent's template never ran
        assert not any(q in bodies for q in hidden) and "LEAK:" not in bodies
        snapshot = paths.harness_dir / "snapshots" / "s1"
        base_config = (tiny_model_dir / "tokenizer_config.json").read_bytes()
        assert (snapshot / "tokenizer_config.json").read_bytes() == base_config
        texts = [f.read_text(errors="replace") for f in snapshot.iterdir() if f.suffix != ".safetensors"]
        assert not any("LEAK" in t for t in texts)
        _still_healthy(server)
    service.close(30)


def test_fifo_checkpoints_answer_4xx_at_once_and_block_nothing(tmp_path, tiny_model_dir):
    """Class 2: FIFOs named model.safetensors and config.json, sixty requests at once (more than the server's
    worker threads): each answers 4xx at once, /health stays up, an honest submission is still graded."""
    from concurrent.futures import ThreadPoolExecutor

    paths, _, service = _served(tmp_path, tiny_model_dir)
    fifo = paths.workspace / "output" / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")
    os.mkfifo(fifo / "model.safetensors")
    with GradingServer(service) as server:
        auth = {"Authorization": f"Bearer {server.token}"}

        def attack(i: int) -> int:
            route = "/validate" if i % 2 else "/submit"
            body = {"model_path": "output/fifo"}
            return httpx.post(f"{server.url}{route}", json=body, headers=auth, timeout=20).status_code

        start = time.monotonic()
        with ThreadPoolExecutor(60) as pool:
            codes = list(pool.map(attack, range(60)))
        assert time.monotonic() - start < 20, codes
        # 429: checks at once are capped (since issue 24 for /validate as for /submit); at least one of each is
        # checked and refused
        assert 400 in codes[1::2] and set(codes[1::2]) <= {400, 429} and set(codes[::2]) <= {400, 429}, codes
        _still_healthy(server)
    service.close(10)


def test_a_chunked_body_bomb_is_cut_at_the_limit_before_authentication(tmp_path, tiny_model_dir):
    """Class 3: 200 MB chunked, no Content-Length. Without a token: 401 before the body is read; with one:
    413 after 64 KiB. The grader's memory does not grow by the body's size."""
    paths, _, service = _served(tmp_path, tiny_model_dir)

    def rss_mb() -> float:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS"))
        return int(line.split()[1]) / 1024

    with GradingServer(service) as server:
        before = rss_mb()
        codes = []
        for headers in ({}, {"Authorization": f"Bearer {server.token}"}):
            body = (b"x" * MiB for _ in range(200))
            try:
                headers = {**headers, "content-type": "application/json"}
                codes.append(httpx.post(f"{server.url}/submit", content=body, timeout=60, headers=headers).status_code)
            except httpx.HTTPError as e:  # closed after the answer, while the client still sent
                codes.append(type(e).__name__)
        cut = ("WriteError", "RemoteProtocolError")  # closed after the answer while the client still sent
        assert codes[0] in (401, *cut) and codes[1] in (413, *cut), codes
        assert rss_mb() - before < 64, (before, rss_mb())
        _still_healthy(server)
    service.close(10)


def test_an_edited_or_cut_ledger_end_is_detected(tmp_path, tiny_model_dir):
    """Class 6: after a real graded submission, the last entry's score is edited, then the ledger is cut:
    both disagree with the head the results store anchored at every append."""
    from a2rl.grading.ledger import LedgerCorrupted, read_ledger

    paths, store, service = _served(tmp_path, tiny_model_dir)
    with GradingServer(service) as server:
        _still_healthy(server)
    service.close(10)
    ledger = paths.harness_dir / "ledger.jsonl"
    original = ledger.read_text()
    anchored = {"the results store": store.ledger_head("integrity-run")}
    assert len(read_ledger(ledger, anchored)) == original.count("\n")
    *head, last = original.splitlines(keepends=True)
    scored = LedgerEntry.model_validate_json(last)
    assert scored.status == "scored"  # the last entry is the graded score (maybe from the evaluation cache)
    ledger.write_text("".join(head) + scored.model_copy(update={"score": 93.125}).model_dump_json() + "\n")
    with pytest.raises(LedgerCorrupted, match="edited"):
        read_ledger(ledger, anchored)
    ledger.write_text("".join(original.splitlines(keepends=True)[:-1]))
    with pytest.raises(LedgerCorrupted, match="cut off"):
        read_ledger(ledger, anchored)


def test_a_flood_of_idle_connections_cannot_exhaust_the_harness_file_descriptors(tmp_path, tiny_model_dir):
    """Class 3: 600 connections that never send a request. The grader (in this process) closes those past its
    connection cap at once and the rest after the keep-alive timeout; then it serves as before."""
    from a2rl.grading.server import MAX_CONNECTIONS

    paths, _, service = _served(tmp_path, tiny_model_dir)

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    with GradingServer(service) as server:
        base = open_fds()
        flood = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(600)]
        # The server closes those past its cap as its event loop accepts them: on a loaded machine that can
        # take a few seconds, so wait for it (bounded) before asserting.
        deadline = time.monotonic() + 10
        while open_fds() - base > 600 + MAX_CONNECTIONS + 8 and time.monotonic() < deadline:
            time.sleep(0.25)
        assert open_fds() - base <= 600 + MAX_CONNECTIONS + 8  # the server side holds at most its cap
        deadline = time.monotonic() + 15
        while open_fds() - base > 600 + 8 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert open_fds() - base <= 600 + 8, "idle connections still held by the grader"
        for s in flood:
            s.close()
        _still_healthy(server)
    service.close(10)
