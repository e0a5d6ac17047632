"""Generation handed to another interpreter: the JSON-lines worker protocol and the OpenAI-compatible endpoint
client, against a loopback worker (`a2rl_bench/inference/generation_worker.py` run by a second python process with the
`transformers` backend: a real second engine) on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from a2rl_bench.inference.generation import generate, load_model
from a2rl_bench.inference.remote_generation import WORKER_SCRIPT, EndpointClient, RemoteGenerationError, RemoteRequest, RemoteSettings, WorkerClient, generate_remote, remote_request
from tests.tiny_model import tiny_questions

LOOPBACK = RemoteSettings(python=sys.executable, backend="transformers")


@pytest.fixture(scope="module")
def conversations() -> list[list[dict[str, str]]]:
    questions = tiny_questions(0, 6)
    return [[{"role": "user", "content": q * (1 + i % 2)}] for i, q in enumerate(questions)]


@pytest.fixture(scope="module")
def local(tiny_model_dir: Path, conversations):
    return generate(load_model(tiny_model_dir, "cpu"), conversations, max_new_tokens=16, stop=("the",),
                    engine="generate")


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path):
    with WorkerClient(sys.executable, tiny_model_dir, backend="transformers") as client:
        yield client


def test_worker_in_another_process_gives_the_same_completions(tiny_model_dir: Path, conversations, local,
                                                              worker) -> None:
    assert worker.engine.startswith("transformers ") and worker.proc.pid
    _, request = remote_request(tiny_model_dir, conversations, 16, stop=("the",))
    texts, counts = worker.generate(request)
    assert texts == local.completions
    assert counts == local.completion_tokens
    assert any("the" not in c for c in texts)


def test_worker_reports_a_bad_request_and_keeps_serving(worker) -> None:
    worker.proc.stdin.write("not json\n")
    worker.proc.stdin.flush()
    assert "bad request line" in worker._receive(60)["error"]
    bad = RemoteRequest(["x"], [[1]], max_new_tokens=0, temperature=0.0, top_p=1.0, stop=[], seed=None)
    with pytest.raises(RemoteGenerationError, match="max_new_tokens must be >= 1"):
        worker.generate(bad)
    good = RemoteRequest(["Hello"], [[1]], max_new_tokens=3, temperature=0.0, top_p=1.0, stop=[], seed=None)
    texts, counts = worker.generate(good)
    assert len(texts) == 1 and 1 <= counts[0] <= 3


def test_a_worker_that_cannot_start_is_one_clear_error(tiny_model_dir: Path) -> None:
    with pytest.raises(RemoteGenerationError, match="cannot start the generation worker"):
        WorkerClient("/nonexistent/python", tiny_model_dir)
    with pytest.raises(RemoteGenerationError, match="exited with 1"):
        WorkerClient("/bin/false", tiny_model_dir)


def test_evaluator_vllm_backend_uses_the_configured_worker(tiny_model_dir: Path, monkeypatch) -> None:
    from a2rl_bench.inference.evaluation import EvalSpec, evaluate
    from a2rl_bench.benchmarks import get_task

    spec = EvalSpec.of(get_task("gsm8k"), "offline", "validation", limit=4)
    local = evaluate(tiny_model_dir, spec)
    monkeypatch.setenv("A2RL_VLLM_PYTHON", sys.executable)
    monkeypatch.setenv("A2RL_VLLM_WORKER_BACKEND", "transformers")
    remote = evaluate(tiny_model_dir, EvalSpec.of(get_task("gsm8k"), "offline", "validation", limit=4, backend="vllm"))
    assert [i.completion for i in remote.items] == [i.completion for i in local.items]
    assert (remote.score, remote.generated_tokens) == (local.score, local.generated_tokens)


@pytest.fixture
def endpoint(tiny_model_dir: Path):
    proc = subprocess.Popen([sys.executable, str(WORKER_SCRIPT), "--backend", "transformers", "--model",
                             str(tiny_model_dir), "--serve", "0"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    try:
        for line in proc.stderr:
            if line.startswith('{"listening"'):
                yield f"http://127.0.0.1:{json.loads(line)['listening']}"
                break
        else:
            pytest.fail("the loopback endpoint did not start")
    finally:
        proc.kill()
        proc.wait()


def test_openai_compatible_endpoint_gives_the_same_completions(tiny_model_dir: Path, conversations, local,
                                                               endpoint, tmp_path) -> None:
    settings = RemoteSettings(url=endpoint)
    remote = generate_remote(tiny_model_dir, conversations, max_new_tokens=16, stop=("the",), settings=settings)
    assert remote.completions == local.completions
    with pytest.raises(RemoteGenerationError, match="not the checkpoint being evaluated"):
        EndpointClient(endpoint, tmp_path)
