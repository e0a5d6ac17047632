"""Greedy CPU decoding with continuous batching and one shared copy of the prompts' common prefix.

An evaluation's prompts share a long prefix (gsm8k: ~700 tokens of few-shot exemplars). The static-cache engine
copies its keys and values into every row, so each decode step reads the prefix once per row (16 x 800 MB at
batch 16, more than the weights). Here the prefix's keys and values are computed once and every row's queries
attend to that one copy (a single matrix product per KV head over all rows' queries); each row's own tokens live
in a per-slot cache. A row that finishes frees its slot at once and the next prompt, longest first, is
prefilled into it, so the batch stays full until the prompts run out; prompts are prefilled in groups of similar
length with right padding that no real query ever sees.

The attention is computed exactly (two-part softmax over prefix and own keys, fp32 accumulation); only the
summation order differs from SDPA over a copied prefix, so greedy tokens agree except at float near-ties.
Supported: decoder-only models whose causal-LM head is a plain `lm_head` over the last hidden state and whose
attention is full (Llama, Qwen2/3, Mistral without a sliding window); anything else raises `Unsupported`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

ATTENTION = "a2rl_shared_prefix"
"""The attention implementation registered with transformers while this decoder runs a forward."""

MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
"""Models whose forward is embed -> layers (attention through the attention interface) -> norm -> lm_head."""


SIMILAR = 0.8
"""Prompts are prefilled together while each is at least this fraction of the group's longest (less padding:
gsm8k's 16 default items pad 9% instead of 44% in one batch)."""


class Unsupported(RuntimeError):
    """This model is outside what the shared-prefix decoder reproduces; use another path."""


def unsupported_reason(model: PreTrainedModel) -> str | None:
    from a2rl_bench.inference import decode_engine

    if (reason := decode_engine.unsupported_reason(model)) is not None:  # a generation config that is not argmax
        return reason
    config = model.config
    if config.model_type not in MODEL_TYPES:
        return f"model type {config.model_type!r} is not one of {sorted(MODEL_TYPES)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "attn_logit_softcapping", None):
        return "logit soft-capping"
    if model.get_output_embeddings() is None or not hasattr(model, "model"):
        return "no plain lm_head over a base model"
    return None


@dataclass
class _Forward:
    """What the attention of one forward needs besides its inputs: the shared prefix, the slot caches, where
    this forward's tokens go."""

    prefix_keys: list[torch.Tensor]  # per layer (kv_heads, P, head_dim); empty lists when there is no prefix
    prefix_values: list[torch.Tensor]
    keys: list[torch.Tensor]  # per layer (slots, kv_heads, M, head_dim)
    values: list[torch.Tensor]
    slots: torch.Tensor  # (b,) long: the cache slot of each row of this forward
    starts: torch.Tensor  # (b,) long: own-cache position of each row's first token in this forward
    dense: bool  # slots are 0..b-1 (the cache is read through a view, no gather)
    visible: int = 0  # own positions any query of this forward sees (set by the first layer)
    bias: torch.Tensor | None = None  # (b, 1, 1, q, visible): 0 where a query sees an own key, else -inf


_CURRENT: list[_Forward] = []  # the forward in progress (one at a time: a forward is not re-entered)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention of `query` (b, H, q, D) to the shared prefix and to each row's own cache, which this call
    first extends with `key`/`value` (b, kv, q, D) at the row's `starts`. Query t of a row sees own positions
    <= start + t (causal; right padding lies only beyond a row's real tokens)."""
    import torch

    f = _CURRENT[-1]
    layer = module.layer_idx
    dtype = query.dtype  # attention itself runs in fp32 whatever the weights' dtype (the caches are fp32)
    query, key, value = query.float(), key.float(), value.float()
    b, heads, q, d = query.shape
    kv = key.shape[1]
    g = heads // kv
    cache_k, cache_v = f.keys[layer], f.values[layer]
    if f.bias is None:  # the same for every layer: once per forward
        positions = f.starts[:, None] + torch.arange(q)  # (b, q) own positions written now
        f.visible = int(positions.max()) + 1
        seen = torch.arange(f.visible)[None, None, :] <= positions[:, :, None]
        f.bias = torch.zeros(seen.shape).masked_fill_(~seen, float("-inf"))[:, None, None]
    if q == 1:
        cache_k[f.slots, :, f.starts] = key[:, :, 0]
        cache_v[f.slots, :, f.starts] = value[:, :, 0]
    else:
        for i in range(b):  # a prefill group: every row starts at its own position
            start = int(f.starts[i])
            cache_k[f.slots[i], :, start : start + q] = key[i]
            cache_v[f.slots[i], :, start : start + q] = value[i]
    m = f.visible
    own_k = cache_k[:b, :, :m] if f.dense else cache_k[f.slots, :, :m]
    own_v = cache_v[:b, :, :m] if f.dense else cache_v[f.slots, :, :m]
    scale = scaling if scaling is not None else d**-0.5
    # heads h*g .. h*g+g-1 share KV head h (as repeat_kv pairs them); the scale applied to the few queries
    grouped = (query * scale).reshape(b, kv, g * q, d)
    own_scores = torch.matmul(grouped, own_k.transpose(-1, -2)).view(b, kv, g, q, m).add_(f.bias)
    if f.prefix_keys:
        pk, pv = f.prefix_keys[layer], f.prefix_values[layer]
        p = pk.shape[1]
        rows = grouped.transpose(0, 1).reshape(kv, b * g * q, d)  # every row's queries against the one prefix
        prefix_scores = torch.bmm(rows, pk.transpose(1, 2)).view(kv, b, g, q, p).transpose(0, 1)
        probs = torch.cat([prefix_scores, own_scores], dim=-1).softmax(-1)
        from_prefix = torch.bmm(probs[..., :p].transpose(0, 1).reshape(kv, b * g * q, p), pv)
        out = from_prefix.view(kv, b, g * q, d).transpose(0, 1)
        out = out + torch.matmul(probs[..., p:].reshape(b, kv, g * q, m), own_v)
    else:
        probs = own_scores.softmax(-1)
        out = torch.matmul(probs.reshape(b, kv, g * q, m), own_v)
    # (b, H, q, D) -> (b, q, H, D), as transformers' attention functions return it
    return out.reshape(b, heads, q, d).transpose(1, 2).to(dtype).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _attention)


class PrefixBatcher:
    """Greedy decoding of many prompts through `slots` cache slots, continuously refilled."""

    def __init__(self, model: PreTrainedModel):
        if (reason := unsupported_reason(model)) is not None:
            raise Unsupported(reason)
        if model.device.type != "cpu":
            raise Unsupported("the shared-prefix batcher is the CPU path")
        self.model = model
        cfg = model.config
        self.layers = cfg.num_hidden_layers
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        if not getattr(model, "own_forward", False):  # `llama_forward` calls the attention itself
            _register()

    def _run(self, f: _Forward, input_ids, positions, last: torch.Tensor) -> torch.Tensor:
        """Greedy next token of each row from the hidden state at index `last` of its tokens."""
        import torch

        config = self.model.config
        before = config._attn_implementation
        config._attn_implementation = ATTENTION
        _CURRENT.append(f)
        try:
            # A 4-D mask is passed through untouched (the attention builds its own): no mask work per layer.
            dummy = torch.ones((input_ids.shape[0], 1, 1, 1), dtype=torch.bool)
            hidden = self.model.model(input_ids=input_ids, attention_mask=dummy, position_ids=positions,
                                      use_cache=False).last_hidden_state  # fmt: skip
        finally:
            _CURRENT.pop()
            config._attn_implementation = before
        picked = hidden[torch.arange(hidden.shape[0]), last]
        return self.model.get_output_embeddings()(picked).argmax(-1)

    def _prefix(self, prefix_ids: Sequence[int]) -> tuple[list, list]:
        import torch

        if not prefix_ids:
            return [], []
        keys = [torch.empty((1, self.kv_heads, len(prefix_ids), self.head_dim), dtype=torch.float32)
                for _ in range(self.layers)]  # fmt: skip
        values = [torch.empty_like(k) for k in keys]
        f = _Forward([], [], keys, values, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), True)
        ids = torch.tensor([list(prefix_ids)])
        self._run(f, ids, torch.arange(len(prefix_ids))[None], torch.tensor([len(prefix_ids) - 1]))
        return [k[0] for k in keys], [v[0] for v in values]

    def decode(
        self,
        prefix_ids: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        max_new_tokens: int,
        slots: int,
        finished: Callable[[list[int]], bool],
        on_done: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """New tokens of each `prefix + suffix` prompt (greedy), in the order of `suffixes`; a row ends at
        `max_new_tokens` or when `finished(its tokens)` holds. Longer suffixes are prefilled first."""
        import torch

        n = len(suffixes)
        if n == 0:
            return []
        p = len(prefix_ids)
        slots = max(1, min(slots, n))
        longest = max(len(s) for s in suffixes)
        size = longest + max_new_tokens
        with torch.inference_mode():
            pk, pv = self._prefix(prefix_ids)
            keys = [torch.zeros((slots, self.kv_heads, size, self.head_dim), dtype=torch.float32)
                    for _ in range(self.layers)]  # fmt: skip
            values = [torch.zeros_like(k) for k in keys]
            pending = sorted(range(n), key=lambda i: -len(suffixes[i]))
            results: list[list[int] | None] = [None] * n
            active: list[int] = []  # item in each slot, slot j = active[j]
            lengths: list[int] = []  # own tokens in each slot's cache
            tokens: list[list[int]] = []  # generated tokens of each slot's item

            def retire() -> None:
                """Rows whose last token ended them leave; the last slot moves into each hole (dense slots)."""
                j = 0
                while j < len(active):
                    t = tokens[j]
                    if len(t) >= max_new_tokens or finished(t):
                        results[active[j]] = t
                        if on_done is not None:
                            on_done(1)
                        last = len(active) - 1
                        if j != last:
                            for layer in range(self.layers):
                                keys[layer][j] = keys[layer][last]
                                values[layer][j] = values[layer][last]
                            active[j], lengths[j], tokens[j] = active[last], lengths[last], tokens[last]
                        active.pop(), lengths.pop(), tokens.pop()
                    else:
                        j += 1

            while pending or active:
                free = slots - len(active)
                if free and pending:
                    # The longest waiting prompts of similar length, so that right padding stays small.
                    width = len(suffixes[pending[0]])
                    size = next((k for k in range(1, free) if k >= len(pending)
                                 or len(suffixes[pending[k]]) < SIMILAR * width), free)  # fmt: skip
                    group, pending = pending[:size], pending[size:]
                    ids = torch.zeros((len(group), width), dtype=torch.long)
                    for r, i in enumerate(group):
                        ids[r, : len(suffixes[i])] = torch.tensor(list(suffixes[i]))  # right-padded
                    where = torch.arange(len(active), len(active) + len(group))
                    f = _Forward(pk, pv, keys, values, where, torch.zeros(len(group), dtype=torch.long), False)
                    last = torch.tensor([len(suffixes[i]) - 1 for i in group])
                    first = self._run(f, ids, (p + torch.arange(width))[None].expand(len(group), -1), last)
                    for r, i in enumerate(group):
                        active.append(i)
                        lengths.append(len(suffixes[i]))
                        tokens.append([int(first[r])])
                    retire()
                    continue  # fill every free slot before the next decode step
                b = len(active)
                starts = torch.tensor(lengths)
                f = _Forward(pk, pv, keys, values, torch.arange(b), starts, True)
                current = torch.tensor([[t[-1]] for t in tokens])
                nxt = self._run(f, current, (p + starts)[:, None], torch.zeros(b, dtype=torch.long)).tolist()
                for j in range(b):
                    lengths[j] += 1
                    tokens[j].append(int(nxt[j]))
                retire()
        return [r if r is not None else [] for r in results]
