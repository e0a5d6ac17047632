"""Drafted tokens verified in one forward (issue 48): the shared-prefix batcher's rows end at the same tokens with
drafting on as off, at any batch and in any company."""

from __future__ import annotations

from pathlib import Path

import pytest

from a2rl_bench.inference import prefix_batching
from a2rl_bench.inference.generation import LoadedModel, generate, render_prompt
from a2rl_bench.inference.prefix_batching import PrefixBatcher, _Lookup, accepted
from tests.tiny_model import tiny_questions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_NEW = 40  # long enough for the tiny model's rows to fall into loops that drafting can follow


@pytest.fixture(scope="module")
def rows(tiny: LoadedModel) -> tuple[list[int], list[list[int]]]:
    """Token ids of 12 prompts behind one long system message: the shared prefix and each row's suffix."""
    system = " ".join(tiny_questions(20, 26))
    texts = [render_prompt(tiny.tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": q}])
             for q in tiny_questions(0, 12)]  # fmt: skip
    ids = [tiny.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    p = next(i for i in range(min(map(len, ids))) if len({r[i] for r in ids}) > 1)
    return ids[0][:p], [r[p:] for r in ids]


class Spy:
    """What the drafted steps did: drafts fed, the tokens each verified row kept, and the runs of tokens each row's
    drafts were extended by (the first: its prompt and first token)."""

    def __init__(self, monkeypatch):
        self.fed, self.kept, self.runs, self.rows = 0, [], [], []
        verify, accept, extend = PrefixBatcher._verify, prefix_batching.accepted, _Lookup.extend

        def extended(lookup, new):
            self.runs.append(list(new))
            return extend(lookup, new)

        def counted_verify(batcher, f, fed, *args):
            self.fed += sum(len(x) - 1 for x in fed)
            self.rows.append(len(fed))
            return verify(batcher, f, fed, *args)

        def kept(drafts, greedy):
            self.kept.append(accept(drafts, greedy))
            return self.kept[-1]

        monkeypatch.setattr(PrefixBatcher, "_verify", counted_verify)
        monkeypatch.setattr(prefix_batching, "accepted", kept)
        monkeypatch.setattr(_Lookup, "extend", extended)

    @property
    def drafts_kept(self) -> int:
        return sum(len(k) - 1 for k in self.kept)


def _decode(model, rows, draft: bool, slots: int = 4, max_new: int = MAX_NEW, finished=None) -> list[list[int]]:
    prefix, suffixes = rows
    eos = model.generation_config.eos_token_id
    finished = finished or (lambda t: t[-1] == eos)
    return PrefixBatcher(model).decode(prefix, suffixes, max_new, slots, finished, draft=draft)


def test_a_row_drafts_what_followed_its_last_ngram_latest_in_its_own_tokens(monkeypatch) -> None:
    monkeypatch.setattr(prefix_batching, "DRAFT_NGRAM", 2)
    monkeypatch.setattr(prefix_batching, "DRAFT_TOKENS", 8)
    assert _Lookup([7, 1, 2, 3, 4]).draft(8) == []  # (3, 4) was not seen before
    chance = _Lookup([7, 1, 2, 4, 5, 1, 2, 3, 8, 9, 1, 2])
    assert chance.draft(8) == [3]  # the latest (1, 2) is followed by 3 (not the first one's 4); nothing agrees before
    loop = _Lookup([5, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    assert loop.draft(8) == [3, 4, 1, 2, 3]  # 4 tokens agree before the 2-gram: 5 drafts, the loop past the end
    assert loop.draft(2) == [3, 4] and loop.draft(0) == []
    loop.extend([3])
    assert loop.draft(8) == [4, 1, 2, 3, 4, 1]
    monkeypatch.setattr(prefix_batching, "DRAFT_TOKENS", 3)
    assert loop.draft(8) == [4, 1, 2]


def test_the_greedy_chain_keeps_the_drafts_it_confirms_then_its_own_next_token() -> None:
    assert accepted([5, 6, 7], [5, 6, 9, 1]) == [5, 6, 9]
    assert accepted([5, 6, 7], [4, 6, 7, 1]) == [4]
    assert accepted([5, 6], [5, 6, 3]) == [5, 6, 3]
    assert accepted([], [8]) == [8]


@pytest.fixture
def unigrams(monkeypatch) -> None:
    """The tiny model seldom repeats a 3-gram of its own; a 1-gram match makes its rows draft often, and its drafts
    are then kept and rejected alike."""
    monkeypatch.setattr(prefix_batching, "DRAFT_NGRAM", 1)


@pytest.mark.usefixtures("unigrams")
def test_drafting_gives_the_tiny_models_rows_the_same_tokens(tiny, rows, monkeypatch) -> None:
    off = _decode(tiny.model, rows, draft=False)
    spy = Spy(monkeypatch)
    on = _decode(tiny.model, rows, draft=True)
    assert on == off
    assert spy.drafts_kept >= 5 and spy.fed > 2 * spy.drafts_kept  # drafts really ran, many were rejected


def _ended_inside_a_kept_draft(tiny, rows, monkeypatch) -> tuple[list[int], list[int]]:
    """A row alone and its drafted tokens up to one appended as a kept draft with more after it in that step."""
    for suffix in rows[1]:
        spy = Spy(monkeypatch)
        tokens = _decode(tiny.model, (rows[0], [suffix]), draft=True, slots=1)[0]
        at = 1  # the first token comes from the prompt's prefill, the rest in runs of the decode steps
        for run in spy.runs[1:]:
            if len(run) >= 2:  # run[0] is a kept draft, run[1:] came in the same forward
                return suffix, tokens[: at + 1]
            at += len(run)
    raise AssertionError("no row kept a draft")


@pytest.mark.usefixtures("unigrams")
@pytest.mark.parametrize("limit", ["finished", "max_new_tokens"])
def test_a_row_that_ends_inside_a_kept_draft_ends_at_the_same_token(tiny, rows, monkeypatch, limit) -> None:
    """A stop (or the token cap) that falls on a kept draft, not on the step's last token: the row is cut there."""
    suffix, target = _ended_inside_a_kept_draft(tiny, rows, monkeypatch)
    if limit == "finished":
        kwargs = {"finished": lambda t: t == target}
    else:
        kwargs = {"max_new": len(target)}
    on = _decode(tiny.model, (rows[0], [suffix]), draft=True, slots=1, **kwargs)
    off = _decode(tiny.model, (rows[0], [suffix]), draft=False, slots=1, **kwargs)
    assert on == off == [target]


@pytest.mark.usefixtures("unigrams")
def test_rows_draft_only_in_steps_of_few_rows(tiny, rows, monkeypatch) -> None:
    """Past `DRAFT_MAX_ROWS` rows a step is one token a row (a draft's compute outweighs its share of the weights'
    stream there); the step where the batch has shrunk to that many drafts again, with the same tokens."""
    monkeypatch.setattr(prefix_batching, "DRAFT_MAX_ROWS", 4)
    spy = Spy(monkeypatch)
    gated = _decode(tiny.model, rows, draft=True, slots=8)  # 12 rows: 8 at first, the last 4 after them
    assert spy.rows and max(spy.rows) <= 4 and spy.drafts_kept > 0
    assert gated == _decode(tiny.model, rows, draft=False, slots=8)
    monkeypatch.setattr(prefix_batching, "DRAFT_MAX_ROWS", 8)
    wide = Spy(monkeypatch)
    assert _decode(tiny.model, rows, draft=True, slots=8) == gated and max(wide.rows) > 4


@pytest.mark.usefixtures("unigrams")
def test_drafted_answers_do_not_depend_on_the_batch_or_its_company(tiny, rows, monkeypatch) -> None:
    spy = Spy(monkeypatch)
    alone = {b: _decode(tiny.model, rows, draft=True, slots=b) for b in (1, 4, 16)}
    assert alone[1] == alone[4] == alone[16] and spy.drafts_kept > 0
    prefix, suffixes = rows
    crowd = suffixes[6:] + suffixes[:6][::-1] + suffixes[8:]  # others around them, in another order
    among = _decode(tiny.model, (prefix, crowd), draft=True, slots=5)[len(suffixes) - 6 : len(suffixes)][::-1]
    assert among == alone[1][:6]
    assert len({tuple(t) for t in alone[1]}) > 1


def _default_base_model() -> Path | None:
    from a2rl_bench.base_models.registry import resolve_base_model

    try:
        path = resolve_base_model("smollm2-135m-instruct")
    except Exception:  # noqa: BLE001 - not on this machine (offline): the tiny model's tests still run
        return None
    return path if (path / "model.safetensors").is_file() else None


def test_drafting_gives_the_default_base_models_gsm8k_items_the_same_completions(monkeypatch) -> None:
    """The default run's first validation items on the default base model (the grader's own fp32 forward): the
    first falls into a loop ("The next 6 months were $X a month, ...") within the first 32 tokens."""
    from a2rl_bench.benchmarks import get_task
    from a2rl_bench.inference.generation import load_model

    model_dir = _default_base_model()
    if model_dir is None:
        pytest.skip("the default base model is not on this machine (offline)")
    task = get_task("gsm8k")
    task.prepare("offline")
    conversations = [task.build_prompt(item) for item in task.load_split("offline", "validation", 2)]
    loaded = load_model(model_dir, "cpu", own_forward=True)
    d = task.decoding
    out = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(prefix_batching.DRAFT_ENV, mode)
        spy = Spy(monkeypatch)
        out[mode] = generate(loaded, conversations, max_new_tokens=32, temperature=0.0, stop=d.stop, batch_size=2)
    assert not loaded.model.__dict__.get("_a2rl_batcher_failed")  # a failed batcher would hand over to `generate`
    assert out["1"].completions == out["0"].completions
    assert out["1"].completion_tokens == out["0"].completion_tokens
    assert spy.drafts_kept > 10, spy.drafts_kept
