"""Bad input gets a clear 4xx; a crash of an evaluation or of the grader itself loses nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService, Ledger
from a2rl_bench.grading.checkpoint import SubmissionRejected
from a2rl_bench.records import RunConfig
from a2rl_bench.benchmarks import get_task


@pytest.fixture(scope="module")
def prepared_gsm8k():
    get_task("gsm8k").prepare("offline")


@pytest.fixture
def workspace(tmp_path, tiny_model_dir):
    ws = tmp_path / "ws"
    shutil.copytree(tiny_model_dir, ws / "models" / "base")
    shutil.copytree(tiny_model_dir, ws / "output" / "v1")
    return ws


def make_service(tmp_path, ws, tiny_model_dir, **config) -> GradingService:
    cfg = RunConfig(**{"val_limit": 2, "test_limit": 2, **config})
    ctx = GradingContext("run-x", cfg, ws, tmp_path / "harness", baseline={"validation": 0.0},
                         base_model_dir=tiny_model_dir, task=get_task(cfg.task))
    clock = BudgetClock(cfg.budget_s)
    clock.start()
    return GradingService(ctx, clock)


# -- every kind of bad checkpoint ---------------------------------------------------------------
def _break(ckpt: Path, how: str) -> None:
    if how == "no-config":
        (ckpt / "config.json").unlink()
    elif how == "no-weights":
        for f in ckpt.glob("*.safetensors"):
            f.unlink()
    elif how == "fifo-weights":  # opening it for reading would block forever
        next(ckpt.glob("*.safetensors")).unlink()
        os.mkfifo(ckpt / "model.safetensors")
    elif how == "fifo-config":
        (ckpt / "config.json").unlink()
        os.mkfifo(ckpt / "config.json")
    elif how == "hard-linked-weights":
        f = next(ckpt.glob("*.safetensors"))
        os.link(f, ckpt.parent / "elsewhere.safetensors")
    elif how == "sparse-weights":  # 3 GiB apparent, a few KiB on disk
        with open(ckpt / "model-00002.safetensors", "wb") as f:
            f.truncate(3 << 30)
    elif how.startswith("header-"):
        header = {"header-list": b"[1, 2]", "header-number": b"7", "header-string-offsets":
                  json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}}).encode(),
                  "header-deep": b"[" * 100_000 + b"]" * 100_000,
                  "header-bad-metadata": json.dumps({"__metadata__": [1]}).encode()}[how]
        next(ckpt.glob("*.safetensors")).write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    elif how == "parent-swapped-for-link":  # output/v1 itself is a link: resolved, then opened without following
        pass
    elif how == "index-escapes":
        (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../../x.safetensors"}}))
    elif how == "lora-adapter":
        for f in ckpt.iterdir():
            f.unlink()
        (ckpt / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
        (ckpt / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    elif how == "truncated-weights":
        f = next(ckpt.glob("*.safetensors"))
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif how == "garbage-weights":
        next(ckpt.glob("*.safetensors")).write_bytes(b"this is not a tensor file at all")
    elif how == "other-architecture":
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
        (ckpt / "config.json").write_text(json.dumps(cfg))
    elif how == "other-vocab":
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["vocab_size"] += 7
        (ckpt / "config.json").write_text(json.dumps(cfg))
    elif how.startswith("inflated-"):  # small weights, a config that builds a huge model (issue 24)
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg.update({"inflated-hidden": {"hidden_size": 2**20}, "inflated-layers": {"num_hidden_layers": 10**6},
                    "inflated-ffn": {"intermediate_size": 2**19}, "inflated-heads": {"num_attention_heads": 4096,
                    "head_dim": 4096}}[how])  # fmt: skip
        (ckpt / "config.json").write_text(json.dumps(cfg))
    elif how == "symlinked-file":  # dangles in the agent's sandbox, resolves on the grader's host
        (ckpt / "tokenizer.json").unlink()
        (ckpt / "tokenizer.json").symlink_to("/etc/hostname")
    elif how == "bad-config-json":
        (ckpt / "config.json").write_text("{not json")


@pytest.mark.parametrize(
    "how, message",
    [
        ("no-config", "config.json is missing"),
        ("no-weights", "no weights"),
        ("fifo-weights", "regular file"),
        ("fifo-config", "regular file"),
        ("hard-linked-weights", "hard link"),
        ("header-list", "not a JSON object"),
        ("header-number", "not a JSON object"),
        ("header-string-offsets", "malformed"),
        ("header-deep", "unreadable safetensors header"),
        ("header-bad-metadata", "__metadata__"),
        ("index-escapes", "not files of this checkpoint"),
        ("lora-adapter", "merge"),
        ("truncated-weights", "corrupted"),
        ("garbage-weights", "safetensors"),
        ("other-architecture", "architecture"),
        ("other-vocab", "vocab_size"),
        ("bad-config-json", "not valid JSON"),
        ("symlinked-file", "symbolic links"),
        ("inflated-hidden", "config.json"),
        ("inflated-layers", "config.json"),
        ("inflated-ffn", "config.json"),
        ("inflated-heads", "config.json"),
    ],
)
def test_bad_checkpoints_get_a_clear_400_and_cost_nothing(tmp_path, workspace, tiny_model_dir, how, message):
    _break(workspace / "output" / "v1", how)
    service = make_service(tmp_path, workspace, tiny_model_dir)
    with GradingServer(service) as server:
        auth = {"Authorization": f"Bearer {server.token}"}
        for route in ("/validate", "/submit"):
            r = httpx.post(server.url + route, json={"model_path": "output/v1"}, headers=auth)
            assert r.status_code == 400, (route, r.text)
            assert message in r.json()["detail"], r.json()
        assert httpx.get(server.url + "/budget", headers=auth).json()["submissions_used"] == 0
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    service.close(5)


def test_sparse_file_counts_at_its_apparent_size_and_is_not_copied(tmp_path, workspace, tiny_model_dir):
    _break(workspace / "output" / "v1", "sparse-weights")
    service = make_service(tmp_path, workspace, tiny_model_dir, max_checkpoint_bytes=1 << 30)
    with pytest.raises(SubmissionRejected, match="over the 1 GB cap") as over:
        service.submit("output/v1")
    assert over.value.status_code == 413
    assert not any((tmp_path / "harness" / "snapshots").glob("*/model-00002.safetensors"))
    service.close(5)


@pytest.mark.parametrize("path, status, message", [
    ("output/" + "x" * 300, 400, "longer than the filesystem allows"),
    ("output/loop", 400, "link loop"),
    ("output/" + "/".join(["d"] * 2000), 400, ""),
])  # fmt: skip
def test_unresolvable_paths_answer_4xx(tmp_path, workspace, tiny_model_dir, path, status, message):
    (workspace / "output" / "loop").symlink_to("loop")
    service = make_service(tmp_path, workspace, tiny_model_dir)
    with GradingServer(service) as server:
        auth = {"Authorization": f"Bearer {server.token}"}
        for route in ("/validate", "/submit"):
            r = httpx.post(server.url + route, json={"model_path": path}, headers=auth)
            assert 400 <= r.status_code < 500 and message in r.json()["detail"], (route, r.status_code, r.text)
    service.close(5)


def test_a_directory_swapped_for_a_link_after_resolving_is_not_followed(tmp_path, workspace, tiny_model_dir):
    """The check opens the resolved path again one component at a time without following links."""
    from a2rl_bench.grading.checkpoint import open_checkpoint, resolve_in_workspace

    resolved = resolve_in_workspace(workspace, "output/v1")
    outside = tmp_path / "outside"
    shutil.copytree(workspace / "output" / "v1", outside)
    (workspace / "output").rename(workspace / "output-old")
    (workspace / "output").symlink_to(tmp_path)  # output/v1 now leads out of the workspace
    from a2rl_bench.grading.files import CheckpointDir

    with pytest.raises(SubmissionRejected, match="symbolic link"):
        CheckpointDir.open(workspace.resolve(), resolved, "output/v1")
    with pytest.raises(SubmissionRejected, match="outside the workspace"):
        open_checkpoint(workspace, "output/v1")


def test_bad_requests_get_clear_4xx(tmp_path, workspace, tiny_model_dir):
    (workspace / "output" / "afile").write_text("x")
    service = make_service(tmp_path, workspace, tiny_model_dir, max_checkpoint_bytes=1000)
    with GradingServer(service) as server:
        auth = {"Authorization": f"Bearer {server.token}"}

        def post(body, **kw):
            return httpx.post(server.url + "/submit", json=body, headers=auth, **kw)

        assert post({"model_path": "output/afile"}).status_code == 400  # not a directory
        assert post({"model_path": "/etc"}).status_code == 400  # absolute path outside
        assert post({"model_path": "output/v1"}).status_code == 413  # over the size cap
        assert post({"path": "output/v1"}).status_code == 422  # missing field
        assert httpx.post(server.url + "/submit", content=b"[1,2", headers=auth).status_code == 422
        big = httpx.post(server.url + "/submit", content=b"x" * 100_000,
                         headers={**auth, "content-type": "application/json"})
        assert big.status_code == 413
        assert httpx.post(server.url + "/final", json={"submission_id": 5}, headers=auth).status_code == 404
    service.close(5)


def test_budget_over_refuses_submissions(tmp_path, workspace, tiny_model_dir):
    service = make_service(tmp_path, workspace, tiny_model_dir)
    service.close(5)
    with pytest.raises(SubmissionRejected) as over:
        service.submit("output/v1")
    assert over.value.status_code == 403


# -- crashes -----------------------------------------------------------------------------------
def test_a_crashing_evaluation_is_an_error_not_a_score(tmp_path, workspace, tiny_model_dir, prepared_gsm8k):
    # Weights whose header is fine but whose values cannot run: the evaluation process itself dies.
    ckpt = workspace / "output" / "v1"
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["num_attention_heads"] = 3  # hidden size not divisible: the model fails to build
    (ckpt / "config.json").write_text(json.dumps(cfg))
    service = make_service(tmp_path, workspace, tiny_model_dir)
    result = service.submit("output/v1", wait=True)
    assert result["status"] == "error" and result["score"] is None
    assert result["error"] == "could not load the weights"  # a fixed category; the traceback is harness-only
    logged = (tmp_path / "harness" / "evaluation-errors.jsonl").read_text()
    assert "exited with" in logged and "Traceback" in logged
    assert service.best() is None
    service.close(5)


def test_identical_resubmission_answers_from_the_cache(tmp_path, workspace, tiny_model_dir, prepared_gsm8k):
    shutil.copytree(workspace / "output" / "v1", workspace / "output" / "v1-copy")
    # A split selection no other test uses: the first submission must not come from an earlier test's cache.
    service = make_service(tmp_path, workspace, tiny_model_dir, val_limit=3)
    first = service.submit("output/v1", wait=True)
    t = time.perf_counter()
    again = service.submit("output/v1-copy", wait=True)
    assert time.perf_counter() - t < 2.0
    assert first["status"] == again["status"] == "scored" and not first["cached"] and again["cached"]
    assert again["score"] == first["score"]
    assert [e.cached for e in service.submissions()] == [False, True]
    service.close(5)


def test_checkpoint_changed_after_submission_is_not_what_gets_graded(tmp_path, workspace, tiny_model_dir,
                                                                   prepared_gsm8k):
    service = make_service(tmp_path, workspace, tiny_model_dir)
    entry = service.submit("output/v1")
    _break(workspace / "output" / "v1", "garbage-weights")  # the agent overwrites it right after submitting
    service.close(120)
    final = service.submissions()[0]
    assert final.status == "scored", final.error
    assert final.weights_hash and Path(final.resolved_path).is_relative_to(tmp_path / "harness")
    assert entry["submission_id"] == 1


@pytest.fixture
def grader_procs():
    """Grader processes a test starts; all killed at teardown, whatever the test's outcome."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_grader_killed_mid_evaluation_resumes_on_restart(tmp_path, workspace, tiny_model_dir, prepared_gsm8k,
                                                         grader_procs):
    harness = tmp_path / "harness"
    harness.mkdir()
    (tmp_path / "token").write_text("t0ken")
    # A split selection no other test uses, so the evaluation cannot come from the cache.
    (tmp_path / "config.json").write_text(RunConfig(val_limit=5, test_limit=2).model_dump_json())
    port_file = tmp_path / "port.json"

    def start() -> tuple[subprocess.Popen, str]:
        port_file.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "a2rl_bench.tasks.serve_grading", "--harness-dir", str(harness), "--workspace", str(workspace),
             "--config", str(tmp_path / "config.json"), "--run-id", "run-crash", "--token-file",
             str(tmp_path / "token"), "--port-file", str(port_file), "--base-model-dir", str(tiny_model_dir)],
            start_new_session=True, env=os.environ.copy(),
        )  # fmt: skip
        grader_procs.append(proc)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "grader did not start"
            time.sleep(0.2)
        return proc, json.loads(port_file.read_text())["url"]

    auth = {"Authorization": "Bearer t0ken"}
    proc, url = start()
    r = httpx.post(url + "/submit", json={"model_path": "output/v1"}, headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "queued"
    time.sleep(1.0)  # the evaluation process is running now
    os.killpg(proc.pid, signal.SIGKILL)  # the grader and its evaluation die together
    proc.wait()
    assert Ledger(harness / "ledger.jsonl").verify() >= 1

    proc, url = start()
    deadline = time.monotonic() + 120
    while (status := httpx.get(url + "/submissions/1", headers=auth).json()["status"]) not in ("scored", "error"):
        assert time.monotonic() < deadline, "interrupted evaluation was not resumed"
        time.sleep(0.5)
    assert status == "scored"
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    entries = Ledger(harness / "ledger.jsonl").entries()
    outcomes = [e for e in entries if e.kind == "submission" and e.status in ("scored", "error")]
    assert len(outcomes) == 1  # resumed once, recorded once
    assert any(e.detail.get("event") == "evaluation-resumed" for e in entries)


def test_a_trickled_body_is_cut_off_after_the_body_time_limit(tmp_path, workspace, tiny_model_dir, monkeypatch):
    import socket

    import a2rl_bench.grading.server as server_module

    monkeypatch.setattr(server_module, "BODY_SECONDS", 1.0)
    service = make_service(tmp_path, workspace, tiny_model_dir)
    with GradingServer(service) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(f"POST /validate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model".encode())  # fmt: skip
            start = time.monotonic()
            answer = s.recv(200).decode()
        assert answer.startswith("HTTP/1.1 408") and time.monotonic() - start < 5, answer
        assert httpx.get(server.url + "/health").status_code == 200
    service.close(5)


def test_a_failing_anchor_never_loses_an_entry(tmp_path):
    def broken(entry, line_hash):
        raise OSError("results store locked")

    ledger = Ledger(tmp_path / "ledger.jsonl", anchor=broken)
    ledger.append(run_id="r", kind="event", detail={"event": "x"})
    assert Ledger(tmp_path / "ledger.jsonl").verify() == 1


def test_a_burst_of_concurrent_submits_copies_no_more_than_the_cap(tmp_path, workspace, tiny_model_dir):
    """Checks and copies run outside the service lock, but never more at once than submissions are left."""
    from concurrent.futures import ThreadPoolExecutor

    service = make_service(tmp_path, workspace, tiny_model_dir, max_submissions=3)
    service._evaluate = lambda *a, **k: (_ for _ in ()).throw(EvaluationFailedForTest())  # no real evaluation

    def submit(_: int) -> int:
        try:
            service.submit("output/v1")
            return 200
        except SubmissionRejected as e:
            return e.status_code

    with ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(submit, range(12)))
    assert codes.count(200) <= 3 and set(codes) <= {200, 429}, codes
    snapshots = tmp_path / "harness" / "snapshots"
    assert len(list(snapshots.glob("s*"))) == codes.count(200) and not list(snapshots.glob(".pending-*"))
    service.close(10)


class EvaluationFailedForTest(ValueError):
    """Recorded as an error by the service: the test is about admission, not grading."""
