"""Greedy CPU decoding with continuous batching and one shared copy of the prompts' common prefix.

An evaluation's prompts share a long prefix (gsm8k: ~700 tokens of few-shot exemplars). The static-cache engine
copies its keys and values into every row, so each decode step reads the prefix once per row (16 x 800 MB at
batch 16, more than the weights). Here the prefix's keys and values are computed once and every row's queries
attend to that one copy (a single matrix product per KV head over all rows' queries); each row's own tokens live
in a per-slot cache. A row that finishes frees its slot at once and the next prompt, longest first, is
prefilled into it, so the batch stays full until the prompts run out; prompts are prefilled in groups of similar
length with right padding that no real query ever sees.

A row's last n-gram found earlier in its own tokens (prefix, suffix, generated) drafts the tokens that followed it
there (prompt lookup, no draft model); one forward feeds the row its last token and the drafts, and the drafts the
greedy chain confirms are kept with the chain's next token. The long completions of a small model are loops, so a
forward that streams all the weights for one or two rows yields several tokens each (`A2RL_CPU_DRAFT=0`: off).

The attention is computed exactly (two-part softmax over prefix and own keys, fp32 accumulation); only the
summation order differs from SDPA over a copied prefix, so greedy tokens agree except at float near-ties. The same
holds for drafting: a drafted step's matrix products have more rows than a one-token step's, and MKL gives a row
other bits at 1-3 rows than at 4 or more (as main's own steps of few rows do), so its logits differ in the last
bits (up to ~7e-5); the greedy tokens were the same on all 400 gsm8k items and at batches 1-48 (BENCHMARKS.md,
"CPU grading, fifth pass").
Supported: decoder-only models whose causal-LM head is a plain `lm_head` over the last hidden state and whose
attention is full (Llama, Qwen2/3, Mistral without a sliding window); anything else raises `Unsupported`.
"""

from __future__ import annotations

import os
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


DRAFT_TOKENS = 8
"""Most tokens a row drafts per step. A row drafts one token more than its match runs on before the n-gram: a
chance match of a few tokens drafts one, a loop's long match up to this many. Every drafted token costs its row's
compute whether kept or not, which at 48 rows outweighs a weight stream saved (drafting whatever matched, 6
tokens after 3: 1.3x the CPU seconds of the default baseline's decode, measured; this rule: 1.0x replayed on its
greedy tokens, 1.16x measured in the evaluation process, 0.9x on a grading's 16 items: BENCHMARKS.md)."""

DRAFT_NGRAM = 2
"""Tokens a row's end must match, earlier in its own tokens, to draft what followed there."""

DRAFT_MAX_ROWS = 8
"""Rows are drafted only in steps of at most this many rows. A draft saves its row a share of one stream of the
weights, which shrinks as more rows share the stream, and costs its row's compute kept or not: measured per phase
on the default grading's 16 items (BENCHMARKS.md "CPU grading, fifth pass"), drafting cut the decode's CPU seconds
at 1-4 rows (10.0 -> 5.1) and 5-8 rows (4.4 -> 2.9) and raised them at 9-12 (2.5 -> 3.7) and 13-16 (7.3 -> 8.7);
the 48-row baseline cost 1.16x with drafting in every step. A row's drafts never depend on its company, so the
tokens stay those of one token a step."""

DRAFT_ENV = "A2RL_CPU_DRAFT"
"""`0` turns drafting off (one token per row and forward, as before issue 48's drafting); a number N > 1 drafts in
steps of at most N rows instead of `DRAFT_MAX_ROWS` (the bench's comparison)."""


def drafting_enabled() -> bool:
    return os.environ.get(DRAFT_ENV, "1").strip() != "0"


def draft_max_rows() -> int:
    """Most rows a step may have for its rows to draft (`DRAFT_MAX_ROWS`, or `A2RL_CPU_DRAFT=N` for N > 1)."""
    value = os.environ.get(DRAFT_ENV, "1").strip()
    return int(value) if value.isdigit() and int(value) > 1 else DRAFT_MAX_ROWS


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
    pad: torch.Tensor | None = None  # (b * q,) packed token of each right-padded place (drafting's ragged rows)
    pack: torch.Tensor | None = None  # (T,) right-padded place of each packed token


class _Lookup:
    """Drafts of one row from its own tokens only (so a row's drafts never depend on its company)."""

    def __init__(self, tokens: Sequence[int]):
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> latest i < len(tokens) with tokens[i-n:i] == it
        self.extend(tokens)

    def extend(self, new: Sequence[int]) -> None:
        n, tokens = DRAFT_NGRAM, self.tokens
        for token in new:
            if len(tokens) >= n:
                self.ends[tuple(tokens[-n:])] = len(tokens)
            tokens.append(token)

    def draft(self, most: int) -> list[int]:
        """Up to `most` tokens that followed the latest earlier occurrence of the row's last n-gram, one more than
        the two occurrences agree on before it; past the row's end they follow on from the drafts themselves (a
        loop shorter than the drafts repeats)."""
        tokens = self.tokens
        at = self.ends.get(tuple(tokens[-DRAFT_NGRAM:])) if most > 0 else None
        if at is None:
            return []
        agree, before, end = 0, at - DRAFT_NGRAM - 1, len(tokens) - DRAFT_NGRAM - 1
        while agree < DRAFT_TOKENS - 1 and before - agree >= 0 and tokens[before - agree] == tokens[end - agree]:
            agree += 1
        drafts: list[int] = []
        for i in range(at, at + min(most, agree + 1)):
            drafts.append(tokens[i] if i < len(tokens) else drafts[i - len(tokens)])
        return drafts


def accepted(drafts: Sequence[int], greedy: Sequence[int]) -> list[int]:
    """The tokens a verified row appends: the drafts the greedy chain confirms, then the chain's next token
    (`greedy[t]` is the argmax after the row's last token and `drafts[:t]`)."""
    n = 0
    while n < len(drafts) and drafts[n] == greedy[n]:
        n += 1
    return list(greedy[: n + 1])


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
    if f.pad is not None:  # packed (1, ., T, D) -> right-padded rows (b, ., q, D)
        b = len(f.starts)
        query, key, value = (x[0][:, f.pad].unflatten(1, (b, -1)).transpose(0, 1) for x in (query, key, value))
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
    elif f.pad is not None:  # a drafted step: each row's q places (its padding lies beyond what it keeps)
        where = (f.slots[:, None], slice(None), f.starts[:, None] + torch.arange(q))
        cache_k[where] = key.transpose(1, 2)
        cache_v[where] = value.transpose(1, 2)
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
    out = out.reshape(b, heads, q, d).transpose(1, 2)
    if f.pad is not None:  # back to the packed tokens, padding dropped
        out = out.reshape(b * q, heads, d)[f.pack][None]
    return out.to(dtype).contiguous(), None


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

        hidden = self._hidden(f, input_ids, positions)
        picked = hidden[torch.arange(hidden.shape[0]), last]
        return self.model.get_output_embeddings()(picked).argmax(-1)

    def _verify(self, f: _Forward, fed: list[list[int]], p: int, lengths: list[int]) -> list[list[int]]:
        """Greedy next token after every fed token of each row, in one forward of the rows' tokens packed
        (the linears see no padding; the attention pads them per row)."""
        import torch

        q = max(len(x) for x in fed)
        f.pack = torch.tensor([j * q + t for j, x in enumerate(fed) for t in range(len(x))])
        f.pad = torch.zeros(len(fed) * q, dtype=torch.long)  # padding repeats token 0: never seen, never kept
        f.pad[f.pack] = torch.arange(len(f.pack))
        ids = torch.tensor([[t for x in fed for t in x]])
        positions = torch.tensor([[p + n + t for n, x in zip(lengths, fed) for t in range(len(x))]])
        greedy = self.model.get_output_embeddings()(self._hidden(f, ids, positions)[0]).argmax(-1).tolist()
        rows, at = [], 0
        for x in fed:
            rows.append(greedy[at : at + len(x)])
            at += len(x)
        return rows

    def _hidden(self, f: _Forward, input_ids, positions) -> torch.Tensor:
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
        return hidden

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
        draft: bool | None = None,
    ) -> list[list[int]]:
        """New tokens of each `prefix + suffix` prompt (greedy), in the order of `suffixes`; a row ends at
        `max_new_tokens` or when `finished(its tokens)` holds. Longer suffixes are prefilled first. `draft`
        (default: `drafting_enabled()`): rows verify their drafted tokens (`_Lookup`) in the decode steps."""
        import torch

        n = len(suffixes)
        if n == 0:
            return []
        draft = drafting_enabled() if draft is None else draft
        max_rows = draft_max_rows()
        p = len(prefix_ids)
        slots = max(1, min(slots, n))
        longest = max(len(s) for s in suffixes)
        size = longest + max_new_tokens + DRAFT_TOKENS  # a row's padding may reach past its last token
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
            lookups: list[_Lookup] = []  # each slot's drafts (drafting only)

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
                            if draft:
                                lookups[j] = lookups[last]
                        active.pop(), lengths.pop(), tokens.pop()
                        if draft:
                            lookups.pop()
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
                        if draft:
                            lookups.append(_Lookup([*prefix_ids, *suffixes[i], tokens[-1][0]]))
                    retire()
                    continue  # fill every free slot before the next decode step
                b = len(active)
                starts = torch.tensor(lengths)
                f = _Forward(pk, pv, keys, values, torch.arange(b), starts, True)
                # at most what the row may still add, less the token its last draft's check adds
                drafts = ([k.draft(max_new_tokens - len(t) - 1) for k, t in zip(lookups, tokens)]
                          if draft and b <= max_rows else [])  # fmt: skip
                if any(drafts):
                    fed = [[t[-1], *d] for t, d in zip(tokens, drafts)]
                    for j, greedy in enumerate(self._verify(f, fed, p, lengths)):
                        new = accepted(drafts[j], greedy)
                        for k, token in enumerate(new):  # the row ends where it would one token at a time
                            tokens[j].append(token)
                            if finished(tokens[j]) or len(tokens[j]) >= max_new_tokens:
                                new = new[: k + 1]
                                break
                        lengths[j] += len(new)  # the fed tokens the row keeps: its last one and the drafts kept
                        lookups[j].extend(new)
                    retire()
                    continue
                current = torch.tensor([[t[-1]] for t in tokens])
                nxt = self._run(f, current, (p + starts)[:, None], torch.zeros(b, dtype=torch.long)).tolist()
                for j in range(b):
                    lengths[j] += 1
                    tokens[j].append(int(nxt[j]))
                    if draft:
                        lookups[j].extend(tokens[j][-1:])
                retire()
        return [r if r is not None else [] for r in results]
