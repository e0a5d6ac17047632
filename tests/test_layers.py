"""The layers point one way (static: every `import`, at the top of a module or inside a function, read with `ast`).

    a2rl.cli, a2rl/__main__.py     the command line: the top layer, may import everything below
    flows, tasks                   orchestration: put the library and the plug-ins together (tasks below flows)
    benchmarks, agents, blocks,    plug-ins: tasks, agents, driver LLMs, analysis; they import the library
    analysis
    a2rl (the rest)                the library: imports none of the packages above

So the library can be read, tested and reused without a task, an agent, a Prefect flow or a figure, and no
import cycle between the library and the benchmarks hides behind a lazy import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI_LAYER = ("a2rl/cli/", "a2rl/__main__.py")
ABOVE_LIBRARY = ("flows", "tasks", "agents", "analysis", "blocks", "benchmarks", "a2rl.cli")
ABOVE_PLUGINS = ("flows", "tasks", "a2rl.cli")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in the file, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)]
            # `from a2rl import cli` names a module in the import's names
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def violations(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    def hits(module: str) -> bool:
        return any(module == f or module.startswith(f + ".") for f in forbidden)

    return sorted({f"{path.relative_to(ROOT)}:{line} imports {module}"
            for path in files for line, module in imported_modules(path) if hits(module)})  # fmt: skip


def python_files(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def library_files() -> list[Path]:
    return [p for p in python_files("a2rl") if not str(p.relative_to(ROOT)).startswith(CLI_LAYER)]


def test_the_library_imports_no_layer_above_it():
    assert library_files(), "no library files found"
    assert violations(library_files(), ABOVE_LIBRARY) == []


@pytest.mark.parametrize("package", ["benchmarks", "agents", "blocks", "analysis"])
def test_plugins_import_the_library_but_not_the_orchestration_or_the_cli(package):
    assert violations(python_files(package), ABOVE_PLUGINS) == []


@pytest.mark.parametrize("package", ["flows", "tasks"])
def test_the_orchestration_does_not_import_the_cli(package):
    assert violations(python_files(package), ("a2rl.cli",)) == []


def test_the_steps_do_not_import_the_flows_that_run_them():
    assert violations(python_files("tasks"), ("flows",)) == []


def test_the_check_sees_imports_inside_functions_and_the_cli_exemption_is_exact(tmp_path):
    """The check itself: a lazy import inside a function is an import; only the CLI layer is exempt."""
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from benchmarks import get_task\n    import flows.sweep\n"
                      "from a2rl import cli\n")  # fmt: skip
    found = [m for _, m in imported_modules(module)]
    assert "benchmarks" in found and "flows.sweep" in found and "a2rl.cli" in found
    exempt = {str(p.relative_to(ROOT)) for p in set(python_files("a2rl")) - set(library_files())}
    assert exempt and all(p.startswith(CLI_LAYER) for p in exempt)
    assert "a2rl/cli/__init__.py" in exempt and "a2rl/inference/evaluation.py" not in exempt


def test_no_flow_or_step_module_hides_a_top_level_package():
    """Prefect loads a deployment's entrypoint with its folder first on sys.path: a `flows/analysis.py` would then
    be what `import analysis` finds, and the flow that draws figures would fail in every worker."""
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    for folder in ("flows", "tasks"):
        clashes = {p.stem for p in (ROOT / folder).glob("*.py")} & packages
        assert not clashes, f"{folder}/ has modules named like top-level packages: {sorted(clashes)}"


# The library's top level: one package per concept, plus the few small modules every package uses.
LIBRARY_PACKAGES = {"base_models", "cli", "grading", "inference", "isolation", "ops", "protocol", "capture", "store",
                    "summary", "templates"}  # fmt: skip
LIBRARY_MODULES = {"__init__", "__main__", "jsonl", "locks", "ngrams", "paths", "records", "run", "run_options",
                   "setting", "workspace"}  # fmt: skip


def test_the_library_top_level_is_its_concept_packages_and_a_few_shared_modules():
    """A new module goes into the package of its concept (docs/architecture.md has the table), not beside them."""
    top = ROOT / "a2rl"
    packages = {p.name for p in top.iterdir() if p.is_dir() and p.name != "__pycache__"}
    modules = {p.stem for p in top.glob("*.py")}
    assert packages == LIBRARY_PACKAGES and modules == LIBRARY_MODULES
    documented = (ROOT / "docs" / "architecture.md").read_text()
    for package in LIBRARY_PACKAGES - {"templates", "cli"}:
        for module in (top / package).glob("*.py"):
            if module.name != "__init__.py":
                assert f"{package}/{module.name}" in documented, f"a2rl/{package}/{module.name} is not in the table"


def test_the_library_and_the_benchmarks_do_not_import_each_other_in_a_cycle():
    """`benchmarks` imports the library; the library never imports `benchmarks` (checked above), so no lazy import
    hides a cycle. The code shipped to agents (`envlib.zip`) imports neither: it must run in a workspace alone."""
    from benchmarks.envs.export import ENVLIB_MODULES

    shipped = [ROOT / "benchmarks" / "envs" / f"{name}.py" for name in ENVLIB_MODULES]
    assert violations(shipped, ("a2rl", "benchmarks", "agents", "flows", "tasks", "blocks", "analysis")) == []
