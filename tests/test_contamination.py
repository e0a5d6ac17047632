"""Contamination guard: exact and 13-gram matches between held-out and agent-visible items."""

from __future__ import annotations

import pytest

from a2rl_bench.benchmarks.base import TaskData
from a2rl_bench.benchmarks.contamination import (
    ContaminationError,
    check_contamination,
    drop_contaminated,
    find_contamination,
    ngrams,
    normalize_text,
)

PASSAGE = (
    "A farmer plants seventeen rows of corn with twenty three stalks in each row and then sells "
    "half of the harvest at the market on Saturday morning"
)


def _item(item_id: str, question: str, answer: str = "") -> dict:
    return {"id": item_id, "question": question, "answer": answer}


def _data(train: list[dict], validation: list[dict] | None = None, test: list[dict] | None = None) -> TaskData:
    return TaskData(train=train, validation=validation or [], test=test or [], source="planted")


def test_normalisation_ignores_case_punctuation_and_whitespace() -> None:
    assert normalize_text("  What IS 2+2?\n") == normalize_text("what is 2 + 2") == "what is 2 2"
    assert list(ngrams("one two three", 2)) == ["one two", "two three"]
    assert list(ngrams("too short", 13)) == []


def test_planted_exact_duplicate_is_named_in_the_error() -> None:
    held = _item("test-7", "How many apples does Tom have left after eating three?")
    planted = _item("train-42", "how many APPLES does tom have left, after eating three")
    data = _data([_item("train-1", "Unrelated question"), planted], test=[held])
    with pytest.raises(ContaminationError) as raised:
        check_contamination(data, "planted-task")
    message = str(raised.value)
    assert "planted-task" in message and "test-7" in message and "train-42" in message and "exact" in message
    assert [(h.held_out_id, h.visible_id, h.kind) for h in raised.value.hits] == [("test-7", "train-42", "exact")]


def test_planted_passage_inside_a_visible_answer_is_found_by_ngram() -> None:
    held = _item("val-3", PASSAGE + ". How many stalks are sold?")
    visible = _item("train-9", "Write a story.", "Once upon a time: " + PASSAGE.upper() + "! The end.")
    hits = find_contamination([visible], {"validation": [held]})
    assert len(hits) == 1
    assert hits[0].held_out_split == "validation" and hits[0].kind == "ngram"
    assert len(hits[0].evidence.split()) == 13 and hits[0].evidence in normalize_text(PASSAGE)
    with pytest.raises(ContaminationError, match="val-3"):
        check_contamination(_data([visible], validation=[held]))


def test_twelve_shared_words_are_not_contamination() -> None:
    twelve = " ".join(PASSAGE.split()[:12])
    held = _item("test-1", twelve + " zebra")
    visible = _item("train-1", "quokka " + twelve)
    assert find_contamination([visible], {"test": [held]}) == []
    assert find_contamination([visible], {"test": [held]}, n=12) != []


def test_clean_data_passes_through_unchanged() -> None:
    data = _data([_item("a", "Add 2 and 3.")], [_item("b", "Multiply 4 by 5.")], [_item("c", "Divide 9 by 3.")])
    assert check_contamination(data) is data


def test_allow_list_accepts_only_the_reviewed_pair() -> None:
    held = _item("test-1", PASSAGE)
    data = _data([_item("train-1", PASSAGE), _item("train-2", PASSAGE)], test=[held])
    with pytest.raises(ContaminationError) as raised:
        check_contamination(data, allow={("test-1", "train-1")})
    assert [h.visible_id for h in raised.value.hits] == ["train-2"]


def test_drop_contaminated_filters_a_pool_and_reports_what_it_dropped() -> None:
    held = {"test": [_item("test-1", PASSAGE)]}
    pool = [_item(f"p{i}", f"Clean question {i}") for i in range(5)]
    pool.insert(2, _item("dirty", "Q", "Quote: " + PASSAGE))
    kept, dropped = drop_contaminated(pool, held)
    assert [i["id"] for i in kept] == ["p0", "p1", "p2", "p3", "p4"]
    assert [(h.held_out_id, h.visible_id) for h in dropped] == [("test-1", "dirty")]
    kept, _ = drop_contaminated(pool, held, limit=3)
    assert [i["id"] for i in kept] == ["p0", "p1", "p2"]


def test_gsm8k_offline_split_has_one_sibling_pair() -> None:
    """Evidence for wiring the guard into gsm8k: its committed offline split has exactly one 13-gram pair,
    two versions of the same locker problem (test 558 asks forwards what train 418 asks backwards)."""
    from a2rl_bench.benchmarks.gsm8k.task import load_offline

    data = load_offline()
    hits = find_contamination(data.train, {"validation": data.validation, "test": data.test})
    assert [(h.held_out_split, h.held_out_id, h.visible_id) for h in hits] == [
        ("test", "gsm8k-test-0558", "gsm8k-test-0418")
    ]
