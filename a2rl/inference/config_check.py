"""The exact parameter count a checkpoint's config implies, against its safetensors headers: run in the evaluation
process before any weight is loaded, so a config that would build a larger model than its weights fails as a
load error instead of growing until the memory limit.

The grader's own check (`a2rl.grading.weights`) is cheap and conservative; this one builds the model on the meta
device (shapes, no memory) from the config transformers will load, counts its parameters (tied ones once), and
compares with the tensors the headers declare. Counts, not names and shapes: transformers may fuse or rename
tensors at load time (mixture-of-experts layouts), which keeps the count. Allowed beyond the model's parameters:
a saved copy of a tied output head and persistent buffers (old rotary caches).
"""

from __future__ import annotations

from pathlib import Path


class ConfigMismatch(ValueError):
    """The config does not describe the weights beside it."""


def check_config_matches_weights(model_dir: Path) -> int | None:
    """Raise ConfigMismatch unless the safetensors in `model_dir` hold exactly the parameters its config implies;
    returns that count (None where there are no safetensors: `.bin` weights are bounded by the memory limit)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    config = AutoConfig.from_pretrained(model_dir)
    if getattr(config, "quantization_config", None):
        return None  # packed low-bit tensors do not count parameters
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in model.parameters())  # a tied parameter is yielded once
    # The state dict names a tied parameter under each of its names, and holds the persistent buffers.
    slack = sum(v.numel() for v in model.state_dict().values()) - expected
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
