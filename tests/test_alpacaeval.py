"""AlpacaEval task: data variants, and the pairwise judge driven through the real SDK against a loopback server."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from a2rl_bench.records import ItemResult
from a2rl_bench.benchmarks import get_task
from a2rl_bench.benchmarks.alpacaeval import (
    JUDGE_PROMPT_VERSION,
    AlpacaEval,
    AlpacaEvalDataError,
    JudgeCache,
    JudgeConfig,
    JudgeError,
    JudgeNotConfigured,
    PairwiseJudge,
    parse_verdict,
    win_rates,
)
from a2rl_bench.benchmarks.alpacaeval.data import (
    OFFLINE_MANIFEST,
    full_task_data,
    load_full,
    load_offline,
    sharegpt_conversations,
)
from a2rl_bench.benchmarks.alpacaeval.judge import JUDGE_SYSTEM
from a2rl_bench.benchmarks.base import TaskData, read_jsonl
from a2rl_bench.benchmarks.contamination import find_contamination
from tests.anthropic_loopback import AnthropicLoopback, RecordedRequest, Reply

JUDGE_ENV = (
    "ANTHROPIC_API_KEY", "A2RL_JUDGE_BASE_URL", "A2RL_JUDGE_MODEL", "A2RL_JUDGE_REFERENCE_MODEL",
    "A2RL_JUDGE_TEMPERATURE",
)  # fmt: skip


@pytest.fixture(scope="module")
def offline() -> TaskData:
    """The offline split as `prepare()` writes it (it calls `load_offline()`, which rebuilds the split and
    checks it against data/alpacaeval/split-offline.json)."""
    prepared = AlpacaEval().prepare("offline")
    return TaskData(
        train=read_jsonl(prepared.public_dir / "train.jsonl"),
        validation=read_jsonl(prepared.private_dir / "validation.jsonl"),
        test=read_jsonl(prepared.private_dir / "test.jsonl"),
        source=prepared.manifest["source"],
    )


@pytest.fixture(scope="module")
def server():
    with AnthropicLoopback() as loopback:
        yield loopback


@pytest.fixture
def loopback(server: AnthropicLoopback) -> AnthropicLoopback:
    server.reset()
    server.responder, server.script = None, None
    return server


def _judge(loopback: AnthropicLoopback, cache_dir: Path, max_retries: int = 3) -> PairwiseJudge:
    config = JudgeConfig(model="judge-under-test", base_url=loopback.base_url, temperature=0.0)
    return PairwiseJudge(config, api_key="test-key", cache=JudgeCache(cache_dir), max_retries=max_retries)


def _responses(request: RecordedRequest) -> tuple[str, str]:
    a = re.search(r"<response_A>\n(.*?)\n</response_A>", request.prompt, re.DOTALL)
    b = re.search(r"<response_B>\n(.*?)\n</response_B>", request.prompt, re.DOTALL)
    return a.group(1), b.group(1)


def prefers_marked(request: RecordedRequest) -> str:
    a, _ = _responses(request)
    return "[[A]]" if "GOOD" in a else "[[B]]"


def prefers_longer_noisily(request: RecordedRequest) -> str:
    """A judge that cares only about length: P(A) = sigmoid(3 tanh((len A - len B) / 300)), drawn
    deterministically from a hash of the prompt."""
    a, b = _responses(request)
    p_a = 1 / (1 + np.exp(-3 * np.tanh((len(a) - len(b)) / 300)))
    draw = int(hashlib.sha256(request.prompt.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "[[A]]" if draw < p_a else "[[B]]"


# -- data ----------------------------------------------------------------------------------------


def test_offline_eval_is_mtbench_first_turns_split_by_category(offline: TaskData) -> None:
    assert (len(offline.train), len(offline.validation), len(offline.test)) == (2000, 16, 64)
    categories = [i["category"] for i in offline.validation]
    assert sorted(set(categories)) == sorted({i["category"] for i in offline.test}) and len(set(categories)) == 8
    assert all(categories.count(c) == 2 for c in categories)
    evaluation = offline.validation + offline.test
    assert sorted(i["id"] for i in evaluation) == [f"mtbench-{q:03d}" for q in range(81, 161)]
    with_reference = [i for i in evaluation if i["answer"]]
    assert len(with_reference) == 30 and {i["category"] for i in with_reference} == {"math", "reasoning", "coding"}
    assert all(i["reference_source"].startswith("gpt-4") for i in with_reference)
    first = next(i for i in evaluation if i["id"] == "mtbench-081")
    assert first["question"].startswith("Compose an engaging travel blog post about a recent trip to Hawaii")


def test_offline_train_is_question_answer_pairs_disjoint_from_evaluation(offline: TaskData) -> None:
    assert all(row["question"] and row["answer"] and row["id"].startswith("sharegpt-") for row in offline.train)
    assert len({row["id"] for row in offline.train}) == 2000
    held = {"validation": offline.validation, "test": offline.test}
    assert find_contamination(offline.train, held) == []
    assert "dropped by the contamination guard" in offline.source


def test_prepare_keeps_evaluation_items_private(offline: TaskData) -> None:
    prepared = AlpacaEval().prepare("offline")
    assert sorted(p.name for p in prepared.public_dir.iterdir()) == ["sft.jsonl", "train.jsonl"]
    public_text = "".join((prepared.public_dir / name).read_text() for name in ("train.jsonl", "sft.jsonl"))
    for item in offline.validation + offline.test:
        assert json.dumps(item["question"], ensure_ascii=False)[1:-1] not in public_text


def test_offline_split_must_match_the_committed_manifest(tmp_path: Path) -> None:
    committed = json.loads(OFFLINE_MANIFEST.read_text())
    ids = committed["ids"]
    ids["test"][0], ids["validation"][0] = ids["validation"][0], ids["test"][0]
    path = tmp_path / "split.json"
    path.write_text(json.dumps(committed))
    with pytest.raises(AlpacaEvalDataError, match="does not reproduce"):
        load_offline(path)


def test_truncated_sharegpt_file_yields_only_complete_records(tmp_path: Path) -> None:
    records = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(3)]
    text = json.dumps(records, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"c2"') + 2])
    assert [r["id"] for r in sharegpt_conversations(path)] == ["c0", "c1"]
    path.write_text(text)
    assert [r["id"] for r in sharegpt_conversations(path)] == ["c0", "c1", "c2"]


def test_full_variant_from_rows_in_the_hf_formats_drops_contaminated_training_rows() -> None:
    eval_rows = [
        {"instruction": f"Evaluation prompt number {i}.", "output": f"Reference {i}.", "generator": "gpt4",
         "dataset": "helpful_base"}
        for i in range(805)
    ]  # fmt: skip
    train_rows = [
        {"instruction": f"Training instruction {i}.", "input": "x" if i % 2 else "", "output": f"Out {i}.",
         "text": "..."}
        for i in range(2100)
    ]  # fmt: skip
    train_rows[5].update(instruction="evaluation PROMPT number 17", input="")  # a planted evaluation item
    data = full_task_data(train_rows, eval_rows)
    assert (len(data.train), len(data.validation), len(data.test)) == (2000, 105, 700)
    assert "alpaca-train-00005" not in {row["id"] for row in data.train}
    assert data.train[1]["question"] == "Training instruction 1.\n\nx" and data.train[1]["answer"] == "Out 1."
    assert {i["answer"] for i in data.test} <= {f"Reference {i}." for i in range(805)}
    assert "1 pool row(s) dropped" in data.source and "alpaca-train-00005" in data.source


def test_full_variant_without_hub_access_says_so() -> None:
    with pytest.raises(AlpacaEvalDataError, match="needs internet"):
        load_full()


# -- configuration ---------------------------------------------------------------------------------


def test_no_judge_configured_is_an_error_naming_the_variables(monkeypatch) -> None:
    for name in JUDGE_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(JudgeNotConfigured, match="ANTHROPIC_API_KEY.*A2RL_JUDGE_MODEL.*A2RL_JUDGE_BASE_URL"):
        JudgeConfig.from_env()
    task = get_task("alpacaeval")
    assert task.evaluator_id().endswith("/judge-unconfigured")
    with pytest.raises(JudgeNotConfigured):
        task.build_prompt({"id": "x", "question": "Say hi."})


def test_evaluation_without_a_judge_fails_before_generating(monkeypatch) -> None:
    from a2rl_bench.inference.evaluation import EvalSpec, evaluate

    for name in JUDGE_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(JudgeNotConfigured, match="ANTHROPIC_API_KEY"):
        evaluate(Path("/no/such/checkpoint"), EvalSpec.of(AlpacaEval(), "offline", "validation", 2))


def test_judge_config_from_environment(monkeypatch) -> None:
    for name in JUDGE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    anthropic_api = JudgeConfig.from_env()
    assert anthropic_api.model == "claude-sonnet-4-5" and anthropic_api.temperature is None
    monkeypatch.setenv("A2RL_JUDGE_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("A2RL_JUDGE_MODEL", "open-judge")
    endpoint = JudgeConfig.from_env()
    assert endpoint.temperature == 0.0 and endpoint.writer_model == "open-judge"
    assert endpoint.label() == f"open-judge@http://127.0.0.1:9/{JUDGE_PROMPT_VERSION}/t0/ref-open-judge"
    monkeypatch.setenv("A2RL_JUDGE_TEMPERATURE", "none")
    assert JudgeConfig.from_env().temperature is None


@pytest.mark.parametrize(
    ("text", "verdict"),
    [("[[A]]", "A"), (" [[B]]\n", "B"), ("B", "B"), ("Response A is clearer. [[A]]", "A"), ("[[ B ]]", "B"),
     ("[[A]] ... no, [[B]]", None), ("Both are fine.", None), ("", None), ("[[C]]", None)],
)  # fmt: skip
def test_verdict_parsing(text: str, verdict: str | None) -> None:
    assert parse_verdict(text) == verdict


# -- the judge over HTTP ---------------------------------------------------------------------------


def test_both_orders_are_judged_with_the_pinned_prompt(loopback: AnthropicLoopback, tmp_path: Path) -> None:
    loopback.responder = prefers_marked
    comparison = _judge(loopback, tmp_path).compare("Name a colour.", "GOOD: blue", "green")
    assert comparison.value == 1.0
    assert [_responses(r) for r in loopback.requests] == [("GOOD: blue", "green"), ("green", "GOOD: blue")]
    body = loopback.requests[0].body
    assert body["model"] == "judge-under-test" and body["system"] == JUDGE_SYSTEM
    assert body["temperature"] == 0.0 and body["max_tokens"] == 16
    assert "<instruction>\nName a colour.\n</instruction>" in loopback.requests[0].prompt
    assert comparison.model_first.input_tokens > 0 and comparison.model_first.output_tokens == 1


def test_position_bias_cancels_out(loopback: AnthropicLoopback, tmp_path: Path) -> None:
    loopback.responder = lambda request: "[[A]]"  # always the first answer shown
    assert _judge(loopback, tmp_path).compare("Q", "model answer", "reference answer").value == 0.5


def test_rerun_is_served_from_the_cache(loopback: AnthropicLoopback, tmp_path: Path) -> None:
    loopback.responder = prefers_marked
    first = _judge(loopback, tmp_path).compare("Q", "GOOD one", "other")
    assert len(loopback.requests) == 2
    again = _judge(loopback, tmp_path).compare("Q", "GOOD one", "other")  # a new process would do the same
    assert len(loopback.requests) == 2
    assert again.value == first.value == 1.0 and again.model_first.cached and again.reference_first.cached
    assert again.model_first.input_tokens == 0
    other_model = PairwiseJudge(
        JudgeConfig(model="another-judge", base_url=loopback.base_url, temperature=0.0),
        api_key="k", cache=JudgeCache(tmp_path),
    )  # fmt: skip
    other_model.compare("Q", "GOOD one", "other")
    assert len(loopback.requests) == 4


def test_overloaded_judge_is_retried(loopback: AnthropicLoopback, tmp_path: Path) -> None:
    loopback.responder = prefers_marked
    loopback.fail_next(529, times=2)
    comparison = _judge(loopback, tmp_path).compare("Q", "GOOD", "bad")
    assert comparison.value == 1.0
    assert [r.status for r in loopback.requests] == [529, 529, 200, 200]


def test_no_verdict_is_recorded_as_such_and_not_cached(loopback: AnthropicLoopback, tmp_path: Path) -> None:
    loopback.responder = lambda request: "Both answers have merits."
    judge = _judge(loopback, tmp_path)
    comparison = judge.compare("Q", "a", "b")
    assert comparison.value is None and "no [[A]] / [[B]] verdict" in comparison.model_first.error
    judge.compare("Q", "a", "b")
    assert len(loopback.requests) == 4  # asked again, not served a cached non-answer
    loopback.responder = lambda request: Reply("", stop_reason="refusal")
    assert judge.compare("Q2", "a", "b").model_first.error == "the model refused"


def test_judge_down_after_retries_gives_no_verdict_not_a_loss(loopback: AnthropicLoopback, tmp_path: Path) -> None:
    loopback.fail_next(500, times=100)
    comparison = _judge(loopback, tmp_path, max_retries=1).compare("Q", "a", "b")
    assert comparison.value is None and "InternalServerError" in comparison.model_first.error


def test_bad_key_stops_the_evaluation(loopback: AnthropicLoopback, tmp_path: Path) -> None:
    loopback.fail_next(401, times=10)
    with pytest.raises(JudgeError, match="AuthenticationError"):
        _judge(loopback, tmp_path).compare("Q", "a", "b")


# -- scoring and the metric ----------------------------------------------------------------------


def test_score_item_on_real_items(loopback: AnthropicLoopback, tmp_path: Path, offline: TaskData) -> None:
    loopback.responder = prefers_marked
    task = AlpacaEval(judge=_judge(loopback, tmp_path))
    with_reference = next(i for i in offline.test if i["answer"])
    win = task.score_item(with_reference, "GOOD: a careful answer")
    assert win.value == 1.0 and win.correct and win.prediction == "win"
    assert win.detail["reference_length"] == len(with_reference["answer"].strip())
    assert win.detail["model_first"]["winner"] == "A" and win.detail["reference_first"]["winner"] == "B"
    requests_so_far = len(loopback.requests)
    empty = task.score_item(with_reference, "   ")
    same = task.score_item(with_reference, with_reference["answer"])
    assert (empty.value, same.value) == (0.0, 0.5) and len(loopback.requests) == requests_so_far


def test_missing_reference_is_written_once_by_the_reference_model(
    loopback: AnthropicLoopback, tmp_path: Path, offline: TaskData
) -> None:
    def respond(request: RecordedRequest) -> str:
        return "A thorough reference answer." if "system" not in request.body else prefers_marked(request)

    loopback.responder = respond
    task = AlpacaEval(judge=_judge(loopback, tmp_path))
    item = next(i for i in offline.test if not i["answer"])
    result = task.score_item(item, "GOOD reply")
    writer = loopback.requests[0].body
    assert writer["messages"] == [{"role": "user", "content": item["question"]}] and writer["max_tokens"] == 1024
    assert result.value == 1.0 and result.detail["reference_source"] == "judge-under-test"
    assert result.detail["reference_length"] == len("A thorough reference answer.")
    task.score_item(item, "GOOD reply")
    assert len(loopback.requests) == 3  # reference + two orders; the re-run is all cache


def test_length_controlled_win_rate_removes_a_pure_length_preference(
    loopback: AnthropicLoopback, tmp_path: Path
) -> None:
    rng = np.random.default_rng(7)
    n = 120
    reference_lengths = rng.integers(100, 700, n)
    model_lengths = np.maximum(1, reference_lengths + rng.normal(250, 300, n)).astype(int)
    items = [{"id": f"i{k}", "question": f"Question {k}", "answer": "r" * int(reference_lengths[k])} for k in range(n)]
    completions = ["m" * int(length) for length in model_lengths]
    loopback.responder = prefers_longer_noisily
    task = AlpacaEval(judge=_judge(loopback, tmp_path))
    results = task.score_items(items, completions)
    summary = task.summarize(results)
    assert summary["n_judged"] == n and summary["n_no_verdict"] == 0
    assert summary["win_rate"] > 70 and summary["length_slope"] > 1
    assert abs(summary["lc_win_rate"] - 50) < 12
    assert task.aggregate(results) == summary["lc_win_rate"]


def test_lc_win_rate_on_synthetic_data_with_known_answers() -> None:
    rng = np.random.default_rng(0)
    n = 400
    diff = rng.normal(300, 400, n)
    p_length_only = 1 / (1 + np.exp(-3 * np.tanh(diff / diff.std())))
    length_only = win_rates(list((rng.random(n) < p_length_only).astype(float)), list(diff.astype(int)), [0] * n)
    assert length_only.win_rate > 70 and abs(length_only.lc_win_rate - 50) < 6
    better = win_rates(list((rng.random(n) < 0.7).astype(float)), list(diff.astype(int)), [0] * n)
    assert abs(better.lc_win_rate - better.win_rate) < 6 and abs(better.lc_win_rate - 70) < 7
    same_length = win_rates([1.0, 0.0, 0.5, 1.0], [10] * 4, [10] * 4)
    assert same_length.win_rate == 62.5 and abs(same_length.lc_win_rate - 62.5) < 1.0


def test_items_without_verdict_are_left_out_and_counted() -> None:
    task = AlpacaEval()

    def result(value: float | None) -> ItemResult:
        return task._result({"id": "x"}, "c", value, {"model_length": 10, "reference_length": 10})

    summary = task.summarize([result(1.0), result(None), result(0.0), result(1.0)])
    assert summary["n_judged"] == 3 and summary["n_no_verdict"] == 1 and summary["win_rate"] == pytest.approx(200 / 3)
    with pytest.raises(JudgeError, match="no verdict on any of 2 items"):
        task.aggregate([result(None), result(None)])


def test_describe_task_names_the_judge_or_what_is_missing(monkeypatch, offline: TaskData) -> None:
    from a2rl_bench.benchmarks.describe import describe_task

    for name in JUDGE_ENV:
        monkeypatch.delenv(name, raising=False)
    text = describe_task("alpacaeval")
    assert "train 2000, validation 16, test 64" in text and "length-controlled win rate" in text
    assert "judge: NOT CONFIGURED: set ANTHROPIC_API_KEY or A2RL_JUDGE_BASE_URL" in text
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    assert f"judge: claude-sonnet-4-5/{JUDGE_PROMPT_VERSION}/ref-claude-sonnet-4-5" in describe_task("alpacaeval")
