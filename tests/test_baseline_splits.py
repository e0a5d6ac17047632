"""The baseline's two splits in one evaluation process (issue 48, item 5).

On `cpu-fp32` with the default batch a prompt's answer does not depend on its company, so a run whose baseline
still needs both splits evaluates them in one process (one model load, one batch) and records them exactly as two
evaluations would: a ledger line, a cache entry, a file and a score per split. Anywhere else, or with a split
already recorded or cached, each split is evaluated alone as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from a2rl_bench.benchmarks import get_task
from a2rl_bench.inference import evaluation
from a2rl_bench.inference.evaluation import EvalCache, EvalSpec, evaluate, evaluate_cached, shares_one_process
from a2rl_bench.isolation import procs
from a2rl_bench.ops.progress import EVAL_PROGRESS_FILE, ItemProgress, RunProgress, Snapshot, baseline_items
from a2rl_bench.base_models.hashing import weights_hash
from a2rl_bench.records import EvalResult, RunConfig
from a2rl_bench.run import RunContext, write_manifest
from a2rl_bench.store.results import ResultsStore
from a2rl_bench.tasks.run_steps import book_of, evaluate_baseline
from a2rl_bench.workspace import RunPaths

VAL, TEST = 3, 4


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """An evaluation cache of this test's own: the tiny model's weights hash is the same in every test."""
    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "a2rl-home"))
    get_task("gsm8k").prepare("offline")


@pytest.fixture
def starts(monkeypatch) -> list[list[str]]:
    """The evaluation processes the baseline starts: each one's command line (its `--split`s)."""
    seen: list[list[str]] = []
    record = procs.record_started

    def counted(started, *args, **kwargs):
        seen.append(Path(f"/proc/{started.pid}/cmdline").read_bytes().decode(errors="replace").split("\0"))
        return record(started, *args, **kwargs)

    monkeypatch.setattr(procs, "record_started", counted)
    return seen


def _run(tmp_path: Path, **options) -> RunContext:
    config = RunConfig(task="gsm8k", val_limit=VAL, test_limit=TEST, **options)
    ctx = RunContext(run_id="r", config=config, paths=RunPaths.for_run(tmp_path / "runs", "r"),
                     results_path=tmp_path / "results.duckdb", variant_label="offline")  # fmt: skip
    ctx.paths.create()
    write_manifest(ctx)
    ResultsStore(ctx.results_path).start_run(ctx.run_id, config, str(ctx.paths.harness_dir), ctx.variant_label)
    return ctx


def _splits(cmdline: list[str]) -> list[str]:
    return [cmdline[i + 1] for i, arg in enumerate(cmdline) if arg == "--split"]


def _spec(ctx: RunContext, split: str) -> EvalSpec:
    return EvalSpec.for_run(ctx.config, split, get_task("gsm8k"))


def test_both_splits_to_do_share_one_process_and_are_recorded_as_two_evaluations(
    tmp_path, tiny_model_dir, own_cache, starts
):
    ctx = _run(tmp_path)
    heard: list[dict] = []
    scores = evaluate_baseline.fn(ctx, tiny_model_dir, progress=lambda **kw: heard.append(kw))

    assert [_splits(c) for c in starts] == [["validation", "test"]]  # one evaluation process for both
    lines = [e for e in book_of(ctx).entries() if e.kind == "baseline"]
    assert [e.split for e in lines] == ["validation", "test"]
    base_hash = weights_hash(tiny_model_dir)
    for line in lines:
        alone = evaluate(tiny_model_dir, _spec(ctx, line.split))  # the per-split path, in this process
        cached = EvalCache().lookup(base_hash, _spec(ctx, line.split))
        saved = EvalResult.model_validate_json(
            (ctx.paths.harness_dir / "evaluations" / f"baseline-0-{line.split}.json").read_bytes())
        for result in (cached, saved):
            assert result is not None and result.n == alone.n == (VAL if line.split == "validation" else TEST)
            assert result.score == alone.score == line.score == scores[line.split]
            assert [i.completion for i in result.items] == [i.completion for i in alone.items]
            assert result.evaluator_id == alone.evaluator_id and result.batch_size == VAL + TEST
            assert result.shared_with == ["test" if line.split == "validation" else "validation"]
        assert line.weights_hash == base_hash and line.cached is False and line.detail["eval_sha256"]
    assert {i.completion for line in lines for i in EvalCache().lookup(base_hash, _spec(ctx, line.split)).items}
    # A later evaluation of one split of the same model hits its entry: no process.
    hit = evaluate_cached(tiny_model_dir, base_hash, _spec(ctx, "test"))
    assert hit.cached and hit.score == scores["test"] and len(starts) == 1
    # Progress counts both splits' items toward the total the display shows.
    assert heard[0] == {"baseline_done": 0, "baseline_total": VAL + TEST, "baseline_split": "validation+test"}
    items = ItemProgress.model_validate_json((ctx.paths.harness_dir / EVAL_PROGRESS_FILE).read_text())
    assert (items.what, items.done, items.total) == ("validation+test", VAL + TEST, VAL + TEST)
    shown = Snapshot(RunProgress(run_id="r", harness_dir=ctx.paths.harness_dir, phase="baseline",
                                 **heard[0]), items=items.model_copy(update={"done": 2}))  # fmt: skip
    assert baseline_items(shown)[0] == 2


def test_a_recorded_split_is_kept_and_only_the_other_is_evaluated_alone(tmp_path, tiny_model_dir, own_cache, starts):
    ctx = _run(tmp_path)
    kept = evaluate(tiny_model_dir, _spec(ctx, "validation")).model_copy(update={"score": 42.0})
    book_of(ctx).record_scored(kept, kind="baseline", split="validation", weights_hash=weights_hash(tiny_model_dir))
    scores = evaluate_baseline.fn(ctx, tiny_model_dir)
    assert [_splits(c) for c in starts] == [["test"]]
    assert scores["validation"] == 42.0
    lines = [e for e in book_of(ctx).entries() if e.kind == "baseline"]
    assert [(e.split, e.score) for e in lines][:1] == [("validation", 42.0)] and len(lines) == 2
    assert EvalCache().lookup(weights_hash(tiny_model_dir), _spec(ctx, "test")).shared_with == []


def test_a_cached_split_leaves_the_other_evaluated_alone(tmp_path, tiny_model_dir, own_cache, starts):
    ctx = _run(tmp_path)
    base_hash = weights_hash(tiny_model_dir)
    EvalCache().store(base_hash, _spec(ctx, "test"), evaluate(tiny_model_dir, _spec(ctx, "test")))
    evaluate_baseline.fn(ctx, tiny_model_dir)
    assert [_splits(c) for c in starts] == [["validation"]]
    lines = {e.split: e for e in book_of(ctx).entries() if e.kind == "baseline"}
    assert lines["test"].cached is True and lines["validation"].cached is False


def test_an_explicit_batch_evaluates_each_split_in_its_own_process(tmp_path, tiny_model_dir, own_cache, starts):
    ctx = _run(tmp_path, eval_batch_size=2)
    evaluate_baseline.fn(ctx, tiny_model_dir)
    assert [_splits(c) for c in starts] == [["validation"], ["test"]]


def test_only_the_batch_invariant_path_shares_a_process(tmp_path, own_cache, monkeypatch):
    """One place decides: the default batch on cpu-fp32, single-turn, two distinct uncached splits."""
    gsm8k = get_task("gsm8k")
    both = [EvalSpec.of(gsm8k, "offline", s, 2) for s in ("validation", "test")]
    assert shares_one_process("w", both, interactive=False)
    assert not shares_one_process("w", both[:1], interactive=False)
    assert not shares_one_process("w", [both[0], both[0]], interactive=False)
    assert not shares_one_process("w", both, interactive=True)
    for option in ({"batch_size": 16}, {"backend": "vllm"}):  # an explicit batch; vLLM schedules its own
        specs = [EvalSpec.of(gsm8k, "offline", s, 2, **option) for s in ("validation", "test")]
        assert not shares_one_process("w", specs, interactive=False)
    assert not shares_one_process("w", both, interactive=False, device="0")  # a GPU: cuda-bf16
    monkeypatch.setenv("A2RL_CPU_EVAL_DTYPE", "bf16")
    assert not shares_one_process("w", both, interactive=False)
    monkeypatch.setenv("A2RL_CPU_EVAL_DTYPE", "fp32")
    EvalCache().store("w", both[1], EvalResult(task="gsm8k", split="test", score=0.0, n=2, n_correct=0,
                                                  evaluator_id="x"))  # fmt: skip
    assert not shares_one_process("w", both, interactive=False)
    assert get_task("alfworld").plays_episodes and not gsm8k.plays_episodes
    assert evaluation.splits_label(both) == "validation+test"


def test_a_baseline_begun_ahead_of_the_run_is_recorded_as_the_runs_own(tmp_path, tiny_model_dir, own_cache,
                                                                        monkeypatch):
    """`a2rl run` begins the baseline while Prefect starts (`baseline_ahead`); the run's baseline step takes that
    evaluation's results and records them as its own (same answers, lines, files and cache entries as evaluated in
    the step), counting its items in the run's progress file, and starts no evaluation of its own."""
    from a2rl_bench.grading import record
    from a2rl_bench.tasks import baseline_ahead

    ctx = _run(tmp_path, base_model=str(tiny_model_dir))
    assert baseline_ahead.take(ctx.config) is None  # nothing begun: the step evaluates as always
    monkeypatch.setattr(baseline_ahead, "_ahead", baseline_ahead.Ahead(ctx.config, tmp_path / "p.json"))
    assert baseline_ahead.take(ctx.config.model_copy(update={"seed": 7})) is None  # begun for another run
    ahead = baseline_ahead.start(ctx.config, tmp_path)
    assert ahead is not None

    def no_second(*args, **kwargs):
        raise AssertionError("the step evaluated the baseline again")

    monkeypatch.setattr(record, "evaluate_cached_splits", no_second)
    monkeypatch.setattr(record, "evaluate_cached", no_second)
    heard: list[dict] = []
    scores = evaluate_baseline.fn(ctx, tiny_model_dir, progress=lambda **kw: heard.append(kw))

    assert len(ahead.started) == 1  # one evaluation process in all, begun ahead
    lines = [e for e in book_of(ctx).entries() if e.kind == "baseline"]
    assert [e.split for e in lines] == ["validation", "test"]
    base_hash = weights_hash(tiny_model_dir)
    for line in lines:
        alone = evaluate(tiny_model_dir, _spec(ctx, line.split))  # the per-split path, in this process
        saved = EvalResult.model_validate_json(
            (ctx.paths.harness_dir / "evaluations" / f"baseline-0-{line.split}.json").read_bytes())
        for result in (EvalCache().lookup(base_hash, _spec(ctx, line.split)), saved):
            assert result is not None and result.score == alone.score == line.score == scores[line.split]
            assert [i.completion for i in result.items] == [i.completion for i in alone.items]
        assert line.weights_hash == base_hash and line.cached is False and line.detail["eval_sha256"]
    assert heard[0] == {"baseline_done": 0, "baseline_total": VAL + TEST, "baseline_split": "validation+test"}
    assert baseline_ahead.take(ctx.config) is None  # taken once


def test_a_baseline_begun_ahead_that_failed_is_evaluated_by_the_step(tmp_path, tiny_model_dir, own_cache, starts,
                                                                     monkeypatch):  # fmt: skip
    """The early evaluation failing (here: its process never starts) costs the run nothing but the try: the
    baseline step evaluates both splits itself, in one process, as without it."""
    from a2rl_bench.inference.evaluation import EvaluationFailed
    from a2rl_bench.tasks import baseline_ahead

    def fails(*args, **kwargs):
        raise EvaluationFailed("the machine ran out of something")

    monkeypatch.setattr(baseline_ahead, "evaluate_cached_splits", fails)
    ctx = _run(tmp_path, base_model=str(tiny_model_dir))
    ahead = baseline_ahead.start(ctx.config, tmp_path)
    assert ahead is not None
    scores = evaluate_baseline.fn(ctx, tiny_model_dir)
    assert [_splits(c) for c in starts] == [["validation", "test"]]  # the step's own process
    lines = [e for e in book_of(ctx).entries() if e.kind == "baseline"]
    assert [(e.split, e.score, e.cached) for e in lines] == [("validation", scores["validation"], False),
                                                             ("test", scores["test"], False)]  # fmt: skip


def test_a_baseline_begun_ahead_that_no_step_takes_is_ended(tmp_path, tiny_model_dir, own_cache, monkeypatch):
    """Begun for another config (or not needed: the baseline recorded by an earlier attempt), the early evaluation
    is ended when the step finds it, so that it never shares the CPU with the agent's budgeted session; one ended
    before its process began ends that process as it begins."""
    import sys
    import time

    from a2rl_bench.tasks import baseline_ahead

    def long_evaluation(*args, on_start=None, **kwargs):  # stands for an evaluation process still decoding
        proc = procs.start([sys.executable, "-c", "import time; time.sleep(120)"], on_start=on_start)
        proc.wait()
        raise RuntimeError(f"the evaluation process ended ({proc.returncode})")

    monkeypatch.setattr(baseline_ahead, "evaluate_cached_splits", long_evaluation)
    ctx = _run(tmp_path, base_model=str(tiny_model_dir))
    ahead = baseline_ahead.start(ctx.config, tmp_path)
    deadline = time.monotonic() + 120
    while not ahead.started and time.monotonic() < deadline:
        time.sleep(0.1)
    (started,) = ahead.started
    assert procs.alive(started.pid, started.start_ticks)
    assert baseline_ahead.take(ctx.config.model_copy(update={"seed": 7})) is None  # another run's config
    with pytest.raises(RuntimeError, match="ended"):
        ahead.done.result(timeout=60)
    assert not procs.alive(started.pid, started.start_ticks)

    late = baseline_ahead.Ahead(ctx.config, tmp_path / "p.json")
    late.cancel()
    proc = procs.start([sys.executable, "-c", "import time; time.sleep(120)"], on_start=late.on_start)
    assert proc.wait(timeout=60) != 0  # ended as it began
