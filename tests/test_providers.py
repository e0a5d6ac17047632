"""Provider kinds: drivers for Anthropic, OpenAI-compatible and Gemini endpoints (`DriverConfig`), and the
alpacaeval judge on an OpenAI-compatible server (a local `vllm serve` stands in as a loopback server here)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from a2rl_bench.benchmarks.alpacaeval.judge import (
    JUDGE_SYSTEM, JudgeCache, JudgeConfig, JudgeNotConfigured, PairwiseJudge,
)


class ChatServer:
    """A loopback OpenAI-compatible `POST /v1/chat/completions` (non-streamed, as vLLM answers it): the
    verdict names the response that contains "good"; `fail_next` answers with 503s first."""

    def __init__(self):
        self.requests: list[dict] = []
        self.failures = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                server.requests.append({"path": self.path, "auth": self.headers.get("authorization"), "body": body})
                if server.failures:
                    server.failures -= 1
                    return self.answer(503, {"error": {"message": "busy"}}, {"retry-after": "0"})
                prompt = body["messages"][-1]["content"]
                a = prompt.split("<response_A>")[1].split("</response_A>")[0]
                verdict = "[[A]]" if "good" in a else "[[B]]"
                self.answer(200, {"id": "c1", "object": "chat.completion", "model": body["model"],
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": verdict}}],
                                  "usage": {"prompt_tokens": 50, "completion_tokens": 3}})  # fmt: skip

            def answer(self, status: int, payload: dict, headers: dict | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in {"content-type": "application/json", **(headers or {})}.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def test_an_openai_compatible_judge_judges_both_orders_and_caches(tmp_path: Path, monkeypatch) -> None:
    with ChatServer() as vllm:
        monkeypatch.setenv("A2RL_JUDGE_API", "openai")
        monkeypatch.setenv("A2RL_JUDGE_BASE_URL", vllm.base_url)
        monkeypatch.setenv("A2RL_JUDGE_MODEL", "Qwen/Qwen2.5-7B-Instruct")
        monkeypatch.setenv("A2RL_JUDGE_API_KEY", "vllm-key")
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # no Anthropic key anywhere
        config = JudgeConfig.from_env()
        assert (config.api, config.temperature) == ("openai", 0.0) and "/openai" in config.label()
        judge = PairwiseJudge(config, api_key="vllm-key", cache=JudgeCache(tmp_path), max_retries=2)
        vllm.failures = 1  # a busy server is retried
        result = judge.compare("Say hi.", "a good answer", "a weak answer")
        assert result.value == 1.0  # preferred in both orders
        assert [r["path"] for r in vllm.requests] == ["/v1/chat/completions"] * 3
        sent = vllm.requests[-1]
        assert sent["auth"] == "Bearer vllm-key" and sent["body"]["model"] == "Qwen/Qwen2.5-7B-Instruct"
        assert sent["body"]["messages"][0] == {"role": "system", "content": JUDGE_SYSTEM}
        assert sent["body"]["temperature"] == 0.0 and result.model_first.input_tokens == 50
        again = judge.compare("Say hi.", "a good answer", "a weak answer")
        assert again.value == 1.0 and again.model_first.cached and len(vllm.requests) == 3


def test_an_openai_judge_without_endpoint_or_key_is_not_configured(monkeypatch) -> None:
    for name in ("A2RL_JUDGE_BASE_URL", "A2RL_JUDGE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("A2RL_JUDGE_API", "openai")
    with pytest.raises(JudgeNotConfigured, match="vllm serve"):
        JudgeConfig.from_env()
    monkeypatch.setenv("A2RL_JUDGE_API", "palm")
    with pytest.raises(JudgeNotConfigured, match="palm"):
        JudgeConfig.from_env()


def test_an_anthropic_judges_cache_keys_are_unchanged_by_the_api_field() -> None:
    assert "api" not in JudgeConfig().identity() and JudgeConfig(api="openai").identity()["api"] == "openai"


def test_a_driver_block_of_each_provider_kind_makes_a_driver_with_its_key(monkeypatch) -> None:
    from a2rl_bench.blocks import DriverConfig
    from a2rl_bench.blocks.llm import driver_from_block

    monkeypatch.setenv("MY_GEMINI_KEY", "g-secret")
    gemini = driver_from_block(DriverConfig(model="gemini-2.5-pro", api="gemini", api_key_env="MY_GEMINI_KEY",
                                            input_usd_per_mtok=1.25, output_usd_per_mtok=10.0))  # fmt: skip
    assert (gemini.api, gemini.api_key.get_secret_value()) == ("gemini", "g-secret")
    assert gemini.cost_usd(1_000_000, 100_000) == pytest.approx(2.25)
    vllm = driver_from_block(DriverConfig(model="Qwen/Qwen2.5-7B-Instruct", api="openai",
                                          base_url="http://gpu01:8000/v1", api_key="none"))  # fmt: skip
    assert (vllm.api, vllm.base_url, vllm.api_key.get_secret_value()) == ("openai", "http://gpu01:8000/v1", "none")
    monkeypatch.delenv("MY_GEMINI_KEY")
    with pytest.raises(ValueError, match=r"\$MY_GEMINI_KEY, which is not set"):
        driver_from_block(DriverConfig(model="gemini-2.5-pro", api="gemini", api_key_env="MY_GEMINI_KEY"))


@pytest.mark.parametrize(("agent_id", "good", "bad"), [("claude-code", "anthropic", "gemini"), ("codex", "openai", "anthropic"),
                                                       ("gemini", "gemini", "openai"), ("opencode", "openai", "gemini")])
def test_each_cli_agent_takes_the_provider_kinds_it_speaks(agent_id, good, bad) -> None:
    from a2rl_bench.agents import LLMDriver, get_agent

    assert "speaks the" not in (get_agent(agent_id, driver=LLMDriver(model="m", api=good)).check() or "")
    assert "speaks the" in get_agent(agent_id, driver=LLMDriver(model="m", api=bad)).check()


def test_a_driver_swap_sweep_gives_one_run_per_driver_for_llm_agents_and_one_for_scripted_ones() -> None:
    from a2rl_bench.run_options import RunOptions, run_parameters
    from a2rl_bench.flows.sweep import SweepItem, expand_matrix

    configs = expand_matrix(["gsm8k"], ["claude-code", "reference-sft"], ["sonnet", "qwen-vllm", "none"], ["free"],
                            [0, 1])  # fmt: skip
    cells = sorted((c.agent, c.driver, c.seed) for c in configs)
    assert cells == [("claude-code", "qwen-vllm", 0), ("claude-code", "qwen-vllm", 1), ("claude-code", "sonnet", 0),
                     ("claude-code", "sonnet", 1), ("reference-sft", "none", 0), ("reference-sft", "none", 1)]
    assert len({c.config_hash() for c in configs}) == 6  # the driver is part of a run's identity
    pair = [c for c in configs if c.agent == "claude-code" and c.seed == 0]
    options = RunOptions(results=Path("results.duckdb"), grace_s=10)
    labels = {SweepItem(config=c, parameters=run_parameters(c, options)).label for c in pair}
    assert labels == {"gsm8k-claude-code-sonnet-free-s0", "gsm8k-claude-code-qwen-vllm-free-s0"}
    assert {run_parameters(c, options)["config"]["driver"] for c in pair} == {"sonnet", "qwen-vllm"}
