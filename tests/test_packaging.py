"""The distribution declares what it imports (issue #38): a fresh install must not depend on what another
package happens to pull in, and a private API we subclass must not move under us."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DISTRIBUTION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
PACKAGES = ("a2rl_bench", "agents", "analysis", "benchmarks", "blocks", "flows", "tasks")

OPTIONAL = {
    "vllm": "GPU backend, its own environment (a2rl_bench/inference/generation_worker.py imports it inside a function)",
    "pynvml": "GPU resource samples, only where an NVIDIA driver is present (guarded import)",
}
"""Third-party modules imported only where present, each with why it is not a dependency."""

AGENT_LOCAL = {"envlib", "decode_engine", "grpo_env_torch", "round_loop", "search_demos", "sft_grpo_session",
               "sft_torch", "train_common", "train_grpo", "train_precision", "train_sft", "web_agent_site", "textworld"}
"""Modules that are files copied into an agent's workspace or shipped task data (data/envlib.zip), not packages."""


def _requirement_names(lines: list[str]) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def _declared() -> tuple[set[str], dict[str, str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    data = (REPO / "requirements-data.txt").read_text().splitlines()
    pins = {re.split(r"[=<>!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-"): d for d in project["dependencies"]}
    return _requirement_names(project["dependencies"]) | _requirement_names(data), pins


def _direct_imports() -> dict[str, str]:
    """Top-level third-party module -> the first file that imports it."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_every_direct_import_is_a_declared_dependency():
    declared, _ = _declared()
    dists = md.packages_distributions()
    missing = []
    for module, where in sorted(_direct_imports().items()):
        if module in OPTIONAL or module in AGENT_LOCAL:
            continue
        owners = {d.lower().replace("_", "-") for d in dists.get(module, [])}
        if not owners & declared:
            missing.append(f"{module} (imported by {where}; distribution {sorted(owners) or 'not installed'})")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)


def test_private_api_we_subclass_is_pinned_exactly():
    """a2rl_bench/grading/server.py subclasses uvicorn's H11Protocol: an unpinned uvicorn could change it silently."""
    assert "H11Protocol" in (REPO / "a2rl_bench/grading/server.py").read_text()
    _, pins = _declared()
    for name in ("uvicorn", "h11"):
        assert "==" in pins.get(name, ""), f"{name} must be pinned exactly, got {pins.get(name)!r}"
        assert md.version(name) == pins[name].split("==")[1].split()[0], f"installed {name} differs from its pin"


def _uv() -> str:
    import subprocess

    out = subprocess.run(["sh", str(REPO / "scripts/tools.sh"), "uv"], capture_output=True, text=True,
                         env={**__import__("os").environ, "UV_VERSION": _make_var("UV_VERSION")}, check=True)
    return out.stdout.strip().splitlines()[-1]


def _make_var(name: str) -> str:
    match = re.search(rf"^{name}\s*:=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert match, f"{name} not in Makefile"
    return match.group(1)


def test_the_lock_file_matches_pyproject():
    """`make setup` installs from uv.lock; a pyproject change without `uv lock` must fail here, not on a user."""
    import subprocess

    result = subprocess.run([_uv(), "lock", "--check", "--project", str(REPO)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"uv.lock is stale (run `uv lock`): {result.stderr.strip()[-500:]}"


def test_the_vllm_environment_resolves():
    """The vLLM environment (`make vllm-env`) is resolvable from PyPI, for the Python and platform of a GPU host."""
    import subprocess

    result = subprocess.run([_uv(), "pip", "compile", "-q", str(REPO / "requirements-vllm.txt"),
                             "--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"requirements-vllm.txt does not resolve: {result.stderr.strip()[-800:]}"
    pins = dict(line.split("==", 1) for line in result.stdout.splitlines() if "==" in line and not line.startswith("#"))
    assert pins["vllm"].split()[0] == "0.31.0" and pins["torch"].split()[0].startswith("2.")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the tracked files, as a fresh checkout would build it."""
    import subprocess

    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (REPO / rel).is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            (source / rel).write_bytes((REPO / rel).read_bytes())
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(source)], check=True, capture_output=True, timeout=600)  # fmt: skip
    (built,) = wheels.glob(f"{DISTRIBUTION.replace('-', '_')}-*.whl")
    return built


def test_the_wheel_installs_one_top_level_name_and_imports_from_it(wheel, tmp_path):
    """The repository keeps the design card's top-level folders, but the wheel puts only `a2rl` into site-packages
    (`flows/` installs as `a2rl_bench/flows/`, ...): no generic name such as `agents` (the OpenAI Agents SDK's) or
    `tasks` to clash with another package. Built from a copy of the tracked files, as a fresh checkout would."""
    import subprocess
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"a2rl_bench", wheel.name.split("-py")[0] + ".dist-info"}
    for package in PACKAGES[1:]:
        assert f"a2rl_bench/{package}/__init__.py" in names
    assert "a2rl_bench/benchmarks/gsm8k/description.md" in names and "a2rl_bench/templates/instructions.md" in names
    shipped = {f"a2rl_bench/data/{p.relative_to(REPO / 'data')}" for p in (REPO / "data").glob("*/*.json")}
    assert shipped and shipped <= set(names), f"task data missing from the wheel: {sorted(shipped - set(names))}"
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import a2rl_bench.flows.benchmark_run, a2rl_bench.benchmarks, a2rl_bench.agents, sys; "
             "print(a2rl_bench.benchmarks.get_task('gsm8k').package_dir, a2rl_bench.__path__, "
             "sorted(m for m in sys.modules if m.split('.')[0] in %r))" % (PACKAGES[1:],))  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PATH": "/usr/bin:/bin",
                          "PYTHONPATH": str(site), "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert str(site / "a2rl_bench" / "benchmarks" / "gsm8k") in done.stdout and done.stdout.rstrip().endswith("[]")


def test_the_package_list_names_every_package_of_the_checkout():
    """pyproject lists the packages one by one (a package-dir mapping cannot be found automatically): a new
    package folder must join the list, or the wheel would ship without it."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {"a2rl_bench.templates", "a2rl_bench.data"}  # data/: the task data's split files, package data only
    for top in PACKAGES:
        for init in (REPO / top).rglob("__init__.py"):
            dotted = ".".join(init.parent.relative_to(REPO).parts)
            found.add(dotted if top == "a2rl_bench" else f"a2rl_bench.{dotted}")
    assert set(setuptools["packages"]) == found
    assert setuptools["package-dir"] == {f"a2rl_bench.{top}": top for top in (*PACKAGES[1:], "data")}


def test_the_distribution_is_not_named_like_another_pypi_project():
    """`a2rl` on PyPI is another project (amazon-accessible-rl-sdk, which imports as `a2rl` too): a plug-in that
    declared a dependency on `a2rl` would pull it. The distribution is `a2rl-bench`; the import package stays `a2rl`,
    and its version is the one pyproject declares."""
    import a2rl_bench

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "a2rl-bench" and project["version"] == a2rl_bench.__version__
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    assert [p["version"] for p in lock["package"] if p["name"] == "a2rl-bench"] == [a2rl_bench.__version__]
    assert not [p for p in lock["package"] if p["name"] == "a2rl"]


def test_a_run_records_the_harness_version_not_another_distributions(monkeypatch):
    """With PyPI's `a2rl` installed beside the harness, a run's provenance still names the harness's version."""
    import a2rl_bench
    from a2rl_bench.run import Provenance

    real = md.version
    monkeypatch.setattr(md, "version", lambda name: "1.2.0" if name == "a2rl" else real(name))
    assert Provenance.here().packages["a2rl"] == a2rl_bench.__version__


def test_no_module_finds_a_file_by_assuming_a_checkout():
    """A path computed upward from a module's file (`Path(__file__).parents[2] / "data"`) lands in site-packages
    once installed: files are found through `a2rl_bench.paths` (`data_file`, `package_file`, `checkout_root`, ...),
    the one module that knows both layouts."""
    upward = re.compile(r"(__file__|HERE|ROOT)\)?(\.resolve\(\))?\.(parents\[|parent\.parent)")
    found = [f"{path.relative_to(REPO)}:{n}" for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
             if path != REPO / "a2rl_bench" / "paths.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if upward.search(line)]  # fmt: skip
    assert not found, f"paths that assume a checkout: {found}"


def test_an_installed_wheel_runs_a_benchmark_run_outside_the_checkout(wheel, prefect_harness, tiny_model_dir,
                                                                       tmp_path):
    """`pip install` of the wheel into a fresh venv, then `a2rl run` from another directory: the task's split files
    come from the wheel, the run writes where it was told, nothing lands in site-packages. Offline: the venv sees
    this environment's packages through a path file (the wheel is installed without its dependencies)."""
    import os
    import subprocess
    import sysconfig

    from prefect.settings import PREFECT_API_URL

    venv = tmp_path / "venv"
    subprocess.run([_uv(), "venv", "-q", "--offline", "--python", sys.executable, str(venv)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    subprocess.run([_uv(), "pip", "install", "-q", "--offline", "--no-deps", "--python", str(venv / "bin" / "python"),
                    str(wheel)], check=True, capture_output=True, timeout=300)  # fmt: skip
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "zz_harness_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "A2RL_DEBUG")}
    env |= {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "PREFECT_API_URL": PREFECT_API_URL.value(),
            "A2RL_SFT_MAX_STEPS": "4", "A2RL_SFT_BATCH_SIZE": "4", "A2RL_SFT_MAX_LENGTH": "512",
            "A2RL_SFT_TRAIN_S": "5", "A2RL_SFT_LR": "5e-3"}  # fmt: skip
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import a2rl_bench, a2rl_bench.paths as p; "
                            "print(a2rl_bench.__file__, p.checkout_root(), "
                            "p.data_file('gsm8k', 'split-offline.json'))"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.split() == [str(site / "a2rl_bench" / "__init__.py"), "None",
                                    str(site / "a2rl_bench" / "data" / "gsm8k" / "split-offline.json")]
    before = {p for p in site.rglob("*") if "__pycache__" not in p.parts}
    done = subprocess.run([str(venv / "bin" / "a2rl"), "run", "--base-model", str(tiny_model_dir), "--budget", "20",
                           "--val-limit", "2", "--test-limit", "2", "--results", "out/r.duckdb", "--sandbox", "off"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    import duckdb

    with duckdb.connect(str(work / "out" / "r.duckdb"), read_only=True) as con:
        (status,) = con.execute("SELECT status FROM runs").fetchone()
    assert status == "completed" and len(list((work / "out" / "runs").glob("*/harness/report.json"))) == 1
    assert {p for p in site.rglob("*") if "__pycache__" not in p.parts} == before, "the run wrote into site-packages"
