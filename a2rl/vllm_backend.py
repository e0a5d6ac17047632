"""The vLLM inference backend (optional extra, GPU): same prompts and decoding as `a2rl.generation`.

Prompts are rendered with the checkpoint's own chat template, exactly as the transformers backend does, and
decoded greedily (temperature 0) with the task's stop strings, so the two backends grade the same thing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from a2rl.generation import Conversation, GenerationOutput


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
    try:
        from vllm import LLM, SamplingParams
    except ImportError as e:
        raise VLLMUnavailable(
            "eval_backend='vllm' needs vllm, an optional extra for GPU machines: pip install 'a2rl[vllm]' "
            "(in its own environment: vllm pins its own torch and transformers)"
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
