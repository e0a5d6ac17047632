"""The layers point one way, checked by import-linter's contracts in `.importlinter` (every import, at the top of
a module or inside a function, so a loop hidden behind a lazy import fails like any other):

    a2rl_bench.cli, a2rl_bench/__main__.py     the command line: the top layer, may import everything below
    a2rl_bench.flows, a2rl_bench.tasks         orchestration: put the library and the plug-ins together (tasks
                                               below flows)
    a2rl_bench.benchmarks, a2rl_bench.agents,  plug-ins: tasks, agents, driver LLMs, analysis; they import the library
    a2rl_bench.blocks, a2rl_bench.analysis
    a2rl (the rest)                the library: imports none of the packages above; inside it, its packages are
                                   layered too (store > summary (leak audit) > grading > inference > building blocks)

So the library can be read, tested and reused without a task, an agent, a Prefect flow or a figure, and no
import cycle between packages hides behind a lazy import.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".importlinter"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path = ROOT, config: Path | None = None) -> subprocess.CompletedProcess:
    """`lint-imports` as a user runs it: from the repository root (import-linter puts it first on the import path),
    reading `.importlinter` there unless another config is named."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [str(LINT_IMPORTS), "--no-cache", "--no-logo", *([str(config)] if config else [])]
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def plugged_folders() -> dict[str, str]:
    """pyproject's package-dir mapping of the top-level folders into the package: {"flows": "flows", ...}."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {package.removeprefix("a2rl_bench."): folder for package, folder in mapping.items()}


def broken_contracts(output: str) -> str:
    """The part of lint-imports' report that names each broken contract and its offending imports."""
    return output.partition("Broken contracts")[2].strip() or output


def contract(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    return parser[f"importlinter:contract:{name}"]


def listed(section: configparser.SectionProxy, key: str) -> list[str]:
    """A contract's list option: one entry a line (a layer line may hold several modules, split by : or |)."""
    lines = [line.split("#")[0].strip() for line in section.get(key, "").splitlines()]
    return [m.strip() for line in lines if line for m in line.replace("|", ":").split(":")]


def test_the_import_contracts_hold():
    """Plain `lint-imports` at the repository root reads the checkout as the wheel installs it."""
    done = lint_imports()
    assert done.returncode == 0, f"import contracts broken (.importlinter):\n{broken_contracts(done.stdout)}"
    assert "0 broken" in done.stdout and "5 kept" in done.stdout


def test_the_contracts_see_imports_inside_functions(tmp_path):
    """The check itself: a lazy import inside a function is an import, and it breaks a layers contract."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("import pkg.low\n")
    (package / "low.py").write_text("def f():\n    from pkg import high\n    return high\n")
    config = tmp_path / ".importlinter"
    config.write_text("[importlinter]\nroot_package = pkg\n\n[importlinter:contract:one]\nname = high over low\n"
                      "type = layers\nlayers =\n    pkg.high\n    pkg.low\n")  # fmt: skip
    done = lint_imports(tmp_path, config)
    assert done.returncode != 0 and "pkg.low -> pkg.high (l.2)" in done.stdout, done.stdout


def test_the_library_contract_names_every_library_module():
    """A new library module must be placed in the layers (the library-layers contract is exhaustive over the
    top level; ops and isolation are placed module by module) and in the list of what may not import upward."""
    top = {p.stem if p.suffix else p.name for p in (ROOT / "a2rl_bench").iterdir()
           if not p.is_symlink() and (p.suffix == ".py" or (p / "__init__.py").is_file())} - {"__init__"}  # fmt: skip
    library = {m.removeprefix("a2rl_bench.") for m in listed(contract("library-below-plugins"), "source_modules")}
    assert library == top - {"cli", "__main__"}
    layers = set(listed(contract("library-layers"), "layers"))
    for package in ("ops", "isolation"):
        modules = {f"{package}.{p.stem}" for p in (ROOT / "a2rl_bench" / package).glob("*.py") if p.stem != "__init__"}
        assert modules <= layers, f"a2rl_bench/{package} modules missing from the library layers: {modules - layers}"


def test_every_package_is_checked_for_import_cycles_among_its_modules():
    """The library's and the agents' packages are named one by one (a cycle between the library's packages is the
    layers contract's to find); a new package must join the list."""
    ancestors = set(listed(contract("no-cycles-inside-packages"), "ancestors"))
    for parent in ("a2rl_bench", "agents"):
        prefix = "a2rl_bench." if parent != "a2rl_bench" else ""
        packages = {f"{prefix}{parent}.{p.name}" for p in (ROOT / parent).iterdir()
                    if not p.is_symlink() and (p / "__init__.py").is_file()}  # fmt: skip
        assert packages <= ancestors, f"packages not checked for cycles: {sorted(packages - ancestors)}"


def test_the_checkout_links_each_plugged_folder_into_the_package():
    """`a2rl_bench/flows` -> `../flows`, ...: one relative link per entry of pyproject's package-dir mapping, so Python
    and import-linter find `a2rl_bench.flows` in the checkout where the wheel installs it (and a new mapping needs its
    link)."""
    links = {p.name: os.readlink(p) for p in (ROOT / "a2rl_bench").iterdir() if p.is_symlink()}
    assert links == {name: f"../{folder}" for name, folder in plugged_folders().items()}


def test_the_shipped_environment_code_contract_is_the_shipped_set():
    """The code shipped to agents (`envlib.zip`) must run in a workspace alone: the contract's list is exactly
    the shipped modules, and the package's `__init__` (shipped too) imports shipped modules only."""
    from a2rl_bench.benchmarks import TASKS, get_task
    from a2rl_bench.benchmarks.envs.export import SHARED_MODULES

    section = contract("envlib-alone")
    shipped = {f"a2rl_bench.benchmarks.envs.{name}" for name in SHARED_MODULES if name != "__init__"}
    for name in TASKS.names():  # and the environment modules each built-in interactive task declares
        if TASKS.ref(name).source == "built-in" and hasattr(task := get_task(name), "agent_environment"):
            shipped |= set(task.agent_environment.modules)
    assert set(listed(section, "source_modules")) == shipped
    rest = {f"a2rl_bench.benchmarks.envs.{p.stem}" for p in (ROOT / "benchmarks" / "envs").glob("*.py")} - shipped
    assert set(listed(section, "forbidden_modules")) >= rest - {"a2rl_bench.benchmarks.envs.__init__"}
    imported = subprocess.run(
        [sys.executable, "-c", "import grimp; print(*grimp.build_graph('a2rl_bench', cache_dir=None)"
         ".find_modules_directly_imported_by('a2rl_bench.benchmarks.envs'))"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=600).stdout.split()  # fmt: skip
    assert set(imported) <= shipped


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
LIBRARY_MODULES = {"__init__", "__main__", "contracts", "jsonl", "locks", "ngrams", "paths", "records", "registry", "run",
                   "safetext", "run_options", "setting", "workspace"}  # fmt: skip


def test_the_library_top_level_is_its_concept_packages_and_a_few_shared_modules():
    """A new module goes into the package of its concept (docs/architecture.md has the table), not beside them."""
    top = ROOT / "a2rl_bench"
    packages = {p.name for p in top.iterdir() if p.is_dir() and not p.is_symlink() and p.name != "__pycache__"}
    modules = {p.stem for p in top.glob("*.py")}
    assert packages == LIBRARY_PACKAGES and modules == LIBRARY_MODULES
    documented = (ROOT / "docs" / "architecture.md").read_text()
    for package in LIBRARY_PACKAGES - {"templates", "cli"}:
        for module in (top / package).glob("*.py"):
            if module.name != "__init__.py":
                assert f"{package}/{module.name}" in documented, (
                    f"a2rl_bench/{package}/{module.name} is not in the table"
                )


def test_each_library_package_sits_in_one_band_of_the_layers():
    """A package whose modules the library layers place apart, with another package between them, has an arrow up
    as a package (the leak audit placed above grading while isolation's other modules sat below the workspace)."""
    lines = [[m.strip().split(".")[0] for m in line.replace("|", ":").split(":")]
             for line in (ln.split("#")[0].strip() for ln in contract("library-layers")["layers"].splitlines()) if line]  # fmt: skip
    order = [package for line in lines for package in dict.fromkeys(line)]
    bands = {p: [i for i, q in enumerate(order) if q == p] for p in set(order)}
    split = {p for p, at in bands.items() if at != list(range(at[0], at[-1] + 1))}
    assert not split, f"packages split across the layers: {sorted(split)}"
