"""Prefect Blocks of a2rl (import this package before `Block.load("<type-slug>/<name>")`, which needs the classes)."""

from a2rl_bench.blocks.llm import (
    AgentConfig,
    BlockNotFound,
    DriverConfig,
    driver_from_env,
    load_agent_config,
    load_driver_config,
    resolve_driver,
)

__all__ = [
    "AgentConfig", "BlockNotFound", "DriverConfig", "driver_from_env", "load_agent_config", "load_driver_config", "resolve_driver",
]
