"""Prefect Blocks for LLM agents: the driver LLM (endpoint, prices, key) and the agent scaffold's settings.

Create them once (UI or Python), then name them in a run: `RunConfig.driver` = a `DriverConfig` block,
optionally an `AgentConfig` block for scaffold settings.

    DriverConfig(model="claude-sonnet-4-5", api_key="sk-ant-...", input_usd_per_mtok=3.0,
                 output_usd_per_mtok=15.0, cache_read_usd_per_mtok=0.3, cache_write_usd_per_mtok=3.75
                 ).save("sonnet")
    DriverConfig(model="Qwen/Qwen2.5-7B-Instruct", api="openai", base_url="http://gpu01:8000/v1",
                 api_key="none").save("qwen-vllm")     # OpenAI-compatible (vLLM): codex, opencode, openhands
    DriverConfig(model="gemini-2.5-pro", api="gemini", api_key_env="GEMINI_API_KEY",
                 input_usd_per_mtok=1.25, output_usd_per_mtok=10.0).save("gemini-pro")   # gemini, openhands

Which agents speak which API: claude-code (anthropic), codex (openai), gemini (gemini), opencode (openai,
anthropic), openhands (all three), claude-tools (anthropic). The key is either stored in the block (a secret)
or named by `api_key_env` and read from the harness's environment when the run starts.

The field names match `a2rl_bench.agents.LLMDriver` / `a2rl_bench.agents.AgentOptions`, which are made from a block with
`LLMDriver.model_validate(block)` (or `a2rl_bench.agents.get_agent(id, driver=block, options=block)`).
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from a2rl_bench.records import DriverFields


class DriverConfig(Block, DriverFields):
    """A driver LLM: model id, endpoint, API key and per-token prices (USD per million tokens); its fields are
    `a2rl_bench.records.DriverFields` (there without Prefect, for `a2rl drivers add`)."""

    _block_type_name = "a2rl Driver Config"
    _description = "Driver LLM of an a2rl agent: model id, endpoint, API key, prices."


class AgentConfig(Block):
    """Scaffold settings of an LLM agent (turn and cost limits, tool timeouts, context management)."""

    _block_type_name = "a2rl Agent Config"
    _description = "Settings of an a2rl LLM agent scaffold (claude-tools, claude-code, codex, gemini, opencode, openhands)."

    scaffold: str = Field(default="claude-tools", description="Agent id: claude-tools, claude-code, codex, gemini, "
                          "opencode or openhands.")  # fmt: skip
    driver: str | None = Field(default=None, description="Name of the DriverConfig block to use by default.")
    max_turns: int = Field(default=500, ge=1, description="LLM calls per session (safety stop).")
    max_output_tokens: int = Field(default=8192, ge=1)
    command_timeout_s: float = Field(default=900.0, gt=0, description="Default per-command timeout.")
    max_command_timeout_s: float = Field(default=3 * 3600.0, gt=0)
    output_limit_chars: int = Field(default=20_000, ge=1000, description="Tool output is cut in the middle above.")
    context_limit_tokens: int = Field(default=150_000, ge=1000, description="Compact the conversation above.")
    keep_last_messages: int = Field(default=30, ge=4)
    max_nudges: int = Field(default=3, ge=0, description="Times a model that stops early is told to go on.")
    max_cost_usd: float | None = Field(default=None, description="Stop the session at this driver cost.")
    retry_base_s: float = Field(default=2.0, gt=0, description="First backoff after a transient API error.")
    max_attempts: int = Field(default=8, ge=1)
    extra_args: list[str] = Field(default_factory=list, description="Extra arguments for CLI agents.")


class BlockNotFound(LookupError):
    """No block of that type and name is stored on the Prefect server in use."""


def load_driver_config(name: str) -> DriverConfig:
    """The `DriverConfig` block `name`; a missing one raises `BlockNotFound` saying how to create it."""
    return _load(DriverConfig, name, 'DriverConfig(model="claude-sonnet-4-5", api_key="...").save("{name}")')


def load_agent_config(name: str) -> AgentConfig:
    """The `AgentConfig` block `name`; a missing one raises `BlockNotFound` saying how to create it."""
    return _load(AgentConfig, name, 'AgentConfig(scaffold="claude-tools").save("{name}")')


def _load(cls: type[Block], name: str, example: str):
    try:
        return cls.load(name)
    except ValueError as e:
        if "Unable to find block document" not in str(e) and "not found" not in str(e).lower():
            raise
        raise BlockNotFound(
            f"no {cls.__name__} block named {name!r} on the Prefect server in use; create it in the UI "
            f"(Blocks > {cls._block_type_name}) or in Python: from blocks import {cls.__name__}; "
            + example.format(name=name)
        ) from e


def driver_from_block(block: DriverConfig):
    """The `LLMDriver` a block describes, its key read from `api_key_env` when the block names one (an unset
    variable is an error that says so, not a silent empty key)."""
    import os

    from a2rl_bench.agents.base import LLMDriver

    driver = LLMDriver.model_validate(block)
    if block.api_key_env:
        if not os.environ.get(block.api_key_env):
            raise ValueError(f"driver {block.model!r} reads its API key from ${block.api_key_env}, which is not set "
                             "in the harness's environment")  # fmt: skip
        driver = driver.model_copy(update={"api_key": SecretStr(os.environ[block.api_key_env])})
    return driver


def resolve_driver(name: str):
    """The driver LLM a run names: a saved `DriverConfig` block of that name, else a bare model id served by
    Anthropic (or `ANTHROPIC_BASE_URL`) with `ANTHROPIC_API_KEY` from the environment (prices then unknown,
    so costs read 0: save a block to get costs). `none` means a scripted agent."""
    from a2rl_bench.agents.base import LLMDriver

    if name in ("", "none"):
        return None
    try:
        return driver_from_block(load_driver_config(name))
    except BlockNotFound:
        if (driver := driver_from_env(name)) is None:
            raise
        return driver


def driver_from_env(model: str):
    """A bare model id served by Anthropic (or `ANTHROPIC_BASE_URL`) with `ANTHROPIC_API_KEY`; None without a key."""
    import os

    from a2rl_bench.agents.base import LLMDriver

    if not os.environ.get("ANTHROPIC_API_KEY"):
        return None
    return LLMDriver(model=model, api_key=os.environ["ANTHROPIC_API_KEY"], base_url=os.environ.get("ANTHROPIC_BASE_URL"))
