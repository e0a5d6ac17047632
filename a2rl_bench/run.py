"""Identity and context of one benchmark run, and the manifest written at its start."""

from __future__ import annotations

import json
import platform
import subprocess
import uuid
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from a2rl_bench import __version__ as a2rl_version
from a2rl_bench.records import RunConfig
from a2rl_bench.workspace import RunPaths

if TYPE_CHECKING:
    from a2rl_bench.isolation.sandbox import SandboxPolicy

MANIFEST_PACKAGES = ("prefect", "torch", "transformers", "trl", "peft", "datasets", "duckdb", "fastapi")


class RunContext(BaseModel):
    """Passed between the subflows of a run (serialisable, so Prefect can record it)."""

    run_id: str
    config: RunConfig
    paths: RunPaths
    results_path: Path
    variant_label: str = ""


def make_run_id(config: RunConfig, flow_run_id: str | None) -> str:
    """Stable for one flow run: a Prefect retry keeps its flow-run id, so it resumes the same run;
    a new invocation is a new run of the same config (same `config_hash`)."""
    suffix = (flow_run_id or uuid.uuid4().hex).replace("-", "")[:8]
    names = [name.replace("/", ".") for name in (config.task, config.agent)]  # a namespaced plug-in: one folder
    return f"{names[0]}-{names[1]}-{config.config_hash()[:6]}-{suffix}"


class Machine(BaseModel):
    host: str
    cpu_count: int
    gpus: list[str]


class Provenance(BaseModel):
    """What a run ran with and where: written into its manifest at the start of each attempt and, from there, into
    its record (report.json), so a number can be traced to the code, packages and machine that produced it."""

    packages: dict[str, str | None]
    """Versions of the packages that shape the numbers (None: not installed)."""
    python: str
    platform: str
    machine: Machine
    harness_git_revision: str | None

    @classmethod
    def here(cls) -> Provenance:
        # The harness's own version from the code that runs (its distribution is a2rl-bench; a distribution named
        # `a2rl` is another project on PyPI, which must never be reported as this one).
        packages = {"a2rl": a2rl_version, **{name: _version(name) for name in MANIFEST_PACKAGES}}
        return cls(packages=packages, python=platform.python_version(),
                   platform=platform.platform(), harness_git_revision=_git_revision(),
                   machine=Machine(host=host_name(), cpu_count=_cpu_count(), gpus=gpu_names()))  # fmt: skip

    @classmethod
    def of_run(cls, harness_dir: Path) -> Provenance:
        """The provenance the run's manifest recorded (its latest attempt's), else this process's."""
        try:
            return cls.model_validate_json((harness_dir / "manifest.json").read_text())
        except (OSError, ValueError):  # no manifest, or one from before it carried all of these
            return cls.here()


def write_manifest(ctx: RunContext) -> dict:
    manifest = {
        "run_id": ctx.run_id,
        "config": ctx.config.model_dump(mode="json"),
        "config_hash": ctx.config.config_hash(),
        **Provenance.here().model_dump(mode="json"),
    }
    (ctx.paths.harness_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def host_name() -> str:
    """The host a run ran on: A2RL_HOST where the operator names hosts (several workers of one machine), else the
    machine's name."""
    import os
    import socket

    return os.environ.get("A2RL_HOST") or socket.gethostname()


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


def visible_gpus() -> tuple[str, ...]:
    """Host indices of the GPUs this process may use (CUDA_VISIBLE_DEVICES, else all that torch sees)."""
    import os

    if (visible := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return tuple(g.strip() for g in visible.split(",") if g.strip())
    try:
        import torch

        return tuple(str(i) for i in range(torch.cuda.device_count()))
    except ImportError:
        return ()


def gpu_names() -> list[str]:
    """Names of the GPUs this process sees (empty without torch or a driver)."""
    try:
        import torch

        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch or no driver: no GPUs to report
        return []


def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def sandbox_for(ctx: RunContext, grading_url: str, uses_llm: bool) -> tuple[SandboxPolicy | None, str]:
    """The run's sandbox policy and the honest one-line label that goes into the ledger and the report."""
    from a2rl_bench.isolation.sandbox import SandboxPolicy, sandbox_label

    c = ctx.config
    if c.sandbox == "off":
        return None, "off (by configuration): the agent runs with the harness's rights"
    policy = SandboxPolicy.for_grader(
        ctx.paths.workspace, grading_url, gpus=visible_gpus(), max_workspace_bytes=c.max_workspace_bytes,
        status_path=ctx.paths.harness_dir / "sandbox.json", allow_unsandboxed=c.sandbox == "auto",
    )  # fmt: skip
    label = sandbox_label(policy)  # raises SandboxUnavailable when `required` and bubblewrap cannot run
    if uses_llm:  # the key stays with the runner; what the model has run goes through the policy
        label += ("; LLM agent: its runner (the model loop, with the driver's key and network access) runs on the "
                  "host; every tool command (claude-tools) or the whole CLI with its tools (claude-code, codex: LLM "
                  "calls through the harness's proxy) runs in this sandbox; claude-tools' file tools run in the "
                  "runner, confined to the workspace")  # fmt: skip
    return policy, label
