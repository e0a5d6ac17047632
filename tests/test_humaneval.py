"""HumanEval task: the 82/82 split, the HF-format full variant, the prompt, code extraction and the sandbox."""

from __future__ import annotations

import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from a2rl_bench.benchmarks import get_task
from a2rl_bench.benchmarks.base import TaskData, read_jsonl
from a2rl_bench.benchmarks.humaneval import HumanEval, SandboxBroken, SandboxLimits, execution, extract_code, isolation
from a2rl_bench.benchmarks.humaneval.task import (
    HumanEvalDataError,
    build_split_manifest,
    full_task_data,
    load_full,
    load_offline,
    read_offline_rows,
    read_split_manifest,
)

HF_COLUMNS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


@pytest.fixture(scope="module")
def offline() -> TaskData:
    return load_offline()


@pytest.fixture(scope="module")
def items(offline: TaskData) -> dict[str, dict]:
    return {item["id"]: item for item in offline.train + offline.validation + offline.test}


@pytest.fixture(scope="module")
def strict() -> HumanEval:
    """Short limits, so that the hostile programs below cost 2 s each."""
    return HumanEval(limits=SandboxLimits(timeout_s=2.0))


# -- data ----------------------------------------------------------------------------------------


def test_split_is_the_papers_82_82_with_16_validation_kept_back(offline: TaskData) -> None:
    ids = {name: [i["id"] for i in getattr(offline, name)] for name in ("train", "validation", "test")}
    assert {k: len(v) for k, v in ids.items()} == {"train": 66, "validation": 16, "test": 82}
    assert ids["test"] == [f"HumanEval/{i}" for i in range(82, 164)]
    assert sorted(ids["train"] + ids["validation"], key=lambda s: int(s.split("/")[1])) == [
        f"HumanEval/{i}" for i in range(82)
    ]
    assert read_split_manifest() == build_split_manifest()
    assert read_split_manifest()["source"]["sha256"] in offline.source


def test_full_variant_from_rows_in_the_hf_column_format_gives_the_same_split(offline: TaskData) -> None:
    from datasets import Dataset

    rows, _ = read_offline_rows()
    fixture = Dataset.from_list([{k: row[k] for k in HF_COLUMNS} for row in rows])  # as load_dataset returns it
    full = full_task_data(fixture)
    assert [i["id"] for i in full.test] == [i["id"] for i in offline.test]
    assert [i["id"] for i in full.validation] == [i["id"] for i in offline.validation]
    assert {i["variant"] for i in full.train} == {"full"}
    with pytest.raises(HumanEvalDataError, match="does not reproduce"):
        full_task_data(list(fixture)[1:] + list(fixture)[:1])


def test_full_variant_without_hub_access_says_so() -> None:
    with pytest.raises(HumanEvalDataError, match="needs internet"):
        load_full()


def test_prepare_keeps_validation_and_test_private(offline: TaskData) -> None:
    prepared = HumanEval().prepare("offline")
    assert sorted(p.name for p in prepared.public_dir.iterdir()) == ["sft.jsonl", "train.jsonl"]
    train = read_jsonl(prepared.public_dir / "train.jsonl")
    assert train == offline.train
    public_text = "".join((prepared.public_dir / name).read_text() for name in ("train.jsonl", "sft.jsonl"))
    for item in offline.validation + offline.test:
        assert f'"{item["id"]}"' not in public_text and item["prompt"] not in public_text
    assert read_jsonl(prepared.private_dir / "test.jsonl") == offline.test


def test_train_rows_work_with_the_reference_question_answer_trainer(offline: TaskData, tmp_path: Path) -> None:
    from a2rl_bench.agents.reference_sft.train_sft import read_rows, to_conversation

    path = tmp_path / "train.jsonl"
    path.write_text(HumanEval().prepare("offline").public_dir.joinpath("train.jsonl").read_text())
    rows = read_rows(path)
    assert len(rows) == 66
    first = offline.train[0]
    assert first["answer"] == first["prompt"] + first["canonical_solution"]
    assert to_conversation(rows[0])["completion"][0]["content"].rstrip() == first["answer"].rstrip()


def test_registered_and_prompt_is_the_opencompass_instruction(items: dict[str, dict]) -> None:
    task = get_task("humaneval")
    item = items["HumanEval/82"]
    assert task.build_prompt(item) == [
        {
            "role": "user",
            "content": "Read the following function signature and docstring, and fully implement the function "
            "described. Your response should only contain the code for this function.\n" + item["prompt"],
        }
    ]
    assert task.evaluator_id().endswith("/exec-t10-m1024")


# -- code extraction -----------------------------------------------------------------------------


def test_extract_code_prefers_the_fenced_block_defining_the_function() -> None:
    reply = "Here:\n```python\nimport math\n```\nand\n```py\ndef f(x):\n    return x\n```\nDone."
    assert extract_code(reply, "f") == "def f(x):\n    return x"
    assert extract_code("```\nprint(1)\n```", "f") == "print(1)"
    assert extract_code("```python\ndef f(x):\n    return x", "f") == "def f(x):\n    return x"  # cut off
    assert extract_code("def f(x):\n    return x\n", "f") == "def f(x):\n    return x\n"


# -- scoring on real items -----------------------------------------------------------------------


def test_all_164_canonical_solutions_pass(items: dict[str, dict]) -> None:
    task = HumanEval()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda item: task.score_item(item, item["answer"]), items.values()))
    failed = [(r.item_id, r.detail["reason"]) for r in results if not r.correct]
    assert len(results) == 164 and failed == []
    assert task.aggregate(results) == 100.0


def test_reply_styles_a_chat_model_writes_all_pass(items: dict[str, dict]) -> None:
    task, item = HumanEval(), items["HumanEval/100"]
    function = item["prompt"] + item["canonical_solution"]
    flush_left_body = textwrap.dedent(item["canonical_solution"])
    for reply in (
        f"```python\n{function}\n```\nThis builds the pile level by level.",
        item["canonical_solution"],
        flush_left_body,
        f"```python\n{function}\n\nif __name__ == '__main__':\n    print(input())\n```",
    ):
        result = task.score_item(item, reply)
        assert result.correct, (reply, result.detail)


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        ("", "failed"),
        ("    return None\n", "failed"),
        ("    pass\n", "failed"),
        ("    import sys\n    sys.exit(0)\n", "failed"),
        ("    import os\n    os._exit(0)\n", "failed"),
        ("    raise SystemExit(0)\n", "failed"),
    ],
)
def test_wrong_empty_and_early_exit_bodies_fail(
    strict: HumanEval, items: dict[str, dict], reply: str, status: str
) -> None:
    result = strict.score_item(items["HumanEval/82"], reply)
    assert not result.correct and result.detail["status"] == status and result.value == 0.0


def test_exit_at_import_time_does_not_pass(strict: HumanEval, items: dict[str, dict]) -> None:
    item = items["HumanEval/82"]
    reply = "import sys\nsys.exit(0)\n" + item["prompt"] + item["canonical_solution"]
    assert not strict.score_item(item, reply).correct


def test_infinite_loop_times_out(strict: HumanEval, items: dict[str, dict]) -> None:
    result = strict.score_item(items["HumanEval/82"], "    while True:\n        pass\n")
    assert result.detail["status"] == "timeout" and result.detail["seconds"] < 6


def test_fork_bomb_is_contained(strict: HumanEval, items: dict[str, dict]) -> None:
    bomb = "    import os\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n"
    result = strict.score_item(items["HumanEval/82"], bomb)
    assert not result.correct and result.detail["seconds"] < 6
    # The machine is still usable and the next sample is scored normally.
    item = items["HumanEval/83"]
    assert strict.score_item(item, item["answer"]).correct


@pytest.mark.parametrize("namespaces", [True, False], ids=["pid-namespace", "no-namespaces"])
def test_a_program_that_starts_a_daemon_in_a_session_of_its_own_leaves_nothing_running(
    strict: HumanEval, items: dict[str, dict], monkeypatch, namespaces: bool
) -> None:
    """A timed-out program is ended with its session and everything below it (the harness's one process
    supervisor), not just its process group: without a PID namespace (no root), a `setsid` child would survive."""
    import os
    import time

    real = isolation()
    if namespaces and not real.namespaces:
        pytest.skip("PID namespaces need root here")
    monkeypatch.setattr(execution, "isolation", lambda: real._replace(namespaces=namespaces))
    marker = "a2rl-daemon-417"  # the daemon's name (prctl PR_SET_NAME): how the test finds it from outside
    daemon = ("    import ctypes, os, time\n"
              "    if os.fork() == 0:\n"
              "        os.setsid()\n"
              f"        ctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0)\n"
              "        time.sleep(600)\n"
              "    while True:\n        pass\n")  # fmt: skip

    def survivors() -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == marker[:15]:
                    found.append(pid)
            except OSError:
                pass
        return found

    result = strict.score_item(items["HumanEval/82"], daemon)
    assert result.detail["status"] == "timeout"
    deadline = time.monotonic() + 5
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = survivors()
    for pid in left:  # do not leave them behind when the check fails
        os.kill(int(pid), 9)
    assert left == []


def test_interpreter_crash_costs_only_that_sample(strict: HumanEval, items: dict[str, dict]) -> None:
    result = strict.score_item(items["HumanEval/82"], "    import ctypes\n    ctypes.string_at(0)\n")
    assert result.detail["status"] == "crashed" and "SIGSEGV" in result.detail["reason"]


def test_memory_hog_fails_without_hurting_the_grader(strict: HumanEval, items: dict[str, dict]) -> None:
    result = strict.score_item(items["HumanEval/82"], "    x = bytearray(8 * 1024**3)\n    return True\n")
    assert not result.correct


@pytest.mark.skipif(not isolation().landlock, reason="Landlock is not available on this kernel")
def test_reading_outside_its_directory_fails(strict: HumanEval, items: dict[str, dict], tmp_path: Path) -> None:
    secret = tmp_path / "hidden-test.jsonl"
    secret.write_text("the answers")
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    item = items["HumanEval/82"]
    reply = f"    open({str(secret)!r}).read()\n" + item["canonical_solution"]
    result = strict.score_item(item, reply)
    assert not result.correct and "PermissionError" in result.detail["reason"]


@pytest.mark.skipif(not isolation().namespaces, reason="network namespaces need root and util-linux unshare")
def test_program_has_no_network_and_no_grader_secrets(strict: HumanEval, items: dict[str, dict], monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-grader-secret")
    item = items["HumanEval/82"]
    probe = (
        "    import os, socket\n"
        "    assert 'ANTHROPIC_API_KEY' not in os.environ\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', 22), timeout=1)\n"
        "    except OSError as e:\n"
        "        assert e.errno == 101 or 'unreachable' in str(e).lower() or e.errno == 111\n"
        "    assert [n for i, n in socket.if_nameindex()] in ([], ['lo'])\n"
    )
    result = strict.score_item(item, probe + item["canonical_solution"])
    assert result.correct, result.detail


def test_a_sandbox_that_cannot_run_python_is_an_error_not_a_zero_score(items: dict[str, dict], monkeypatch) -> None:
    monkeypatch.setattr(execution, "_command", lambda *args: ["/bin/false"])
    execution.check_sandbox.cache_clear()
    try:
        with pytest.raises(SandboxBroken, match="fails a trivial passing program"):
            HumanEval().score_item(items["HumanEval/82"], items["HumanEval/82"]["answer"])
    finally:
        monkeypatch.undo()
        execution.check_sandbox.cache_clear()


def test_describe_task_reports_sizes_metric_evaluator_and_sandbox() -> None:
    from a2rl_bench.benchmarks.describe import describe_task

    text = describe_task("humaneval")
    assert "metric: pass@1" in text and f"evaluator: {HumanEval().evaluator_id()}" in text
    assert "train 66, validation 16, test 82" in text and "max_new_tokens 512" in text
    assert "full: " in text and "sandbox: 10 s" in text
