"""The grader's CPU fp32 path without transformers: a Llama forward read straight from the safetensors files, and
the checkpoint's `tokenizer.json` through the `tokenizers` library with its chat template rendered by jinja2.

Why: importing transformers 5 costs an evaluation process ~5 CPU s (its model loading imports
`torch.distributed.tensor`, its masks `torch._dynamo`), ten times reading the weights. Every operation below is
the one transformers' `modeling_llama` runs, in the same order and dtype, and the attention is the shared-prefix
batcher's own for either model (`a2rl_bench.inference.prefix_batching`), so the batcher decodes the same tokens.

What it covers is checked from `config.json` (`unsupported_reason`): a plain `LlamaForCausalLM`, SiLU MLP, default
RoPE, no biases. Anything else, and any path but the CPU greedy batcher, uses transformers
(`LlamaForward.fallback`), with the reason logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

TOKENIZER_CLASSES = (None, "TokenizersBackend", "PreTrainedTokenizerFast")
"""Tokenizer classes that take tokenizer.json as it is (model-specific classes may rebuild parts of it)."""

SUPPORTED_ROPE = ("default",)
"""RoPE types reproduced here (others, such as llama3's or yarn's scaling, go to transformers)."""


def _rope(config: dict) -> tuple[str, float | None]:
    """RoPE type and theta as the checkpoint states them (transformers 5's `rope_parameters`, or the older
    `rope_theta` + `rope_scaling` keys)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict):
        return str(params.get("rope_type", params.get("type", "default"))), params.get("rope_theta")
    scaling = config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        return "?", None
    kind = "default" if scaling is None else str(scaling.get("rope_type", scaling.get("type", "?")))
    return kind, config.get("rope_theta", 10000.0)


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files transformers would read: the shards its index names, else `model.safetensors`
    (never any other `*.safetensors` beside them, which transformers ignores); [] when there are none."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError("model.safetensors.index.json has no weight_map")
        names = sorted({str(v) for v in weight_map.values()})
        if any(Path(n).name != n for n in names):
            raise ValueError("the index names a shard outside the checkpoint")
        return [model_dir / n for n in names]
    single = model_dir / "model.safetensors"
    return [single] if single.is_file() else []


def unsupported_reason(model_dir: Path) -> str | None:
    """Why this checkpoint needs transformers' model and tokenizer, or None when the own forward covers it."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"config.json unreadable ({type(e).__name__})"
    if not isinstance(config, dict):
        return "config.json is not an object"
    if (reason := _numbers_reason(config)) is not None:
        return reason
    try:
        weights = weight_files(model_dir)
    except (OSError, ValueError, AttributeError) as e:
        return f"safetensors index not usable here ({type(e).__name__}: {e})"
    checks = [
        (config.get("model_type") == "llama", f"model type {config.get('model_type')!r} is not 'llama'"),
        (config.get("architectures") in (None, ["LlamaForCausalLM"]),
         f"architectures {config.get('architectures')!r} is not ['LlamaForCausalLM']"),
        (config.get("hidden_act", "silu") == "silu", f"activation {config.get('hidden_act')!r} is not silu"),
        (not config.get("attention_bias") and not config.get("mlp_bias"), "biases in attention or MLP"),
        (config.get("pretraining_tp", 1) == 1, "pretraining_tp != 1"),
        (_rope(config)[0] in SUPPORTED_ROPE, f"RoPE type {_rope(config)[0]!r} is not one of {SUPPORTED_ROPE}"),
        (config.get("quantization_config") is None, "a quantized checkpoint"),
        (bool(weights) and all(f.is_file() for f in weights), "no model.safetensors (or indexed shards)"),
        ((model_dir / "tokenizer.json").is_file(), "no tokenizer.json"),
    ]  # fmt: skip
    for ok, reason in checks:
        if not ok:
            return reason
    try:
        tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
        _chat_template(model_dir, tokenizer_config)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        return f"tokenizer_config.json or chat template not usable here ({type(e).__name__}: {e})"
    if tokenizer_config.get("tokenizer_class") not in TOKENIZER_CLASSES:
        return f"tokenizer class {tokenizer_config.get('tokenizer_class')!r} is not one of {TOKENIZER_CLASSES[1:]}"
    return None


def parameter_count(config: dict) -> tuple[int, int]:
    """The parameters of the `LlamaForCausalLM` a supported config builds (a tied head once), and the slack a file
    may hold beyond them (a saved copy of the tied head): what transformers counts on the meta device."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
    layer = attention + 3 * h * config["intermediate_size"] + 2 * h
    head = vocab * h
    tied = bool(config.get("tie_word_embeddings", False))
    return vocab * h + layers * layer + h + (0 if tied else head), head if tied else 0


SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def _numbers_reason(config: dict) -> str | None:
    """Why the config's numbers cannot build this forward (an agent writes config.json), or None."""
    sizes = {name: config.get(name) for name in SIZES}
    sizes.update({name: config[name] for name in ("num_key_value_heads", "head_dim") if config.get(name) is not None})
    for name, value in sizes.items():
        if type(value) is not int or value <= 0:
            return f"{name} is not a positive integer"
    if sizes["num_attention_heads"] % sizes.get("num_key_value_heads", sizes["num_attention_heads"]):
        return "num_attention_heads is not a multiple of num_key_value_heads"
    theta, eps = _rope(config)[1], config.get("rms_norm_eps", 1e-6)
    if type(theta) not in (int, float) or theta <= 0 or type(eps) not in (int, float) or eps < 0:
        return "rope_theta or rms_norm_eps is not a positive number"
    if type(config.get("tie_word_embeddings", False)) is not bool:
        return "tie_word_embeddings is not a boolean"
    return None


@dataclass
class _Norm:
    weight: torch.Tensor
    eps: float

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        import torch

        dtype = hidden.dtype  # LlamaRMSNorm, step for step
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.eps)
        return self.weight * hidden.to(dtype)


@dataclass
class _Attention:
    """One layer's projections; `layer_idx` and `scaling` are what the attention functions read."""

    layer_idx: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    head_dim: int
    scaling: float
    groups: int
    training: bool = False


@dataclass
class _Layer:
    input_norm: _Norm
    attention: _Attention
    post_norm: _Norm
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _causal_attention(module: _Attention, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' eager attention with a causal mask (the plain forward: one unpadded batch)."""
    import torch

    b, kv, n, d = key.shape
    key = key[:, :, None].expand(b, kv, module.groups, n, d).reshape(b, kv * module.groups, n, d)
    value = value[:, :, None].expand(b, kv, module.groups, n, d).reshape(b, kv * module.groups, n, d)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    mask = torch.ones((query.shape[2], n), dtype=torch.bool).tril(n - query.shape[2])
    weights = weights.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class _Base:
    """`model.model` of a causal LM as the shared-prefix batcher calls it: ids -> `last_hidden_state`."""

    def __init__(self, owner: LlamaForward):
        self.owner = owner

    def __call__(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **_):
        return SimpleNamespace(last_hidden_state=self.owner.hidden_states(input_ids, position_ids))


class LlamaForward:
    """A `LlamaForCausalLM`'s inference forward in fp32 on the CPU, with the attributes the shared-prefix batcher
    reads (`config`, `generation_config`, `device`, `model`, `get_output_embeddings`)."""

    own_forward = True

    def __init__(self, model_dir: Path, config: dict, tensors: dict[str, torch.Tensor]):
        import torch

        self.model_dir = model_dir
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        self.config = SimpleNamespace(
            model_type="llama", num_hidden_layers=config["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, hidden_size=config["hidden_size"],
            is_encoder_decoder=False, sliding_window=None, _attn_implementation="eager",
        )  # fmt: skip
        self.generation_config = SimpleNamespace(**_generation_config(model_dir, config))
        self.device = torch.device("cpu")
        eps = config.get("rms_norm_eps", 1e-6)

        h, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]

        def weight(name: str, *shape: int) -> torch.Tensor:
            tensor = tensors[name]
            if tuple(tensor.shape) != shape:  # transformers refuses it too: its error, from the fallback
                raise ValueError(f"{name} has shape {tuple(tensor.shape)}, the config implies {shape}")
            return tensor.to(torch.float32)

        self.embed = weight("model.embed_tokens.weight", vocab, h)
        # LlamaConfig's default is untied; a missing lm_head then raises KeyError (transformers would init it)
        tied = config.get("tie_word_embeddings", False)
        self.lm_head = self.embed if tied else weight("lm_head.weight", vocab, h)
        if tied and "lm_head.weight" in tensors and not torch.equal(weight("lm_head.weight", vocab, h), self.embed):
            raise ValueError("tied embeddings but a different lm_head.weight saved (which one wins is transformers')")
        self.norm = _Norm(weight("model.norm.weight", h), eps)
        self.layers = []
        for i in range(config["num_hidden_layers"]):
            p = f"model.layers.{i}."
            attention = _Attention(
                i, weight(p + "self_attn.q_proj.weight", heads * head_dim, h),
                weight(p + "self_attn.k_proj.weight", kv_heads * head_dim, h),
                weight(p + "self_attn.v_proj.weight", kv_heads * head_dim, h),
                weight(p + "self_attn.o_proj.weight", h, heads * head_dim), head_dim, head_dim**-0.5, heads // kv_heads,
            )  # fmt: skip
            self.layers.append(_Layer(
                _Norm(weight(p + "input_layernorm.weight", h), eps), attention,
                _Norm(weight(p + "post_attention_layernorm.weight", h), eps),
                weight(p + "mlp.gate_proj.weight", inner, h), weight(p + "mlp.up_proj.weight", inner, h),
                weight(p + "mlp.down_proj.weight", h, inner),
            ))  # fmt: skip
        theta = _rope(config)[1]
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.model = _Base(self)
        self.fallback: tuple | None = None
        """transformers' model and tokenizer of the same checkpoint, once a path the own forward does not run
        needed them (sampling, the static-cache engine, `generate`): `a2rl_bench.inference.generation`."""

    def get_output_embeddings(self):
        import torch.nn.functional as F

        return lambda hidden: F.linear(hidden, self.lm_head)

    def _attention_function(self):
        if self.config._attn_implementation == "eager":
            return _causal_attention
        from a2rl_bench.inference import prefix_batching

        if self.config._attn_implementation != prefix_batching.ATTENTION:
            raise ValueError(f"attention {self.config._attn_implementation!r} is not implemented here")
        return prefix_batching._attention

    def hidden_states(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The final norm's output for `input_ids` (b, n) at `position_ids` (default 0..n-1)."""
        import torch
        import torch.nn.functional as F

        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1])[None].expand(input_ids.shape[0], -1)
        attend = self._attention_function()
        hidden = F.embedding(input_ids, self.embed)
        freqs = position_ids[..., None].float() * self.inv_freq  # LlamaRotaryEmbedding, step for step
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # default RoPE: attention scaling 1.0
        for layer in self.layers:
            residual = hidden
            x = layer.input_norm(hidden)
            a = layer.attention
            shape = (*x.shape[:-1], -1, a.head_dim)
            q = F.linear(x, a.q).view(shape).transpose(1, 2)
            k = F.linear(x, a.k).view(shape).transpose(1, 2)
            v = F.linear(x, a.v).view(shape).transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            out, _ = attend(a, q, k, v, None, dropout=0.0, scaling=a.scaling)
            out = F.linear(out.reshape(*x.shape[:-1], -1).contiguous(), a.o)
            hidden = residual + out
            residual = hidden
            x = layer.post_norm(hidden)
            hidden = residual + F.linear(F.silu(F.linear(x, layer.gate)) * F.linear(x, layer.up), layer.down)
        return self.norm(hidden)

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits at every position of an unpadded batch (b, n) -> (b, n, vocab)."""
        import torch

        with torch.inference_mode():
            return self.get_output_embeddings()(self.hidden_states(input_ids))


def _generation_config(model_dir: Path, config: dict) -> dict[str, Any]:
    """generation_config.json as transformers reads it (when absent: the token ids of config.json)."""
    path = model_dir / "generation_config.json"
    if path.is_file():
        read = json.loads(path.read_text())
        if not isinstance(read, dict):
            raise TypeError("generation_config.json is not an object")
        return read
    return {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}


def _token(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken's dict."""
    return value.get("content") if isinstance(value, dict) else value


def _chat_template(model_dir: Path, tokenizer_config: dict) -> str | None:
    """The checkpoint's chat template: chat_template.jinja, else tokenizer_config.json's (a string)."""
    path = model_dir / "chat_template.jinja"
    template = path.read_text() if path.is_file() else tokenizer_config.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise TypeError("several named chat templates")
    if template is not None:
        _compile(template)
    return template


def _compile(template: str):
    """The template compiled as transformers compiles chat templates (sandboxed, trimmed blocks, its globals)."""
    import jinja2.ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateError as e:  # e.g. transformers' {% generation %} tag: left to transformers
        raise ValueError(f"chat template does not compile without transformers: {e}") from e


class ChatTokenizer:
    """The checkpoint's tokenizer.json with what the generation path uses of transformers' tokenizer: encoding
    without special tokens, decoding, the chat template, EOS and pad."""

    padding_side = "left"

    def __init__(self, model_dir: Path):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.no_padding()  # as transformers' tokenizer called without padding or truncation
        self._tokenizer.no_truncation()
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        self.special_tokens = {name: token for name in ("bos_token", "eos_token", "unk_token", "pad_token")
                               if (token := _token(config.get(name))) is not None}  # fmt: skip
        self.eos_token = self.special_tokens.get("eos_token")
        self.pad_token = self.special_tokens.get("pad_token")
        self.template = _chat_template(model_dir, config)
        self.clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        if self.clean_up_spaces:
            raise ValueError("clean_up_tokenization_spaces is not reproduced here")

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self._tokenizer.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return None if self.pad_token is None else self._tokenizer.token_to_id(self.pad_token)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def __call__(self, text: str | list[str], add_special_tokens: bool = False) -> dict[str, list]:
        if isinstance(text, str):
            return {"input_ids": self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}
        encoded = self._tokenizer.encode_batch(list(text), add_special_tokens=add_special_tokens)
        return {"input_ids": [e.ids for e in encoded]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows, skip_special_tokens: bool = False) -> list[str]:
        return self._tokenizer.decode_batch([list(r) for r in rows], skip_special_tokens=skip_special_tokens)

    @cached_property
    def _compiled(self):
        if self.template is None:
            raise ValueError("the checkpoint has no chat template")
        return _compile(self.template)

    def apply_chat_template(self, conversation, tokenize: bool = False, add_generation_prompt: bool = False) -> str:
        if tokenize:
            raise ValueError("only rendering (tokenize=False) is implemented here")
        messages = [dict(m) for m in conversation]
        return self._compiled.render(messages=messages, tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt, **self.special_tokens)  # fmt: skip


def load(model_dir: str | Path) -> tuple[LlamaForward, ChatTokenizer] | None:
    """The own forward and tokenizer of a checkpoint, or None (reason logged) where transformers must load it."""
    import torch
    from safetensors import safe_open

    model_dir = Path(model_dir)
    if (reason := unsupported_reason(model_dir)) is not None:
        log.info("own Llama forward not used for %s: %s", model_dir.name, reason)
        return None
    config = json.loads((model_dir / "config.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            if twice := sorted(set(f.keys()) & set(tensors)):  # which copy wins would be a loader's accident
                log.info("own Llama forward not used for %s: %s saved twice", model_dir.name, twice[0])
                return None
            tensors.update((name, f.get_tensor(name)) for name in f.keys())
    try:
        model = LlamaForward(model_dir, config, tensors)
        tokenizer = ChatTokenizer(model_dir)
    except (KeyError, ValueError, TypeError) as e:  # a tensor missing, a setting not reproduced, a file's odd shape
        log.info("own Llama forward not used for %s: %s: %s", model_dir.name, type(e).__name__, e)
        return None
    return model, tokenizer
