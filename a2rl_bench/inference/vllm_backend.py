"""The vLLM inference backend (optional extra, GPU): same prompts and decoding as `a2rl_bench.inference.generation`.

Prompts are rendered with the checkpoint's own chat template, exactly as the transformers backend does, and
decoded greedily (temperature 0) with the task's stop strings, so the two backends grade the same thing.
vLLM pins its own torch and transformers, so it usually lives in its own environment: with A2RL_VLLM_PYTHON
(that environment's interpreter) or A2RL_GENERATION_URL (a `vllm serve` of the checkpoint) set, generation
goes there (`a2rl_bench.inference.remote_generation`); otherwise vllm is imported here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from a2rl_bench.inference.generation import Conversation, GenerationOutput


class VLLMUnavailable(RuntimeError):
    """vllm is not installed (it is an optional extra: `pip install 'a2rl[vllm]'` on a GPU machine)."""


def generate_vllm(
    model_dir: str | Path,
    conversations: Sequence[Conversation],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    stop: Sequence[str] = (),
    gpu_memory_utilization: float = 0.85,
) -> GenerationOutput:
    from a2rl_bench.inference.remote_generation import RemoteSettings, generate_remote

    if RemoteSettings.from_env().configured:
        return generate_remote(model_dir, conversations, max_new_tokens=max_new_tokens, temperature=temperature,
                               stop=stop)
    try:
        from vllm import LLM, SamplingParams
    except ImportError as e:
        raise VLLMUnavailable(
            "eval_backend='vllm' needs vllm: set A2RL_VLLM_PYTHON to the python of an environment with vllm "
            "(python -m venv vllm-env && vllm-env/bin/pip install vllm; it pins its own torch and transformers), "
            "or A2RL_GENERATION_URL to a `vllm serve` of the checkpoint, or pip install 'a2rl[vllm]' here"
        ) from e
    llm = LLM(model=str(model_dir), gpu_memory_utilization=gpu_memory_utilization, seed=0)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    params = SamplingParams(temperature=temperature, max_tokens=max_new_tokens, stop=list(stop) or None)
    started = time.perf_counter()
    outputs = llm.generate(prompts, params)
    completions = [o.outputs[0].text for o in outputs]
    counts = [len(o.outputs[0].token_ids) for o in outputs]
    return GenerationOutput(completions=completions, completion_tokens=counts, generated_tokens=sum(counts),
                            seconds=time.perf_counter() - started)
