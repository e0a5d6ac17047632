"""The pairwise LLM judge: a pinned prompt, temperature 0, both orders, judgements cached on disk.

Any Anthropic model, or any endpoint that speaks the Anthropic Messages API (set its base URL), through
the `anthropic` SDK; or any OpenAI-compatible Chat Completions endpoint (OpenAI, a local `vllm serve`:
no Anthropic key needed) with `A2RL_JUDGE_API=openai`. Configuration comes from the environment:

- `ANTHROPIC_API_KEY`: the key (an endpoint that needs none may be used without it);
- `A2RL_JUDGE_API`: `anthropic` (default) or `openai` (OpenAI-compatible; key from `A2RL_JUDGE_API_KEY` or
  `OPENAI_API_KEY`, base URL default https://api.openai.com/v1, e.g. http://gpu01:8000/v1 for vLLM);
- `A2RL_JUDGE_BASE_URL`: a compatible endpoint; default the Anthropic API;
- `A2RL_JUDGE_MODEL`: default `claude-sonnet-4-5`;
- `A2RL_JUDGE_REFERENCE_MODEL`: writes reference answers where the data ships none; default the judge model;
- `A2RL_JUDGE_TEMPERATURE`: sent to a compatible endpoint (default 0 there); `none` to leave it out;
- `A2RL_JUDGE_CONCURRENCY`: parallel judge calls during an evaluation (default 4).

Temperature: the Anthropic API version that `anthropic` 2.x speaks (2026-10-21) rejects `temperature`,
`top_p` and `top_k` (HTTP 400), and the SDK no longer takes them. So for Anthropic models no sampling
parameter is sent, and repeatability rests on the pinned model and prompt, a verdict-only answer of a
few tokens, and the cache (each judgement is made once and then reused). A compatible endpoint given by
base URL (vLLM and the like) gets `temperature: 0` in the request body unless told otherwise.

Transient failures (429, 5xx, 529 overloaded, timeouts, dropped connections) are retried by the SDK
with exponential backoff, honouring `retry-after`. A judgement that still fails, is refused, or does
not state a verdict is recorded as *no verdict* (never as a loss) and is not cached, so a re-run asks
again. A wrong key or an unknown model stops the evaluation with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from a2rl_bench.paths import a2rl_home

DEFAULT_JUDGE_MODEL = "claude-sonnet-4-5"
JUDGE_PROMPT_VERSION = "pairwise-v1"
"""Bump whenever JUDGE_SYSTEM, JUDGE_TEMPLATE or `parse_verdict` change: it is part of every cache key."""
REFERENCE_PROMPT_VERSION = "reference-v1"

JUDGE_SYSTEM = (
    "You are an impartial judge of AI assistants. You are shown one user instruction and two responses "
    "to it, labelled A and B. Decide which response a careful human expert would prefer: the one that "
    "follows the instruction more faithfully and is more helpful, accurate and clear. The labels and the "
    "order of the responses carry no information. Do not prefer a response because it is longer.\n"
    "Answer with exactly one verdict and nothing else: [[A]] if response A is better, [[B]] if response B "
    "is better. If they are equally good, pick the one you would rather receive."
)
JUDGE_TEMPLATE = (
    "<instruction>\n{instruction}\n</instruction>\n\n"
    "<response_A>\n{output_a}\n</response_A>\n\n"
    "<response_B>\n{output_b}\n</response_B>\n\n"
    "Which response is better? Answer [[A]] or [[B]]."
)

_VERDICT = re.compile(r"\[\[\s*([AB])\s*\]\]")
Winner = Literal["A", "B"]


class JudgeNotConfigured(RuntimeError):
    """No judge endpoint or key is set; judged tasks cannot be scored (never scored as 0)."""


class NoAnswer(RuntimeError):
    """A call that produced nothing usable, for this item only (after retries, a refusal, an empty answer)."""


class JudgeError(RuntimeError):
    """The judge cannot work at all (bad key, unknown model) or gave no verdict on any item."""


@dataclass(frozen=True)
class JudgeConfig:
    """Everything that decides a judgement; all of it (no secrets) goes into the cache key."""

    model: str = DEFAULT_JUDGE_MODEL
    base_url: str | None = None
    api: Literal["anthropic", "openai"] = "anthropic"
    """Wire protocol: Anthropic Messages, or OpenAI-compatible Chat Completions."""
    """None: the Anthropic API (or the SDK's own `ANTHROPIC_BASE_URL`)."""
    reference_model: str | None = None
    """Writes reference answers where the data has none; None: the judge model."""
    prompt_version: str = JUDGE_PROMPT_VERSION
    temperature: float | None = None
    """None: not sent (the Anthropic API rejects it); a compatible endpoint's default is 0."""
    max_tokens: int = 16
    reference_max_tokens: int = 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JudgeConfig:
        env = os.environ if env is None else env
        api = (env.get("A2RL_JUDGE_API") or "anthropic").strip().lower()
        if api not in ("anthropic", "openai"):
            raise JudgeNotConfigured(f"A2RL_JUDGE_API={api!r}: use `anthropic` or `openai` (OpenAI-compatible)")
        if api == "openai" and not (env.get("A2RL_JUDGE_BASE_URL") or judge_key(env, "openai")):
            raise JudgeNotConfigured("A2RL_JUDGE_API=openai needs A2RL_JUDGE_BASE_URL (an OpenAI-compatible "
                                     "server such as `vllm serve`) or OPENAI_API_KEY / A2RL_JUDGE_API_KEY")  # fmt: skip
        if api == "anthropic" and not env.get("ANTHROPIC_API_KEY") and not env.get("A2RL_JUDGE_BASE_URL"):
            raise JudgeNotConfigured(
                "the alpacaeval task is scored by an LLM judge, and none is configured: set ANTHROPIC_API_KEY "
                f"(Anthropic API; judge model A2RL_JUDGE_MODEL, default {DEFAULT_JUDGE_MODEL}), or "
                "A2RL_JUDGE_BASE_URL for an Anthropic-compatible endpoint (plus ANTHROPIC_API_KEY if it needs "
                "a key), or A2RL_JUDGE_API=openai with A2RL_JUDGE_BASE_URL for an OpenAI-compatible server such as "
                "`vllm serve` (no Anthropic key needed); optional: A2RL_JUDGE_REFERENCE_MODEL, A2RL_JUDGE_CONCURRENCY"
            )
        base_url = env.get("A2RL_JUDGE_BASE_URL") or None
        temperature: float | None = 0.0 if base_url or api == "openai" else None
        if (setting := env.get("A2RL_JUDGE_TEMPERATURE")) is not None:
            temperature = None if setting.strip().lower() in ("", "none") else float(setting)
        return cls(
            model=env.get("A2RL_JUDGE_MODEL") or DEFAULT_JUDGE_MODEL,
            base_url=base_url,
            api=api,  # type: ignore[arg-type]
            reference_model=env.get("A2RL_JUDGE_REFERENCE_MODEL") or None,
            temperature=temperature,
        )

    def identity(self) -> dict[str, Any]:
        """What goes into a cache key: every setting (an Anthropic judge's keys predate the `api` field)."""
        fields = asdict(self)
        if self.api == "anthropic":
            del fields["api"]
        return fields

    @property
    def writer_model(self) -> str:
        return self.reference_model or self.model

    def label(self) -> str:
        """Short identity for evaluator ids and reports."""
        where = f"@{self.base_url}" if self.base_url else ""
        where = f"{where}/openai" if self.api == "openai" else where
        temperature = "" if self.temperature is None else f"/t{self.temperature:g}"
        return f"{self.model}{where}/{self.prompt_version}{temperature}/ref-{self.writer_model}"


class Verdict(NamedTuple):
    """One judgement of one order of presentation."""

    winner: Winner | None
    """None: no verdict (refusal, unparseable answer, or a call that failed after retries)."""
    text: str
    cached: bool
    input_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None


class Comparison(NamedTuple):
    """The model's output against the reference, judged in both orders."""

    value: float | None
    """1 = preferred in both orders, 0.5 = split, 0 = never; None unless both orders gave a verdict."""
    model_first: Verdict
    """Model output shown as A, reference as B."""
    reference_first: Verdict
    """Reference shown as A, model output as B."""


def judge_key(env: Mapping[str, str], api: str) -> str | None:
    """The judge's API key from the environment: `A2RL_JUDGE_API_KEY`, else the vendor's usual variable."""
    return env.get("A2RL_JUDGE_API_KEY") or env.get("ANTHROPIC_API_KEY" if api == "anthropic" else "OPENAI_API_KEY")


def parse_verdict(text: str) -> Winner | None:
    """The verdict in a judge's answer: `[[A]]` or `[[B]]` (or a bare `A` / `B`); None when absent or both.

    >>> parse_verdict("[[B]]"), parse_verdict("A"), parse_verdict("[[A]] or [[B]]"), parse_verdict("tie")
    ('B', 'A', None, None)
    """
    found = set(_VERDICT.findall(text))
    if not found and text.strip().strip(".*") in ("A", "B"):
        found = {text.strip().strip(".*")}
    return found.pop() if len(found) == 1 else None  # type: ignore[return-value]


def judge_messages(instruction: str, output_a: str, output_b: str) -> list[dict[str, str]]:
    content = JUDGE_TEMPLATE.format(instruction=instruction, output_a=output_a, output_b=output_b)
    return [{"role": "user", "content": content}]


class JudgeCache:
    """One JSON file per finished judge call, keyed by a hash of the config and the exact inputs."""

    def __init__(self, root: Path | None = None):
        self.root = root or a2rl_home() / "judge-cache"

    @staticmethod
    def key(kind: str, identity: Mapping[str, Any], **inputs: str) -> str:
        """Hash of what decides the answer: the call's settings (`identity`) and its exact inputs."""
        blob = json.dumps({"kind": kind, "identity": identity, **inputs}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        path = self.root / key[:2] / f"{key}.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # missing or torn: a miss

    def put(self, key: str, value: dict[str, Any]) -> None:
        path = self.root / key[:2] / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)


class PairwiseJudge:
    """Judges pairs of outputs for one instruction through the Anthropic Messages API, with a disk cache."""

    def __init__(
        self,
        config: JudgeConfig,
        api_key: str | None = None,
        cache: JudgeCache | None = None,
        max_retries: int = 6,
        timeout_s: float = 120.0,
    ):
        import anthropic

        self.config = config
        self.cache = cache or JudgeCache()
        self.max_retries, self.timeout_s = max_retries, timeout_s
        # An endpoint without auth still needs some key for the SDK to send a request.
        self.api_key = api_key or "no-key"
        self.client = anthropic.Anthropic(
            api_key=self.api_key, base_url=config.base_url, max_retries=max_retries, timeout=timeout_s
        )

    @classmethod
    def from_env(cls) -> PairwiseJudge:
        config = JudgeConfig.from_env()
        return cls(config, api_key=judge_key(os.environ, config.api))

    def judge(self, instruction: str, output_a: str, output_b: str) -> Verdict:
        """One order: is A or B the better response to `instruction`?"""
        key = self.cache.key("pairwise", self.config.identity(), instruction=instruction, a=output_a, b=output_b)
        if (hit := self.cache.get(key)) is not None:
            return Verdict(parse_verdict(hit["text"]), hit["text"], True, 0, 0)
        try:
            text, usage = self._call(
                self.config.model, judge_messages(instruction, output_a, output_b), self.config.max_tokens, JUDGE_SYSTEM
            )
        except NoAnswer as e:
            return Verdict(None, "", False, error=str(e))
        winner = parse_verdict(text)
        if winner is not None:
            self.cache.put(key, {"text": text, "model": self.config.model, **usage})
        return Verdict(winner, text, False, usage["input_tokens"], usage["output_tokens"],
                       None if winner else "the judge's answer has no [[A]] / [[B]] verdict")  # fmt: skip

    def compare(self, instruction: str, model_output: str, reference: str) -> Comparison:
        """Judge both orders; position bias cancels in the mean of the two."""
        model_first = self.judge(instruction, model_output, reference)
        reference_first = self.judge(instruction, reference, model_output)
        if model_first.winner is None or reference_first.winner is None:
            return Comparison(None, model_first, reference_first)
        wins = (model_first.winner == "A") + (reference_first.winner == "B")
        return Comparison(wins / 2, model_first, reference_first)

    def write_reference(self, instruction: str) -> str:
        """A reference answer by the reference model, for instructions whose data ships none (cached)."""
        # Only what shapes the reference: a new judge prompt must not rewrite every reference.
        writer = {"model": self.config.writer_model, "base_url": self.config.base_url,
                  "temperature": self.config.temperature, "max_tokens": self.config.reference_max_tokens}  # fmt: skip
        if self.config.api != "anthropic":
            writer["api"] = self.config.api
        key = self.cache.key("reference", writer, version=REFERENCE_PROMPT_VERSION, instruction=instruction)
        if (hit := self.cache.get(key)) is not None:
            return hit["text"]
        messages = [{"role": "user", "content": instruction}]
        text, usage = self._call(self.config.writer_model, messages, self.config.reference_max_tokens, None)
        if not text.strip():
            raise NoAnswer(f"{self.config.writer_model} wrote an empty reference answer")
        self.cache.put(key, {"text": text, "model": self.config.writer_model, **usage})
        return text

    def _call(
        self, model: str, messages: list[dict[str, str]], max_tokens: int, system: str | None
    ) -> tuple[str, dict]:
        if self.config.api == "openai":
            return self._call_openai(model, messages, max_tokens, system)
        import anthropic

        kwargs: dict[str, Any] = {"system": system} if system else {}
        if self.config.temperature is not None:
            kwargs["extra_body"] = {"temperature": self.config.temperature}
        try:
            response = self.client.messages.create(model=model, messages=messages, max_tokens=max_tokens, **kwargs)
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError, anthropic.NotFoundError) as e:
            raise JudgeError(f"the judge endpoint refused the request ({type(e).__name__}): {e}") from e
        except anthropic.APIError as e:  # still failing after the SDK's retries, or a per-request 400
            raise NoAnswer(f"{type(e).__name__}: {e}") from e
        if response.stop_reason == "refusal":
            raise NoAnswer("the model refused")
        text = "".join(block.text for block in response.content if getattr(block, "type", "") == "text")
        usage = {"input_tokens": response.usage.input_tokens, "output_tokens": response.usage.output_tokens}
        return text, usage

    def _call_openai(
        self, model: str, messages: list[dict[str, str]], max_tokens: int, system: str | None
    ) -> tuple[str, dict]:
        """One Chat Completions call, with the Anthropic SDK's retry rules: 408/409/429/5xx, timeouts and
        dropped connections are retried with exponential backoff (honouring `retry-after`)."""
        import time

        import httpx

        url = (self.config.base_url or "https://api.openai.com/v1").rstrip("/") + "/chat/completions"
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens,
                                "messages": ([{"role": "system", "content": system}] if system else []) + messages}
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        headers = {"Authorization": f"Bearer {self.api_key}"}
        error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(retry_after, 60.0) if retry_after is not None else min(0.5 * 2 ** (attempt - 1), 8.0))
            retry_after = None
            try:
                response = httpx.post(url, json=body, headers=headers, timeout=self.timeout_s)
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"
                continue
            if response.status_code in (401, 403, 404):
                raise JudgeError(f"the judge endpoint refused the request (HTTP {response.status_code}): "
                                 f"{response.text[:300]}")  # fmt: skip
            if response.status_code in (408, 409, 429) or response.status_code >= 500:
                error = f"HTTP {response.status_code}: {response.text[:300]}"
                try:
                    retry_after = float(response.headers.get("retry-after", ""))
                except ValueError:
                    retry_after = None
                continue
            if response.status_code >= 400:
                raise NoAnswer(f"HTTP {response.status_code}: {response.text[:300]}")
            try:
                data = response.json()
                choice = data["choices"][0]
                text = choice["message"].get("content") or ""
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise NoAnswer(f"an answer that is not a chat completion: {response.text[:300]}") from e
            if choice.get("finish_reason") == "content_filter":
                raise NoAnswer("the model refused")
            usage = data.get("usage") or {}
            return text, {"input_tokens": usage.get("prompt_tokens") or 0,
                          "output_tokens": usage.get("completion_tokens") or 0}  # fmt: skip
        raise NoAnswer(f"still failing after {self.max_retries} retries: {error}")
