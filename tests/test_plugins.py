"""Plug-ins that register themselves (issue #38): an outside package adds a benchmark task and an agent through
entry points, without editing this repository; two plug-ins under one name are refused, naming both."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import a2rl_bench.agents
import a2rl_bench.benchmarks
from a2rl_bench import contracts
from a2rl_bench.inference.evaluation import EvalSpec, evaluate_cached
from a2rl_bench.registry import PluginError

REPO = Path(__file__).resolve().parents[1]

ECHO_BEHAVIOUR = '''
    def loaders(self):
        return {"offline": self._words}

    def _words(self) -> TaskData:
        items = [{"id": f"w{i}", "word": w} for i, w in enumerate(WORDS)]
        return TaskData(train=items[:4], validation=items[4:6], test=items[6:], source="a word list in the plug-in")

    def build_prompt(self, item):
        return [{"role": "user", "content": f"Repeat: {item['word']}"}]

    def score_item(self, item, completion):
        said = completion.strip()
        return ItemResult(item_id=item["id"], completion=completion, prediction=said, target=item["word"],
                          correct=said == item["word"])
'''
IMPORTS = '''
from dataclasses import dataclass, field

from a2rl_bench.records import ItemResult
from a2rl_bench.benchmarks.base import BenchmarkTask, Decoding, TaskData

WORDS = ["apple", "river", "stone", "cloud", "maple", "ember", "frost", "grain"]
'''
TASK_MODULE = IMPORTS + '''

@dataclass
class Echo(BenchmarkTask):
    id: str = "toy-echo"
    level: str = "L1"
    metric: str = "exact match"
    title: str = "Repeat the word"
    prompt_version: str = "1"
    decoding: Decoding = field(default_factory=lambda: Decoding(max_new_tokens=4))
    default_base_model: str = "smollm2-135m-instruct"
    variant_labels: dict = field(default_factory=lambda: {"offline": "echo words, generated offline"})
''' + ECHO_BEHAVIOUR
"""A task whose fields are declared in code (a plug-in may still do so)."""

FOLDER_TASK_MODULE = IMPORTS + '''

@dataclass
class Words(BenchmarkTask):
''' + ECHO_BEHAVIOUR
FOLDER_TASK_TOML = """\
id = "toy-words"
level = "L1"
metric = "exact match"
title = "Repeat the word, declared as data"
prompt_version = "1"
default_base_model = "smollm2-135m-instruct"

[decoding]
max_new_tokens = 4

[variant_labels]
offline = "echo words, generated offline"
"""
"""A seventh task as docs/architecture.md ("Adding a benchmark task") writes one: behaviour in task.py, the
declarative fields in task.toml, the agent-facing text in description.md."""

AGENT_MODULE = '''
from a2rl_bench.agents.reference_sft.adapter import ReferenceSFT


class ToySFT(ReferenceSFT):
    id = "toy-sft"
'''


DESCRIPTION = "# Repeat the word\nTrain the model to repeat the word it is given.\n"


def _plugin_package(root: Path, entry_points: str, words_toml: str = FOLDER_TASK_TOML) -> Path:
    """A package as pip would leave it in site-packages: its modules and a dist-info with entry_points.txt. Its
    `words/` folder is a task declared the way the built-ins are."""
    pkg = root / "a2rl_toy_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "task.py").write_text(TASK_MODULE)
    (pkg / "agent.py").write_text(AGENT_MODULE)
    (pkg / "description.md").write_text(DESCRIPTION)
    words = pkg / "words"
    words.mkdir()
    (words / "__init__.py").write_text("")
    (words / "task.py").write_text(FOLDER_TASK_MODULE)
    (words / "task.toml").write_text(words_toml)
    (words / "description.md").write_text(DESCRIPTION)
    info = root / "a2rl_toy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: a2rl-toy-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    return root


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    root = _plugin_package(tmp_path / "site", """
        [a2rl.tasks]
        toy-echo = a2rl_toy_plugin.task:Echo

        [a2rl.agents]
        toy-sft = a2rl_toy_plugin.agent:ToySFT
        """)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))
    a2rl_bench.benchmarks.TASKS.refresh()
    a2rl_bench.agents.AGENTS.refresh()
    yield root
    monkeypatch.undo()
    a2rl_bench.benchmarks.TASKS.refresh()
    a2rl_bench.agents.AGENTS.refresh()


def test_an_installed_package_adds_a_task_and_an_agent(installed_plugin):
    assert "toy-echo" in a2rl_bench.benchmarks.TASKS and "gsm8k" in a2rl_bench.benchmarks.TASKS
    assert a2rl_bench.benchmarks.TASKS.ref("toy-echo").source == "a2rl-toy-plugin"
    task = a2rl_bench.benchmarks.get_task("toy-echo")
    assert [t.id for t in a2rl_bench.benchmarks.list_tasks()].count("toy-echo") == 1
    # Its description comes from its own package, with the harness's grading section after it.
    assert task.description().startswith("# Repeat the word") and "How submissions are graded" in task.description()
    prepared = task.prepare("offline")
    assert prepared.manifest["sizes"] == {"train": 4, "validation": 2, "test": 2}
    assert not (prepared.public_dir / "test.jsonl").exists()  # hidden items stay private, as for built-ins
    items = task.load_split("offline", "test")
    assert [task.score_item(i, f" {i['word']}\n").correct for i in items] == [True, True]
    assert a2rl_bench.agents.agent_class("toy-sft").id == "toy-sft" and "toy-sft" in a2rl_bench.agents.list_agents()


@pytest.fixture
def task_folder(tmp_path, monkeypatch):
    """Installs the plug-in with its `words/` task registered; yields a function that writes its task.toml."""

    def forget_modules() -> None:  # each test imports its own copy of the plug-in
        for name in [m for m in sys.modules if m.split(".")[0] == "a2rl_toy_plugin"]:
            del sys.modules[name]

    def install(words_toml: str = FOLDER_TASK_TOML) -> Path:
        forget_modules()
        root = _plugin_package(tmp_path / "site", """
            [a2rl.tasks]
            toy-words = a2rl_toy_plugin.words.task:Words
            """, words_toml)  # fmt: skip
        monkeypatch.syspath_prepend(str(root))
        # The evaluation process rebuilds the task from its class: it must import the plug-in too.
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), str(REPO)]))
        monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))
        a2rl_bench.benchmarks.TASKS.refresh()
        return root / "a2rl_toy_plugin" / "words"

    yield install
    monkeypatch.undo()
    forget_modules()
    a2rl_bench.benchmarks.TASKS.refresh()


def test_a_seventh_task_is_one_folder_graded_like_the_built_ins(task_folder, tiny_model_dir):
    folder = task_folder()
    assert sorted(p.name for p in folder.iterdir()) == ["__init__.py", "description.md", "task.py", "task.toml"]
    task = a2rl_bench.benchmarks.get_task("toy-words")
    assert isinstance(task, contracts.BenchmarkTask)
    assert (task.title, task.decoding.max_new_tokens, task.decoding.temperature, task.variant_labels) == (
        "Repeat the word, declared as data", 4, 0.0, {"offline": "echo words, generated offline"})
    assert task.description().startswith("# Repeat the word") and "How submissions are graded" in task.description()
    # The grader's path: an evaluation process that rebuilds the task from its class, then the cache.
    spec = EvalSpec.of(task, "offline", "test", batch_size=2)
    result = evaluate_cached(tiny_model_dir, "toy-weights", spec, timeout_s=300)
    assert (result.task, result.split, result.n, result.cached) == ("toy-words", "test", 2, False)
    assert result.evaluator_id.startswith("toy-words/prompt-1/max4-t0.0-stop[]/v1@")
    assert [i.target for i in result.items] == ["frost", "grain"] and 0.0 <= result.score <= 100.0
    again = evaluate_cached(tiny_model_dir, "toy-weights", spec, timeout_s=300)
    assert again.cached and again.items == result.items


def test_a_bad_task_toml_breaks_only_its_task(task_folder):
    task_folder(FOLDER_TASK_TOML.replace('level = "L1"', "level = 1"))
    with pytest.raises(PluginError, match=r"task 'toy-words' \(a2rl_toy_plugin.words.task:Words, from "
                                          r"a2rl-toy-plugin\) does not load: .*words/task.toml: level must be str"):
        a2rl_bench.benchmarks.get_task("toy-words")
    assert a2rl_bench.benchmarks.get_task("gsm8k").id == "gsm8k"


def test_the_command_line_lists_an_installed_task(installed_plugin):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed_plugin), str(REPO)])}
    out = subprocess.run([sys.executable, "-m", "a2rl_bench", "tasks"], capture_output=True, text=True, env=env,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "toy-echo" in out.stdout and "Repeat the word" in out.stdout and "gsm8k" in out.stdout


def test_two_plugins_under_one_name_are_refused_naming_both(tmp_path, monkeypatch):
    root = _plugin_package(tmp_path / "site", """
        [a2rl.tasks]
        gsm8k = a2rl_toy_plugin.task:Echo
        """)
    monkeypatch.syspath_prepend(str(root))
    a2rl_bench.benchmarks.TASKS.refresh()
    try:
        with pytest.raises(PluginError) as caught:
            a2rl_bench.benchmarks.get_task("gsm8k")
        message = str(caught.value)
        assert "a2rl_bench.benchmarks.gsm8k:GSM8K (built-in)" in message and "a2rl_toy_plugin.task:Echo (a2rl-toy-plugin)" in message
    finally:
        monkeypatch.undo()
        a2rl_bench.benchmarks.TASKS.refresh()


def test_an_unknown_or_broken_plugin_is_one_clear_error(tmp_path, monkeypatch):
    with pytest.raises(KeyError, match="unknown task 'nope'; known tasks: .*gsm8k"):
        a2rl_bench.benchmarks.get_task("nope")
    root = _plugin_package(tmp_path / "site", """
        [a2rl.agents]
        broken = a2rl_toy_plugin.missing:Nothing
        """)
    monkeypatch.syspath_prepend(str(root))
    a2rl_bench.agents.AGENTS.refresh()
    try:
        with pytest.raises(PluginError, match=r"agent 'broken' \(a2rl_toy_plugin.missing:Nothing, from a2rl-toy-plugin\) "
                                              r"does not load"):
            a2rl_bench.agents.agent_class("broken")
        # a broken plug-in breaks only itself
        assert a2rl_bench.agents.agent_class("reference-sft").id == "reference-sft"
    finally:
        monkeypatch.undo()
        a2rl_bench.agents.AGENTS.refresh()


def test_a_name_two_plugins_declare_is_refused_alone(tmp_path, monkeypatch):
    """Two installed packages both declare an agent `toy-sft`: that name is refused naming both, and only that
    name: every other agent and task still loads, and the listings show the rest."""
    root = _plugin_package(tmp_path / "site", """
        [a2rl.agents]
        toy-sft = a2rl_toy_plugin.agent:ToySFT
        """)
    other = root / "a2rl_toy_plugin_two-0.1.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: a2rl-toy-plugin-two\nVersion: 0.1\n")
    (other / "entry_points.txt").write_text("[a2rl.agents]\ntoy-sft = a2rl_toy_plugin.task:Echo\n")
    monkeypatch.syspath_prepend(str(root))
    a2rl_bench.agents.AGENTS.refresh()
    try:
        with pytest.raises(PluginError, match=r"two agents are named 'toy-sft': .*\(a2rl-toy-plugin\) and .*"
                                              r"\(a2rl-toy-plugin-two\)"):  # fmt: skip
            a2rl_bench.agents.agent_class("toy-sft")
        assert a2rl_bench.agents.agent_class("reference-sft").id == "reference-sft"
        assert "reference-sft" in a2rl_bench.agents.list_agents() and "toy-sft" not in a2rl_bench.agents.list_agents()
        assert set(a2rl_bench.agents.AGENTS.clashes()) == {"toy-sft"}
        assert a2rl_bench.benchmarks.get_task("gsm8k").id == "gsm8k"
    finally:
        monkeypatch.undo()
        a2rl_bench.agents.AGENTS.refresh()


def test_a_plugin_is_reached_by_its_namespaced_name_and_keeps_it_when_its_short_name_clashes(installed_plugin):
    """`dist/name`, as Inspect AI names a package's tasks: a plug-in's task and agent answer to it beside their short
    names (built-ins to `a2rl/<name>`); when a second package declares the same short name, only that short name
    is refused, naming both namespaced names, and each package's plug-in is still reached by its own."""
    from a2rl_bench.run import make_run_id
    from a2rl_bench.records import RunConfig

    assert a2rl_bench.benchmarks.get_task("a2rl-toy-plugin/toy-echo").id == "toy-echo"
    assert a2rl_bench.benchmarks.get_task("toy-echo").id == "toy-echo"  # unique: the short name works
    assert a2rl_bench.benchmarks.get_task("a2rl/gsm8k").id == "gsm8k" and "a2rl/gsm8k" in a2rl_bench.benchmarks.TASKS
    assert a2rl_bench.agents.agent_class("a2rl-toy-plugin/toy-sft") is a2rl_bench.agents.agent_class("toy-sft")
    with pytest.raises(PluginError, match="unknown task 'other-dist/toy-echo'"):
        a2rl_bench.benchmarks.get_task("other-dist/toy-echo")
    run_id = make_run_id(RunConfig(task="a2rl-toy-plugin/toy-echo", agent="a2rl-toy-plugin/toy-sft"), "f" * 8)
    assert "/" not in run_id and run_id.startswith("a2rl-toy-plugin.toy-echo-a2rl-toy-plugin.toy-sft-")

    other = installed_plugin / "Toy_Plugin.Two-0.1.dist-info"  # a second package, its name normalised as pip does
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: Toy_Plugin.Two\nVersion: 0.1\n")
    (other / "entry_points.txt").write_text("[a2rl.agents]\ntoy-sft = a2rl_toy_plugin.task:Echo\n")
    a2rl_bench.agents.AGENTS.refresh()
    with pytest.raises(PluginError, match="two agents are named 'toy-sft'.*'a2rl-toy-plugin/toy-sft' or "
                                          "'toy-plugin-two/toy-sft'"):  # fmt: skip
        a2rl_bench.agents.agent_class("toy-sft")
    assert a2rl_bench.agents.agent_class("a2rl-toy-plugin/toy-sft").__name__ == "ToySFT"
    assert a2rl_bench.agents.agent_class("toy-plugin-two/toy-sft").__name__ == "Echo"
    assert a2rl_bench.agents.agent_class("reference-sft").id == "reference-sft"  # the other names are untouched
    assert set(a2rl_bench.agents.AGENTS.clashes()) == {"toy-sft"}


GUESS_ENV = '''
"""Guess the number: the plug-in's own environment, shipped to agents as envlib/guessing.py (stdlib only)."""
from typing import NamedTuple


class Step(NamedTuple):
    observation: str
    reward: float
    done: bool
    info: dict


class GuessEnv:
    def reset(self, goal, seed=0):
        self.target = goal["target"]
        return "Guess the number from 0 to 9.", {}

    def step(self, action):
        won = action.strip() == str(self.target)
        return Step("right" if won else "wrong", float(won), won, {"won": won})

    def admissible_actions(self):
        return [str(i) for i in range(10)]


def make_env(data_dir):
    return GuessEnv


def guess_prompt(goal, observation, turns):
    return [{"role": "user", "content": f"{observation} Tried: {' '.join(t['action'] for t in turns) or '-'}"}]
'''
GUESS_TASK = '''
from dataclasses import dataclass

from a2rl_bench.benchmarks.base import TaskData
from a2rl_bench.benchmarks.envs.task import AgentEnvironment, InteractiveTask
from a2rl_toy_plugin.guess.guessing import GuessEnv, guess_prompt


@dataclass
class Guess(InteractiveTask):
    agent_environment = AgentEnvironment(("a2rl_toy_plugin.guess.guessing",), "guessing:make_env",
                                         "guessing:guess_prompt")

    def loaders(self):
        return {"offline": self._goals}

    def _goals(self):
        items = [{"id": f"g{i}", "target": i} for i in range(10)]
        return TaskData(train=items[:6], validation=items[6:8], test=items[8:], source="ten numbers in the plug-in")

    def make_env(self, variant):
        return GuessEnv

    def prompt(self, goal, observation, turns):
        return guess_prompt(goal, observation, turns)
'''
GUESS_TOML = FOLDER_TASK_TOML.replace('"toy-words"', '"toy-guess"').replace("[decoding]", "max_steps = 3\n\n[decoding]")
# The agent's side: guesses 0, 1, 2, ... (one per step), with only the workspace's envlib imported.
GUESS_AGENT = """\
import sys, zipfile; sys.path.insert(0, sys.argv[1]); import envlib
def count(convs): return [str(len(c[0]['content'].split('Tried: ')[1].replace('-', '').split())) for c in convs]
goals = envlib.load_goals(sys.argv[2])
eps = envlib.run_episodes(envlib.make_env('toy-guess', sys.argv[2]), goals, count, envlib.prompter('toy-guess'),
                          envlib.MAX_STEPS['toy-guess'])
assert 'a2rl_bench' not in sys.modules and 'a2rl_toy_plugin' not in sys.modules and list(envlib.TASKS) == ['toy-guess']
print(envlib.MAX_STEPS, [ep.won for ep in eps], sorted(zipfile.ZipFile(sys.argv[1]).namelist()))
"""


def test_an_interactive_plugin_task_gives_agents_its_environment(tmp_path, monkeypatch):
    """A plug-in interactive task declares its own environment module; the workspace's `envlib.zip` ships it with
    the shared modules (and no other task's), and an agent plays its episodes through `envlib` alone."""
    root = _plugin_package(tmp_path / "site", """
        [a2rl.tasks]
        toy-guess = a2rl_toy_plugin.guess.task:Guess
        """)
    guess = root / "a2rl_toy_plugin" / "guess"
    guess.mkdir()
    for name, text in {"__init__.py": "", "guessing.py": GUESS_ENV, "task.py": GUESS_TASK, "task.toml": GUESS_TOML,
                       "description.md": DESCRIPTION}.items():
        (guess / name).write_text(text)
    def forget_modules() -> None:  # another test's copy of the plug-in may be imported already
        for name in [m for m in sys.modules if m.split(".")[0] == "a2rl_toy_plugin"]:
            del sys.modules[name]

    forget_modules()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("A2RL_HOME", str(tmp_path / "home"))
    a2rl_bench.benchmarks.TASKS.refresh()
    try:
        public = a2rl_bench.benchmarks.get_task("toy-guess").prepare("offline").public_dir
    finally:
        monkeypatch.undo()
        forget_modules()
        a2rl_bench.benchmarks.TASKS.refresh()
    out = subprocess.run([sys.executable, "-c", GUESS_AGENT, str(public / "envlib.zip"), str(public)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    shipped = [f"envlib/{m}.py" for m in ("__init__", "_tasks", "api", "base", "bm25", "guessing", "react")]
    assert out.stdout.split("\n")[0] == f"{{'toy-guess': 3}} [True, True, True, False, False, False] {shipped}"


def test_an_environment_module_that_would_replace_a_shared_one_is_refused():
    from a2rl_bench.benchmarks.envs.export import AgentEnvironment

    with pytest.raises(ValueError,
                       match=r"module 'a2rl_bench.benchmarks.envs.base' would replace envlib/base.py; rename"):
        AgentEnvironment(("a2rl_bench.benchmarks.envs.base",), "base:make_env", "base:prompt").shipped_files()
    with pytest.raises(ValueError, match=r"'shop' is not 'module:function' with module one of \['shop.py'\]"):
        AgentEnvironment(("a2rl_bench.benchmarks.envs.shop",), "shop:make_env", "shop").shipped_files()
