"""The pinned tools (uv, the agent CLIs, OpenHands) are installed once per machine into a cache keyed by their
versions, outside the checkout, and every clone links to it (scripts/tools.sh, issue #26)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pin(name: str) -> str:
    """A variable of the Makefile as make expands it (the CLIs' pins are read from their modules)."""
    out = subprocess.run(["make", "-s", "--no-print-directory", "--eval", f"print-pin: ; @echo '$({name})'",
                          "print-pin"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return out.stdout.strip()


def tools(*args: str, cache: Path | None = None, **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "UV_VERSION": pin("UV_VERSION"), "CLI_PACKAGES": pin("CLI_PACKAGES"),
           "OPENHANDS_VERSION": pin("OPENHANDS_VERSION"), **extra}  # fmt: skip
    if cache is not None:
        env["A2RL_TOOLS_CACHE"] = str(cache)
    return subprocess.run(["sh", str(REPO / "scripts" / "tools.sh"), *args], env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip


def test_the_cache_survives_a_fresh_home_and_can_be_pointed_elsewhere(tmp_path):
    assert tools("cache-dir", cache=tmp_path / "mine").stdout.strip() == str(tmp_path / "mine")
    env = {k: v for k, v in os.environ.items() if k != "A2RL_TOOLS_CACHE"}
    fresh = subprocess.run(["sh", str(REPO / "scripts" / "tools.sh"), "cache-dir"], capture_output=True, text=True,
                           env={**env, "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": ""})  # fmt: skip
    where = fresh.stdout.strip()
    if os.access("/var/cache", os.W_OK):  # a system cache dir: every HOME (CI's too) finds the same installs
        assert where == "/var/cache/a2rl/tools"
    else:
        assert where == str(tmp_path / "home" / ".cache" / "a2rl_bench" / "tools")


def test_uv_is_installed_once_per_version_even_by_clones_at_the_same_time(tmp_path):
    """Two clones installing at once: one installs under the lock, the other waits and uses it; a later call
    installs nothing. The directory is named by the pinned version, so a bump installs anew beside it."""
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: tools("uv", cache=cache), range(2))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    uv = Path(first.stdout.strip())
    assert uv == Path(second.stdout.strip()) == cache / f"uv-{pin('UV_VERSION')}" / "bin" / "uv"
    marker = uv.parent.parent / ".a2rl-installed"
    installed_at = marker.stat().st_mtime_ns
    assert tools("uv", cache=cache).stdout.strip() == str(uv) and marker.stat().st_mtime_ns == installed_at
    version = subprocess.run([str(uv), "--version"], capture_output=True, text=True).stdout
    assert version.split()[:2] == ["uv", pin("UV_VERSION")]


def test_a_checkout_links_the_shared_install_and_the_sandbox_binds_its_real_paths():
    from a2rl_bench.agents.cli_agents import install

    link = install.TOOLS_DIR / "npm"
    if not link.is_symlink():
        pytest.skip("`make tools` has not linked .tools/npm in this checkout")
    target = link.resolve()
    assert re.fullmatch(r"npm-[0-9a-f]{12}", target.name) and (target / ".a2rl-installed").is_file()
    assert install.LOCAL_PREFIX == target  # followed: the CLIs' relative links resolve inside a sandbox too
    claude = install.find_cli("claude", path="/nonexistent")
    assert claude is not None and str(claude).startswith(str(target))
    assert all(str(d).startswith(str(target)) for d in install.install_dirs(claude, path="/usr/bin:/bin")
               if "node_modules" in str(d))  # fmt: skip


def test_a_marked_install_whose_program_is_gone_is_installed_again(tmp_path):
    """Issue #36: the done-mark said installed, the program was gone; `a2rl run` said "install it with `make
    tools`", and `make tools` trusted the mark. Now each program is run (`--version`) and a broken one repaired."""
    cache = tmp_path / "cache"
    uv = Path(tools("uv", cache=cache).stdout.strip())
    uv.unlink()
    again = tools("uv", cache=cache)
    assert again.returncode == 0, again.stderr
    assert "is marked installed, but" in again.stderr and "installing it again" in again.stderr
    assert subprocess.run([str(uv), "--version"], capture_output=True).returncode == 0


def _fake_cli_package(tmp_path: Path) -> str:
    """A one-command npm package as a tarball (installed offline): CLI_PACKAGES names it as `fakecli@file:...`."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "package.json").write_text('{"name": "fakecli", "version": "1.0.0", "bin": {"fakecli": "cli.js"}}')
    (src / "cli.js").write_text('#!/usr/bin/env node\nconsole.log("fakecli 1.0.0");\n')
    tarball = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(tmp_path)], cwd=src,
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    return f"fakecli@file:{tmp_path / tarball}"


@pytest.mark.skipif(not shutil.which("npm"), reason="needs node and npm")
def test_each_installed_cli_is_run_and_a_broken_one_repaired(tmp_path):
    cache = tmp_path / "cache"
    packages = _fake_cli_package(tmp_path)
    first = tools("npm", cache=cache, CLI_PACKAGES=packages)
    assert first.returncode == 0, first.stderr
    prefix = Path(first.stdout.strip())
    program = prefix / "node_modules" / "fakecli" / "cli.js"
    program.unlink()  # as `claude.exe` went missing from a marked install
    again = tools("npm", cache=cache, CLI_PACKAGES=packages)
    assert again.returncode == 0, again.stderr
    assert "`" + str(prefix / "node_modules" / ".bin" / "fakecli") + " --version` fails" in again.stderr
    assert "installing it again" in again.stderr and program.is_file()
    quiet = tools("npm", cache=cache, CLI_PACKAGES=packages)  # a working install: nothing said, nothing done
    assert quiet.returncode == 0 and not quiet.stderr.strip()


def test_an_old_node_first_on_path_is_named_with_how_to_choose_another(tmp_path):
    fake = tmp_path / "node18"
    fake.mkdir()
    (fake / "node").write_text('#!/bin/sh\n[ "$1" = -p ] && echo 18 || echo v18.19.0\n')
    (fake / "node").chmod(0o755)
    (fake / "npm").write_text("#!/bin/sh\n")
    (fake / "npm").chmod(0o755)
    proc = tools("npm", cache=tmp_path / "cache", PATH=f"{fake}:/usr/bin:/bin")
    assert proc.returncode == 1 and f"{fake / 'node'} v18.19.0" in proc.stderr and "PATH=" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_wait_for_another_install_and_a_quiet_install_say_what_they_wait_on_and_count(tmp_path):
    """`scripts/tools.sh uv` waited in silence: on another clone's lock, and through a quiet `pip install`. Each now
    says what it waits on, then "still ... (N s)". Event-driven: the lock is let go, and the install (a stand-in
    python whose venv and pip are scripts) ends, only once the count was seen."""
    import fcntl
    import time

    cache, go = tmp_path / "cache", tmp_path / "go"
    target = cache / f"uv-{pin('UV_VERSION')}"
    cache.mkdir()
    pip = tmp_path / "pip"
    pip.write_text('#!/bin/sh\nd=$(dirname "$0")\nprintf \'#!/bin/sh\\necho uv 0\\n\' > "$d/uv"\nchmod +x "$d/uv"\n')
    python = tmp_path / "python"  # `python -m venv DIR`: waits for the test's go, then makes DIR/bin/pip
    python.write_text(f'#!/bin/sh\nuntil [ -e {go} ]; do sleep 0.2; done\nmkdir -p "$3/bin"\ncp {pip} "$3/bin/pip"\n')
    for script in (pip, python):
        script.chmod(0o755)
    err_path = tmp_path / "stderr"

    def wait_for(text: str) -> None:
        deadline = time.monotonic() + 300
        while text not in err_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.1)

    env = {**os.environ, "UV_VERSION": pin("UV_VERSION"), "A2RL_TOOLS_CACHE": str(cache), "PYTHON": str(python),
           "A2RL_WAIT_EVERY_S": "1"}  # fmt: skip
    with open(f"{target}.lock", "w") as lock, err_path.open("w") as err:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another clone installs it now
        proc = subprocess.Popen(["sh", str(REPO / "scripts" / "tools.sh"), "uv"], env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)  # fmt: skip
        try:
            wait_for(f"waiting for another install of {target} to end")
            wait_for(f"still waiting for another install of {target} (")
            fcntl.flock(lock, fcntl.LOCK_UN)
            wait_for(f"installing {target} ...")
            wait_for(f"still installing {target} (")
        finally:
            go.touch()  # the stand-in install ends whatever happened
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, err_path.read_text()
    assert out.strip() == str(target / "bin" / "uv")
    assert re.search(r"still installing .* \(\d+ s\)\n", err_path.read_text())


def test_make_tools_and_the_runs_preflight_hold_the_agent_clis_to_one_node_floor():
    """`make tools` refused Node 18 by name while a run's preflight, reading codex's `engines` (>=16), blamed the
    install: one floor, the same number in both."""
    from a2rl_bench.agents.cli_agents.install import NODE_MAJOR_LEAST

    script = (REPO / "scripts" / "tools.sh").read_text()
    assert f'if [ "$node_major" -lt {NODE_MAJOR_LEAST} ]' in script
    assert f"need Node.js >= {NODE_MAJOR_LEAST}" in script
