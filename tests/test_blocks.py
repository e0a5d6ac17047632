"""Driver and agent Blocks: stored on a Prefect server, key hidden, turned into what the agents take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from a2rl_bench.agents import AgentEnv, LLMDriver, get_agent, list_agents, uses_llm
from a2rl_bench.blocks import AgentConfig, BlockNotFound, DriverConfig, load_agent_config, load_driver_config

KEY = "sk-ant-blocks-SECRET-99"


def test_driver_and_agent_blocks_round_trip_through_the_server(prefect_harness):
    driver = DriverConfig(model="claude-sonnet-4-5", api_key=KEY, input_usd_per_mtok=3.0, output_usd_per_mtok=15.0,
                          cache_read_usd_per_mtok=0.3, cache_write_usd_per_mtok=3.75)  # fmt: skip
    driver.save("test-sonnet", overwrite=True)
    AgentConfig(scaffold="claude-tools", driver="test-sonnet", max_turns=7, max_cost_usd=2.5).save(
        "test-tools", overwrite=True
    )
    driver_block = load_driver_config("test-sonnet")
    options_block = load_agent_config("test-tools")
    assert driver_block.api_key.get_secret_value() == KEY
    assert KEY not in repr(driver_block) and KEY not in str(driver_block.model_dump())
    assert options_block.driver == "test-sonnet"

    agent = get_agent(options_block.scaffold, driver=driver_block, options=options_block)
    assert agent.driver == LLMDriver(model="claude-sonnet-4-5", api_key=KEY, input_usd_per_mtok=3.0,
                                     output_usd_per_mtok=15.0, cache_read_usd_per_mtok=0.3,
                                     cache_write_usd_per_mtok=3.75)  # fmt: skip
    assert (agent.options.max_turns, agent.options.max_cost_usd) == (7, 2.5)


def test_a_missing_block_says_how_to_create_it(prefect_harness):
    with pytest.raises(BlockNotFound) as missing:
        load_driver_config("no-such-driver")
    message = str(missing.value)
    assert "no DriverConfig block named 'no-such-driver'" in message and '.save("no-such-driver")' in message
    with pytest.raises(BlockNotFound, match="AgentConfig"):
        load_agent_config("no-such-agent")


def test_the_key_goes_only_to_the_harness_side_process(tmp_path):
    agent = get_agent("claude-tools", driver=DriverConfig(model="m", api_key=KEY, base_url="http://127.0.0.1:1"))
    env = AgentEnv("gsm8k", "tiny", tmp_path / "workspace", "http://127.0.0.1:2", "tok", 0)
    extra = agent.launch_env(env)
    assert extra["A2RL_HARNESS_API_KEY"] == KEY
    config = json.loads(extra["A2RL_HARNESS_CONFIG"])
    assert KEY not in extra["A2RL_HARNESS_CONFIG"] and config["driver"]["base_url"] == "http://127.0.0.1:1"
    assert config["harness_dir"] == str(tmp_path / "harness")  # beside the workspace, as RunPaths lays it out
    assert Path(config["harness_dir"]).is_dir()


def test_cost_uses_all_four_prices():
    driver = LLMDriver(model="m", input_usd_per_mtok=3, output_usd_per_mtok=15, cache_read_usd_per_mtok=0.3,
                       cache_write_usd_per_mtok=3.75)  # fmt: skip
    assert driver.cost_usd(1_000_000, 100_000, 2_000_000, 400_000) == pytest.approx(3 + 1.5 + 0.6 + 1.5)
    assert "api_key" not in driver.public()


def test_registry():
    # Read from the registry, not a fixed list (a new agent, built in or a plug-in, must not break this test).
    agents = list_agents()
    assert agents == sorted(agents) and {"claude-tools", "codex", "reference-grpo", "reference-sft"} <= set(agents)
    assert uses_llm("codex") and not uses_llm("reference-grpo")
    with pytest.raises(KeyError, match="known agents"):
        get_agent("gpt-agent")
    with pytest.raises(ValueError, match="scripted"):
        get_agent("reference-sft", driver=LLMDriver(model="m"))
