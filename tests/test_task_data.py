"""A task's declarative fields live as data, `task.toml` beside its description.md (issue #38): every built-in
task is built exactly as it was when task.py declared them, and a bad task.toml is one clear error."""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import json
import textwrap
import tomllib
from pathlib import Path

import pytest

import a2rl_bench.benchmarks
from a2rl_bench.benchmarks.base import TASK_FILE, TaskFileError

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = Path(__file__).parent / "data" / "task_fields.json"
"""Every field of each task object (value, order, init/repr/compare), its benchmark_name and evaluator id,
recorded from the task classes as they were at c6089e6 (fields declared in task.py), before they moved to
task.toml."""


def _plain(value):
    if dataclasses.is_dataclass(value):  # Decoding, SandboxLimits
        return {"__type__": type(value).__name__, **{k: _plain(v) for k, v in dataclasses.asdict(value).items()}}
    return list(value) if isinstance(value, tuple) else value  # as JSON has it


def _fields(task_id: str) -> dict:
    cls = a2rl_bench.benchmarks.TASKS.load(task_id)
    task = cls()
    every = dataclasses.fields(task)
    fields = {f.name: _plain(getattr(task, f.name)) for f in every if f.name != "_judge_lock"}  # a lock: no value
    fields["benchmark_name"] = cls.benchmark_name
    fields["__field_order__"] = [f.name for f in every]
    fields["__field_flags__"] = {f.name: [f.init, f.repr, f.compare] for f in every}
    if task_id != "alpacaeval":  # its evaluator id names the judge the environment configures
        fields["evaluator_id()"] = task.evaluator_id()
    return fields


@pytest.mark.parametrize("task_id", sorted(json.loads(SNAPSHOT.read_text())))
def test_every_task_is_built_as_it_was_before_its_fields_moved_to_data(task_id):
    assert _fields(task_id) == json.loads(SNAPSHOT.read_text())[task_id]
    assert (a2rl_bench.benchmarks.TASKS.load(task_id)().package_dir / TASK_FILE).is_file()


def test_each_task_object_gets_its_own_copy_of_mutable_fields():
    a, b = a2rl_bench.benchmarks.get_task("gsm8k"), a2rl_bench.benchmarks.get_task("gsm8k")
    a.variant_labels["offline"] = "changed"
    assert b.variant_labels["offline"] != "changed"


def test_the_wheel_ships_every_task_toml():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    for path in (REPO / "benchmarks").glob(f"*/{TASK_FILE}"):
        assert any(fnmatch.fnmatch(path.name, p) for p in patterns), f"{path} is not package data"


GOOD = """\
id = "toy"
level = "L1"
metric = "exact match"
title = "Toy"
prompt_version = "1"
default_base_model = "smollm2-135m-instruct"
[decoding]
max_new_tokens = 8
temperature = 0
stop = ["\\n"]
[variant_labels]
offline = "made up"
"""

TASK_PY = """\
from dataclasses import dataclass
from a2rl_bench.benchmarks.base import BenchmarkTask


@dataclass
class Toy(BenchmarkTask):
{body}
    def build_prompt(self, item):
        return [{{"role": "user", "content": item["q"]}}]

    def score_item(self, item, completion):
        raise NotImplementedError
"""


PASS = "    pass\n"
"""A class body that declares nothing itself."""


def _define(tmp_path, monkeypatch, toml: str, body: str = PASS):
    """Import a task module from a fresh package whose folder holds `toml` as its task.toml."""
    name = f"toy_{abs(hash((toml, body, str(tmp_path)))) % 10**8}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "task.py").write_text(TASK_PY.format(body=body))
    (pkg / TASK_FILE).write_text(textwrap.dedent(toml))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(f"{name}.task").Toy


def test_a_task_toml_declares_the_fields(tmp_path, monkeypatch):
    toy = _define(tmp_path, monkeypatch, GOOD)()
    assert (toy.id, toy.level, toy.variant_labels, toy.data_version) == ("toy", "L1", {"offline": "made up"}, "1")
    assert toy.decoding.temperature == 0.0 and isinstance(toy.decoding.temperature, float)  # `0` reads as 0.0
    assert toy.evaluator_id() == "toy/prompt-1/max8-t0.0-stop[\\n]/v1"
    assert type(toy)(id="other").id == "other"  # still fields: a test may override one


@pytest.mark.parametrize(("toml", "body", "message"), [
    ("colour = 'red'\n" + GOOD, PASS, r"task.toml: unknown field 'colour'; Toy has benchmark_name, data_version"),
    (GOOD.replace('level = "L1"', "level = 1"), PASS, r"task.toml: level must be str; got 1"),
    (GOOD.replace('stop = ["\\n"]', 'stop = "\\n"'), PASS, r"decoding.stop must be a list of strings"),
    (GOOD.replace("max_new_tokens = 8", "max_new_tokens = '8'"), PASS, r"decoding.max_new_tokens must be int"),
    (GOOD.replace("max_new_tokens", "max_tokens"), PASS, r"\[decoding\] takes only max_new_tokens, temperature, stop"),
    (GOOD.replace('title = "Toy"\n', ""), PASS, r"task.toml: Toy needs title"),
    (GOOD, '    title: str = "Toy"\n', r"task.toml: 'title' is declared both here and in Toy's class body"),
    (GOOD + "[variant_labels\n", PASS, r"task.toml: not valid TOML"),
])  # fmt: skip
def test_a_bad_task_toml_is_one_clear_error(tmp_path, monkeypatch, toml, body, message):
    with pytest.raises(TaskFileError, match=message):
        _define(tmp_path, monkeypatch, toml, body)


def test_a_variant_labelled_in_task_toml_without_a_loader_is_named_as_not_the_tasks(tmp_path, monkeypatch):
    """Issue #45: a plug-in's task.toml copied from gsm8k's listed a `full` variant the task does not have, and
    `a2rl tasks show` offered it ("not prepared on this machine (needs internet ...)")."""
    from a2rl_bench.benchmarks.describe import describe_variant

    body = "    def loaders(self):\n        return {'offline': lambda: None}\n"
    toy = _define(tmp_path, monkeypatch, GOOD.replace('offline = "made up"', 'offline = "made up"\nfull = "GSM8K"'),
                  body)()  # fmt: skip
    lines = describe_variant(toy, "full")
    assert len(lines) == 2 and "not a variant of toy" in lines[1] and "remove it from [variant_labels]" in lines[1]
    assert "not a variant" not in " ".join(describe_variant(toy, "offline", load_offline=False))
