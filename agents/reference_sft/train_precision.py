"""Training precision for the reference agents' scripts: bf16 on a CUDA GPU that supports it, fp32 on CPU.

Stand-alone (copied into the workspace's `code/` beside `train_sft.py` / `train_grpo.py`, which import it as a
sibling module): imports nothing from the harness.

On a GPU, fp32 training is 2.5x slower than bf16 (0.5B LoRA, batch 8 x 1024 tokens on an H100: 0.60 vs 0.24
s/step) and a 7B model does not fit one 80 GB card in fp32. So on CUDA:
* LoRA: weights loaded in bf16 (the base model is frozen; peft keeps the adapters in fp32) and bf16 autocast;
* full fine-tuning (small models): fp32 master weights (bf16 weights would lose small updates) + bf16 autocast;
* gradient checkpointing from 3B parameters (activations, not weights, fill the card there).
On CPU everything stays fp32 (bf16 matmuls are slow on most CPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKPOINTING_MIN_PARAMS = 3_000_000_000


@dataclass(frozen=True)
class Precision:
    load_dtype: str
    """torch dtype name the weights are loaded in: `bfloat16` or `float32`."""
    bf16: bool
    """Trainer's bf16 autocast."""
    gradient_checkpointing: bool

    def trainer_kwargs(self) -> dict:
        """Keyword arguments for `TrainingArguments` / `SFTConfig` / `GRPOConfig`."""
        kwargs = {"bf16": self.bf16, "fp16": False, "gradient_checkpointing": self.gradient_checkpointing}
        if self.gradient_checkpointing:
            kwargs["gradient_checkpointing_kwargs"] = {"use_reentrant": False}  # works with frozen LoRA bases
        return kwargs


def choose_precision(n_params: int, lora: bool, cuda: bool | None = None, bf16_supported: bool | None = None):
    """The precision for a model of `n_params` on this machine (or on the one described by the flags)."""
    if cuda is None or bf16_supported is None:
        import torch

        cuda = torch.cuda.is_available() if cuda is None else cuda
        bf16_supported = (cuda and torch.cuda.is_bf16_supported()) if bf16_supported is None else bf16_supported
    if not (cuda and bf16_supported):
        return Precision("float32", bf16=False, gradient_checkpointing=False)
    return Precision("bfloat16" if lora else "float32", bf16=True,
                     gradient_checkpointing=n_params >= CHECKPOINTING_MIN_PARAMS)


def count_parameters(init: str) -> int:
    """Parameters of the checkpoint at `init`, counted on the meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(init))
    return sum(p.numel() for p in model.parameters())


def load_for_training(init: str, lora: bool | None, lora_auto_min_params: int):
    """(model, n_params, use_lora, precision): LoRA decided from the size unless `lora` is given, the
    weights loaded in the dtype the precision asks for."""
    import torch
    from transformers import AutoModelForCausalLM

    n_params = count_parameters(init)
    use_lora = lora if lora is not None else n_params > lora_auto_min_params
    precision = choose_precision(n_params, use_lora)
    model = AutoModelForCausalLM.from_pretrained(init, dtype=getattr(torch, precision.load_dtype))
    if precision.gradient_checkpointing and use_lora:
        model.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input under frozen weights
    return model, n_params, use_lora, precision
