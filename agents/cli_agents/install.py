"""Where a CLI agent's program is installed, what it loads at run time, and whether it starts.

A CLI is looked up on PATH, then in the npm prefix that `make test` / `make tools` links as `.tools/npm`
(pinned versions, installed once per machine in a cache outside the checkout: scripts/tools.sh), and its links
are resolved to the real file (`find_cli`). What the sandbox must bind read-only is found from the install itself: the
command's directory, its npm package and every package it depends on at run time (dependencies and
optional ones such as codex's `@openai/codex-linux-x64`, resolved the way node resolves them), and the same
for the interpreter its `#!` line names. Nothing under /usr (bound in every sandbox), and never / or the
home directory whole.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

from a2rl_bench import paths

PROJECT_ROOT = paths.import_root()
"""Where `import a2rl_bench` finds this harness: a checkout's root, or the site-packages of an installed wheel."""
TOOLS_DIR = Path(os.environ.get("A2RL_TOOLS_DIR") or (paths.checkout_root() or paths.a2rl_home_path()) / ".tools")
"""Where `make tools` links the pinned CLIs (a checkout's git-ignored `.tools`; an installed wheel's under the cache
root); A2RL_TOOLS_DIR points elsewhere (a shared install)."""
LOCAL_PREFIX = (TOOLS_DIR / "npm").resolve()
"""The npm prefix holding the pinned CLIs: `.tools/npm` links into the machine-wide tools cache
(scripts/tools.sh), and the link is followed here, so that a sandbox binds the real directories the CLIs'
relative links lead to."""
LOCAL_BINS = (LOCAL_PREFIX / "node_modules" / ".bin", (TOOLS_DIR / "openhands").resolve() / "bin")
"""Where the project-local installs put their commands (npm's bin links; OpenHands' own venv)."""


def search_path(path: str | None) -> str:
    """PATH with the project-local bin directories last: a CLI installed on PATH wins."""
    return ":".join([path or os.defpath, *map(str, LOCAL_BINS)])


def which_cli(executable: str, path: str | None = None) -> Path | None:
    """The command `executable` as PATH (default: this process's) shows it, else in the project-local prefix."""
    found = shutil.which(executable, path=search_path(path if path is not None else os.environ.get("PATH")))
    return Path(found) if found else None


def find_cli(executable: str, path: str | None = None) -> Path | None:
    """The one rule for a CLI: `which_cli`, its links resolved to the real file. That file is what the preflight
    probes and the session starts, and its directories are what the sandbox binds: a link seen through a
    linked directory (`.tools/npm/node_modules/.bin/codex`) would point, inside the sandbox, at a path that is
    not there."""
    found = which_cli(executable, path)
    return found.resolve() if found else None


def install_dirs(command: Path | str, path: str | None = None) -> list[Path]:
    """Host directories the CLI at `command` needs to start (see the module docstring)."""
    found = Path(command) if os.sep in str(command) else which_cli(str(command), path)
    if found is None or not found.exists():
        return []
    target = found.resolve()
    # The directory PATH shows (an interpreter found by name, `#!/usr/bin/env node`, is looked up there inside
    # the sandbox too) and the one the file really is in.
    dirs = [found.parent, target.parent]
    package = npm_package(target)
    dirs += [package, *runtime_dependencies(package)] if package else [target.parent]
    dirs += python_venv(found.parent.parent)
    interpreter = shebang_interpreter(found)
    if interpreter and Path(interpreter).name != found.name:  # `#!/usr/bin/env node`: node's directories too
        dirs += install_dirs(interpreter, path)
    usr, never = Path("/usr"), {Path("/"), Path.home()}
    return [d for d in dict.fromkeys(dirs) if d not in never and d != usr and usr not in d.parents]


def npm_package(target: Path) -> Path | None:
    """The topmost directory below node_modules with a package.json that holds `target`, if any."""
    if "node_modules" not in target.parts:
        return None
    package = None
    for d in target.parents:
        if d.name == "node_modules":
            break
        if (d / "package.json").is_file():
            package = d
    return package


def runtime_dependencies(package: Path) -> list[Path]:
    """Installed packages `package` may load: its dependencies and optional dependencies, transitively,
    each resolved as node does (`node_modules/NAME` in the package, then in each directory above)."""
    seen: dict[Path, None] = {}
    todo = [package]
    while todo:
        pkg = todo.pop()
        try:
            manifest = json.loads((pkg / "package.json").read_text())
        except (OSError, ValueError):
            continue
        names = {**(manifest.get("dependencies") or {}), **(manifest.get("optionalDependencies") or {})}
        for name in names:
            dep = resolve_package(pkg, name)
            if dep is None or dep in seen or dep == package:
                continue
            # A linked package (npm link, pnpm) is bound at its link's path and at its target, which node
            # loads it from.
            seen.update(dict.fromkeys([dep, dep.resolve()]))
            todo.append(dep.resolve())
    return list(seen)


def resolve_package(start: Path, name: str) -> Path | None:
    for d in (start, *start.parents):
        candidate = d / "node_modules" / name
        if (candidate / "package.json").is_file():
            return candidate
    return None


def python_venv(root: Path) -> list[Path]:
    """A Python venv's directory and its base interpreter's prefix (the standard library), for a command in
    its bin/ (OpenHands' own venv); [] if `root` is no venv."""
    try:
        lines = (root / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return []
    config = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in lines)}
    home = Path(config.get("home") or "/")
    return [root, home.parent] if home.is_absolute() and home != Path("/") else [root]


def shebang_interpreter(command: Path) -> str | None:
    """The program a script's `#!` line runs: a path (`/opt/venv/bin/python`) or a name looked up on PATH
    (`node` for `#!/usr/bin/env node`); None for a binary."""
    try:
        with open(command, "rb") as f:
            line = f.readline(400)
    except OSError:
        return None
    words = line[2:].split() if line.startswith(b"#!") else []
    if not words:
        return None
    program = words[-1].decode(errors="replace")
    return program if Path(program).is_absolute() and Path(words[0].decode()).name != "env" else Path(program).name


NODE_MAJOR_LEAST = 20
"""The oldest Node the agent CLIs run on, whatever a package's `engines` says (codex asks for >=16, yet its
bundle needs 20): the floor `make tools` checks (scripts/tools.sh npm; tests/test_tools_cache.py holds them equal)."""


def node_mismatch(command: Path, path: str | None) -> str | None:
    """For a node CLI, where the Node on PATH is older than its package asks (`engines.node`, e.g. ">=20") or
    than NODE_MAJOR_LEAST: one clause naming that node, its version and how to choose another; else None."""
    import re

    interpreter = shebang_interpreter(command)
    package = npm_package(command.resolve())
    if not interpreter or Path(interpreter).name != "node" or package is None:
        return None
    try:
        wanted = json.loads((package / "package.json").read_text()).get("engines", {}).get("node", "")
    except (OSError, ValueError, AttributeError):
        wanted = ""
    node = which_cli("node", path)
    asked = re.search(r"(\d+)", wanted if isinstance(wanted, str) else "")
    least = max(NODE_MAJOR_LEAST, int(asked.group(1)) if asked else 0)
    if node is None:
        return None
    try:
        version = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    have = re.match(r"v?(\d+)", version)
    if have is None or int(have.group(1)) >= least:
        return None
    return (f"the Node on PATH is {node} {version}, and {package.name} needs Node >= {least}: put a newer Node's "
            f"bin directory first on PATH (e.g. PATH=/opt/node-22/bin:$PATH), or install one (apt-get install nodejs)")


TOO_BUSY = "the machine is too busy to tell whether it works; try again when it is quieter"
"""The end of `check_starts`'s answer when the program only ran out of time (not a reason to reinstall)."""


def check_starts(argv: list[str], env: dict[str, str], sandbox=None, timeout_s: float = 60.0) -> str | None:
    """Run `argv` (a CLI's `--version`) as the session would run it, in the sandbox `sandbox` (a
    `SandboxPolicy`, with the CLI's install directories bound) or on the host; None if it exits 0, else one
    line saying why it cannot start. `timeout_s` is for an idle machine: it grows with the load, and a
    program that runs out of time gets a second, longer try before the answer says the machine is busy."""
    from a2rl_bench.isolation.sandbox import wrap
    from a2rl_bench.ops.load import describe_load, scaled_timeout

    if sandbox is not None:
        sandbox = replace(sandbox, extra_ro=(*sandbox.extra_ro, *install_dirs(argv[0], env.get("PATH"))))
        argv, env = wrap(argv, env, sandbox)
    for attempt in (1, 2):
        timeout = scaled_timeout(timeout_s) * attempt
        try:
            done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                                  cwd=sandbox.workspace if sandbox is not None else None)  # fmt: skip
            break
        except subprocess.TimeoutExpired:
            if attempt == 2:
                return f"`{' '.join(argv[-2:])}` did not answer within {timeout:.0f} s, twice ({describe_load()}): {TOO_BUSY}"
        except OSError as e:
            return f"`{' '.join(argv[-2:])}` did not run: {e}"
    if done.returncode == 0:
        return None
    last = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
    why = next((line.strip() for line in reversed(last) if "Error" in line), last[-1] if last else "")
    return f"exit code {done.returncode}: {why[:300]}"
