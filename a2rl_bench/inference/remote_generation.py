"""Generation handed to an engine outside this environment: a worker run by another Python interpreter (e.g. a
venv with vLLM, which pins its own torch and transformers) or an OpenAI-compatible endpoint (`vllm serve`).

The harness still renders every prompt with the checkpoint's chat template and tokenizes it (no special tokens
added), and sends the token ids: the other engine decodes exactly the prompts `a2rl_bench.inference.generation` would, with the
same decoding settings, and completions come back cut before the first stop string.

Configuration (environment, read by the evaluator for `eval_backend="vllm"`):
  A2RL_VLLM_PYTHON=/path/to/vllm-venv/bin/python   a worker (`a2rl_bench/inference/generation_worker.py`) per evaluation
  A2RL_VLLM_ARGS='{"dtype": "float32"}'            extra `vllm.LLM(...)` arguments for that worker
  A2RL_GENERATION_URL=http://127.0.0.1:8000        a running `vllm serve CHECKPOINT` (must serve that checkpoint)
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from a2rl_bench.inference.generation import Conversation, GenerationOutput, render_prompt
from a2rl_bench.paths import import_root

WORKER_SCRIPT = Path(__file__).with_name("generation_worker.py")


class RemoteGenerationError(RuntimeError):
    """The other engine could not be started, answered with an error, or serves another checkpoint."""


@dataclass(frozen=True)
class RemoteSettings:
    """Where generation goes; None of both means in-process."""

    python: str | None = None
    """Interpreter of the environment that runs the worker (A2RL_VLLM_PYTHON)."""
    url: str | None = None
    """Base URL of an OpenAI-compatible server (A2RL_GENERATION_URL); wins over `python`."""
    backend: str = "vllm"
    """Worker backend: `vllm`, or `transformers` (a2rl's generate in the other interpreter)."""

    @classmethod
    def from_env(cls) -> RemoteSettings:
        return cls(python=os.environ.get("A2RL_VLLM_PYTHON") or None, url=os.environ.get("A2RL_GENERATION_URL") or None,
                   backend=os.environ.get("A2RL_VLLM_WORKER_BACKEND") or "vllm")  # fmt: skip

    @property
    def configured(self) -> bool:
        return bool(self.python or self.url)


@dataclass(frozen=True)
class RemoteRequest:
    prompts: list[str]
    prompt_token_ids: list[list[int]]
    max_new_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    seed: int | None


class WorkerClient:
    """A `generation_worker.py` process under another interpreter, spoken to in JSON lines."""

    def __init__(self, python: str, model_dir: str | Path, backend: str = "vllm", start_timeout_s: float = 1800):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(import_root()), env.get("PYTHONPATH")]))
        cmd = [python, str(WORKER_SCRIPT), "--backend", backend, "--model", str(model_dir)]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        except OSError as e:
            raise RemoteGenerationError(f"cannot start the generation worker with {python}: {e}") from e
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 0
        ready = self._receive(start_timeout_s)
        if not ready.get("ready"):
            raise RemoteGenerationError(f"generation worker did not start: {ready}")
        self.engine = ready.get("engine", "?")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _receive(self, timeout_s: float) -> dict:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            self.close()
            raise RemoteGenerationError(f"generation worker gave no answer in {timeout_s:.0f} s") from None
        if line is None:
            code = self.proc.wait()
            raise RemoteGenerationError(f"generation worker exited with {code} (its stderr says why)")
        try:
            return json.loads(line)
        except json.JSONDecodeError as e:
            raise RemoteGenerationError(f"generation worker wrote a line that is not JSON: {line[:200]!r}") from e

    def generate(self, request: RemoteRequest, timeout_s: float = 3600) -> tuple[list[str], list[int]]:
        self.next_id += 1
        message = {"id": self.next_id, **request.__dict__}
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise RemoteGenerationError(f"generation worker is gone: {e}") from e
        reply = self._receive(timeout_s)
        if reply.get("id") != self.next_id or "error" in reply:
            raise RemoteGenerationError(f"generation worker failed: {reply.get('error') or reply}")
        return _checked(reply.get("completions"), reply.get("completion_tokens"), len(request.prompts))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EndpointClient:
    """An OpenAI-compatible completions endpoint that serves the checkpoint being evaluated."""

    def __init__(self, url: str, model_dir: str | Path, timeout_s: float = 3600):
        import httpx

        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s)
        wanted = Path(model_dir).resolve()
        try:
            models = self.http.get("/v1/models").raise_for_status().json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as e:
            raise RemoteGenerationError(f"{url}/v1/models did not answer with a model list: {e}") from e
        served = [m for m in models if _same_path(m.get("root") or m.get("id"), wanted)]
        if not served:
            names = [m.get("root") or m.get("id") for m in models]
            raise RemoteGenerationError(f"{url} serves {names}, not the checkpoint being evaluated ({wanted})")
        self.model = served[0]["id"]
        self.engine = f"endpoint {url}"

    def generate(self, request: RemoteRequest, tokenizer) -> tuple[list[str], list[int]]:
        import httpx

        body = {"model": self.model, "prompt": request.prompt_token_ids, "max_tokens": request.max_new_tokens,
                "temperature": request.temperature, "top_p": request.top_p, "stop": request.stop or None,
                "seed": request.seed, "skip_special_tokens": True, "return_token_ids": True}  # fmt: skip
        try:
            choices = self.http.post("/v1/completions", json=body).raise_for_status().json()["choices"]
        except (httpx.HTTPError, KeyError, ValueError) as e:
            raise RemoteGenerationError(f"completion request failed: {e}") from e
        choices = sorted(choices, key=lambda c: c["index"])
        texts = [c["text"] for c in choices]
        # vLLM returns the generated ids with return_token_ids; otherwise count the returned text's tokens.
        counts = [len(c["token_ids"]) if c.get("token_ids") is not None
                  else len(tokenizer(c["text"], add_special_tokens=False)["input_ids"]) for c in choices]  # fmt: skip
        return _checked(texts, counts, len(request.prompts))


def _same_path(name: str | None, wanted: Path) -> bool:
    return bool(name) and Path(name).expanduser().resolve() == wanted


def _checked(texts, counts, n: int) -> tuple[list[str], list[int]]:
    if not isinstance(texts, list) or not isinstance(counts, list) or len(texts) != n or len(counts) != n:
        raise RemoteGenerationError(f"the other engine answered {n} prompts with a malformed result")
    return [str(t) for t in texts], [int(c) for c in counts]


def generate_remote(
    model_dir: str | Path,
    conversations: Sequence[Conversation],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    stop: Sequence[str] = (),
    seed: int | None = None,
    settings: RemoteSettings | None = None,
) -> GenerationOutput:
    """`a2rl_bench.inference.generation.generate`'s contract, generated by the configured worker or endpoint."""
    settings = settings or RemoteSettings.from_env()
    if not settings.configured:
        raise RemoteGenerationError("no remote engine configured (A2RL_VLLM_PYTHON or A2RL_GENERATION_URL)")
    tokenizer, request = remote_request(model_dir, conversations, max_new_tokens, temperature, top_p, stop, seed)
    started = time.perf_counter()
    if not request.prompts:
        texts, counts = [], []
    elif settings.url:
        texts, counts = EndpointClient(settings.url, model_dir).generate(request, tokenizer)
    else:
        with WorkerClient(settings.python, model_dir, settings.backend) as worker:
            started = time.perf_counter()  # the worker's model loading is not generation time
            texts, counts = worker.generate(request)
    return GenerationOutput(completions=texts, completion_tokens=counts, generated_tokens=sum(counts),
                            seconds=time.perf_counter() - started)


def remote_request(model_dir, conversations, max_new_tokens, temperature=0.0, top_p=1.0, stop=(), seed=None):
    """(tokenizer, request): prompts rendered and tokenized here, exactly as `a2rl_bench.inference.generation` does."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [render_prompt(tokenizer, c) for c in conversations]
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"] if prompts else []
    return tokenizer, RemoteRequest(prompts, ids, max_new_tokens, temperature, top_p, list(stop), seed)
