"""The exact parameter count a checkpoint's config implies, against its safetensors headers: run in the evaluation
process before any weight is loaded, so a config that would build a larger model than its weights fails as a
load error instead of growing until the memory limit.

The grader's own check (`a2rl_bench.grading.weights`) is cheap and conservative; this one builds the model on the meta
device (shapes, no memory) from the config transformers will load, counts its parameters (tied ones once), and
compares with the tensors the headers declare. Counts, not names and shapes: transformers may fuse or rename
tensors at load time (mixture-of-experts layouts), which keeps the count. Allowed beyond the model's parameters:
a saved copy of a tied output head and persistent buffers (old rotary caches).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ConfigMismatch(ValueError):
    """The config does not describe the weights beside it."""


def check_config_matches_weights(model_dir: Path) -> int | None:
    """Raise ConfigMismatch unless the safetensors in `model_dir` hold exactly the parameters its config implies;
    returns that count (None where there are no safetensors: `.bin` weights are bounded by the memory limit)."""
    from safetensors import safe_open

    from a2rl_bench.inference import llama_forward

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    if llama_forward.unsupported_reason(Path(model_dir)) is None:  # counted without importing transformers
        expected, slack = llama_forward.parameter_count(json.loads((Path(model_dir) / "config.json").read_text()))
    else:
        counted = _transformers_parameter_count(model_dir)
        if counted is None:
            return None
        expected, slack = counted
    held = 0
    for f in files:
        with safe_open(f, "pt") as st:  # the header only
            for key in st.keys():
                shape = st.get_slice(key).get_shape()
                n = 1
                for d in shape:
                    n *= d
                held += n
    if not expected <= held <= expected + slack:
        raise ConfigMismatch(f"size mismatch: config.json implies {expected} parameters but the safetensors "
                             f"files hold {held}")  # fmt: skip
    return expected


def _transformers_parameter_count(model_dir: Path) -> tuple[int, int] | None:
    """The parameters of the model transformers builds from the config (on the meta device), and the slack the
    files may hold beyond them; None for a quantized checkpoint."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    if getattr(config, "quantization_config", None):
        return None  # packed low-bit tensors do not count parameters
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in model.parameters())  # a tied parameter is yielded once
    # The state dict names a tied parameter under each of its names, and holds the persistent buffers.
    return expected, sum(v.numel() for v in model.state_dict().values()) - expected


# -- the model's size from its config (the grader's checks and the evaluation's memory cap) ----------------------
class ConfigSizeError(ValueError):
    """A size number in config.json that is not a positive integer within its bound."""


SIZE_FIELDS = {
    "hidden": (("hidden_size", "n_embd", "d_model"), 1 << 17),
    "layers": (("num_hidden_layers", "n_layer", "num_layers"), 1 << 12),
    "vocab": (("vocab_size",), 1 << 22),
    "intermediate": (("intermediate_size", "n_inner", "ffn_dim"), 1 << 20),
    "heads": (("num_attention_heads", "n_head"), 1 << 12),
    "kv_heads": (("num_key_value_heads",), 1 << 12),
    "head_dim": (("head_dim",), 1 << 14),
    "experts": (("num_local_experts", "num_experts", "n_routed_experts"), 1 << 14),
    "moe_intermediate": (("moe_intermediate_size",), 1 << 20),
    "positions": (("max_position_embeddings", "n_positions"), 1 << 24),
    "embedding": (("word_embed_proj_dim", "embedding_size"), 1 << 17),
}  # fmt: skip
"""Config numbers that size the model: (names a family may use, the largest value accepted)."""


def config_sizes(config: dict[str, Any]) -> dict[str, int]:
    """The config's size-determining numbers; each must be a positive integer within its bound."""
    sizes: dict[str, int] = {}
    for key, (names, bound) in SIZE_FIELDS.items():
        name = next((n for n in names if config.get(n) is not None), None)
        if name is None:
            continue
        value = config[name]
        if type(value) is not int or not 0 < value <= bound:
            raise ConfigSizeError(f"config.json {name} = {json.dumps(value)[:40]} is not a positive integer up "
                                     f"to {bound}")  # fmt: skip
        sizes[key] = value
    return sizes


def estimated_parameters(sizes: dict[str, int]) -> int:
    """A decoder's parameter count implied by its config: embedding, and per layer the attention projections and
    the feed-forward (every expert of a mixture). Conservative: biases, norms, a separate output head left out."""
    h, layers, vocab = sizes.get("hidden", 0), sizes.get("layers", 0), sizes.get("vocab", 0)
    heads = sizes.get("heads", 1)
    head_dim = sizes.get("head_dim", h // heads if heads else 0)
    kv = sizes.get("kv_heads", heads)
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    if "experts" in sizes and "moe_intermediate" in sizes:
        ffn = 2 * h * sizes["moe_intermediate"] * sizes["experts"]
    else:
        ffn = 2 * h * sizes.get("intermediate", 0)
    return vocab * sizes.get("embedding", h) + layers * (attention + ffn)


def architecture_parameters(model_dir: Path) -> int | None:
    """The parameters of the model `config.json` describes (the grader's estimate, plus an untied output head),
    or None where the config is unreadable or names no size. The evaluation loads exactly this model (its count
    is checked against the weights before loading, `config_check`), whatever else the files hold."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        sizes = config_sizes(config) if isinstance(config, dict) else {}
    except (OSError, ValueError):
        return None
    if not {"hidden", "layers", "vocab"} <= sizes.keys():
        return None
    head = 0 if config.get("tie_word_embeddings") is True else sizes["vocab"] * sizes["hidden"]
    return estimated_parameters(sizes) + head
