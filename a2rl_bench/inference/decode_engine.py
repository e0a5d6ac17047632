"""Decoding over a static KV cache, greedy or sampled, the decode step optionally captured once in a CUDA graph.

Plain `model.generate` spends most of a GPU decode step launching ~1,400 small kernels and waiting on a few
host syncs; the GPU idles. Here every decode step is the same fixed-shape program over fixed buffers:

* the KV cache is transformers' `StaticCache` (one slot per position, written in place);
* the attention mask is a 4-D boolean tensor built from `key_valid` (which cache slots hold a real token),
  so transformers returns it as-is and never builds a mask (no host sync);
* positions are the mask's running count (`key_valid.sum - 1`), so left padding and padding in the middle
  (between a shared prefix and each row's suffix) give every real token the position it has unpadded;
* the step reads its input token and slot index from device tensors and advances them itself, so one
  captured graph replays step after step (one graph per batch size × cache length × decoding kind, reused);
* the next token is the argmax (greedy) or a sample drawn on the device (`Sampling`: temperature, top-k,
  top-p) by the Gumbel-max trick with counter-based noise: the noise of a row is a hash of (its seed, the
  index of the token, the vocabulary id), so a seed reproduces a row whatever else is in the batch, on any
  device, with or without a graph, and no generator state has to live inside the graph;
* the end of a row is found on the device too (`StopTokens`: EOS and every token whose text contains a stop
  string, plus each stop string as the tokenizer spells it): a finished row emits padding from then on and the
  host reads one flag per row once per chunk of steps, never per token. Stop strings that can span tokens are
  also checked on the host at chunk boundaries (the caller's `finished`), so the result is exact.

Rows that finish early keep their batch place until their chunk ends (with a graph) or leave the batch (without
one); the caller cuts each row at its first EOS or stop string, exactly as it cuts the pad tokens `generate`
appends, so greedy outputs are the same.

A shared prefix (e.g. few-shot exemplars, a system prompt) can be prefilled once at batch 1 and copied into
every row's slots `[0, P)`; each row's own suffix then sits left-padded in `[P, P+S)`.

The module imports nothing from the harness: an agent's training code may ship a copy of it (the reference
agents' rollouts do).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


GROUPED_ATTENTION = "a2rl_grouped_sdpa"
"""Attention used for decode steps: each KV head's query group as a block of queries (no GQA copy of the cache)."""

SLOT_ALIGN = 64
"""Cache lengths are rounded up to this (aligned masks for the fused SDPA kernels; fewer distinct graphs)."""

# Fields of a generation config that change greedy decoding (logits processors, minimum lengths, ...).
# Plain greedy argmax equals `generate` only when all of them are at their no-op values.
_NO_OP_GENERATION = {
    "repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "sequence_bias": (None,),
    "exponential_decay_length_penalty": (None,),
    "renormalize_logits": (None, False),
    "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
    "num_beams": (None, 1),
    "penalty_alpha": (None,),
    "dola_layers": (None,),
    "assistant_model": (None,),
    "prompt_lookup_num_tokens": (None,),
}


class EngineUnsupported(RuntimeError):
    """This model or configuration is outside what the engine reproduces exactly; use `generate`."""


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why the engine cannot reproduce `generate(do_sample=False)` for this model, or None if it can."""
    config = getattr(model, "generation_config", None)
    for name, no_ops in _NO_OP_GENERATION.items():
        value = getattr(config, name, None)
        if value not in no_ops:
            return f"generation_config.{name}={value!r} changes greedy decoding"
    if getattr(model.config, "is_encoder_decoder", False):
        return "encoder-decoder model"
    return None


@dataclass
class PrefixKV:
    """Keys and values of a shared prompt prefix, one (1, kv_heads, P, head_dim) pair per layer."""

    token_ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return len(self.token_ids)


def shared_prefix(token_ids: Sequence[Sequence[int]]) -> list[int]:
    """The longest token prefix of every prompt, leaving each prompt at least one token of its own."""
    if len(token_ids) < 2:
        return []
    first, n = token_ids[0], min(len(ids) for ids in token_ids) - 1
    length = 0
    while length < n and all(ids[length] == first[length] for ids in token_ids):
        length += 1
    return list(first[:length])


@dataclass(frozen=True)
class Sampling:
    """Sampled decoding: temperature, then top-k (0 = off), then top-p (1 = off), as `generate(do_sample=True)`."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling needs a temperature > 0 (got {self.temperature}); use greedy decoding")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (got {self.top_k})")

    @property
    def kind(self) -> tuple:
        """What a captured graph depends on (the temperature and top-p values are read from device tensors)."""
        return ("sample", self.top_k, self.top_p < 1)


GREEDY = ("greedy",)

_M32 = 0xFFFFFFFF
_MIX = (0x7FEB352D, 0x2C1B3C6D)
"""Odd multipliers below 2**31: every product of a 32-bit value stays inside int64 (no overflow on any device)."""


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) of int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MIX[0]) & _M32
    x = x ^ (x >> 15)
    x = (x * _MIX[1]) & _M32
    return x ^ (x >> 16)


def row_seeds(seed: int, n: int) -> list[int]:
    """`n` row seeds derived from one seed (rows of one call get different noise)."""
    return [(seed * 1_000_003 + i * 7_919) & _M32 for i in range(n)]


def gumbel_noise(seeds: torch.Tensor, index: torch.Tensor, vocab_keys: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise of shape (B, V): a pure function of (row seed, token index, vocabulary id).

    Args:
        seeds: (B,) int64 row seeds in [0, 2**32).
        index: (B,) or (1,) int64: which generated token of the row this noise is for (0 = the first).
        vocab_keys: (V,) int64, `_mix32` of the vocabulary ids (computed once per decoder).
    """
    import torch

    row = _mix32((_mix32(seeds & _M32) + index * 0x1B873593) & _M32)
    bits = _mix32(row[:, None] ^ vocab_keys[None, :])
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1), never 0 or 1
    return -torch.log(-torch.log(uniform))


@dataclass(frozen=True)
class StopTokens:
    """Where a row ends, as token ids the device can check: EOS ids, every token whose text contains a stop
    string, and each multi-token stop string as the tokenizer spells it."""

    ids: frozenset[int]
    sequences: tuple[tuple[int, ...], ...] = ()
    exact: bool = True
    """True when every stop string is one character (it cannot span two tokens): the device alone decides the
    end; otherwise the caller's host check at chunk boundaries is still needed for exact results."""

    @classmethod
    def build(cls, tokenizer, stop: Sequence[str], eos_ids: set[int] | frozenset[int]) -> StopTokens:
        ids = set(eos_ids)
        if stop:
            texts = _vocab_texts(tokenizer)
            ids.update(i for i, text in enumerate(texts) if any(s in text for s in stop))
        sequences = tuple(
            tuple(seq) for s in stop if len(seq := tokenizer(s, add_special_tokens=False)["input_ids"]) > 1
        )
        return cls(frozenset(ids), sequences, exact=all(len(s) == 1 for s in stop))

    def cut(self, tokens: Sequence[int]) -> list[int]:
        """Tokens through the first stop id (the whole row when none)."""
        for i, token in enumerate(tokens):
            if token in self.ids:
                return list(tokens[: i + 1])
        return list(tokens)


def _vocab_texts(tokenizer) -> list[str]:
    """Each vocabulary id decoded alone (cached on the tokenizer: one batch decode per tokenizer)."""
    cached = getattr(tokenizer, "_a2rl_vocab_texts", None)
    if cached is None:
        size = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=0) + 1)
        cached = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False)
        try:
            tokenizer._a2rl_vocab_texts = cached
        except AttributeError:  # a tokenizer that takes no new attributes: decode again next time
            pass
    return cached


@dataclass
class _DecodeState:
    """Everything one (batch, cache length, kind) decode needs, at fixed addresses so a graph can replay it."""

    cache: Any
    seq: torch.Tensor  # (B, M) token at each cache slot: prompt slots, then generated tokens
    key_valid: torch.Tensor  # (B, M) bool: slot holds a real token (not padding, not yet unwritten)
    slot: torch.Tensor  # (1,) long: cache slot of the token the next decode step reads
    start: torch.Tensor  # (1,) long: cache slot of the first generated token
    done: torch.Tensor  # (B,) bool: the row has produced a stop token (it emits `pad` from then on)
    seeds: torch.Tensor  # (B,) long: row seeds of sampled decoding
    temperature: torch.Tensor  # (1,) float
    top_p: torch.Tensor  # (1,) float
    pad: torch.Tensor  # (1,) long
    stop_mask: torch.Tensor  # (V,) bool
    kind: tuple = GREEDY
    sequences: tuple[tuple[int, ...], ...] = ()
    patterns: list = field(default_factory=list)  # per sequence: (its ids, arange(len - 1)) on the device
    graph: Any = None
    uses: int = field(default=0)

    @property
    def batch(self) -> int:
        return self.seq.shape[0]

    @property
    def slots(self) -> int:
        return self.seq.shape[1]


def _forward_kwargs(model: PreTrainedModel) -> str:
    """The forward argument that takes the cache: `cache` (transformers >= 5.2x) or `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise EngineUnsupported(f"{type(model).__name__}.forward takes no cache argument")


def _grouped_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA for one query token per row with grouped KV heads, without copying the cache per query head.

    The `g` query heads that share KV head `h` (heads h*g .. h*g+g-1, as `repeat_kv` pairs them) are passed as
    `g` query rows against that one KV head: the same attention, no (B, H, M, D) copy of K and V per layer.
    Anything else goes to transformers' own SDPA attention.
    """
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, q_heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    plain = (
        q_len != 1
        or q_heads == kv_heads
        or attention_mask is None
        or attention_mask.dtype != torch.bool
        or kwargs.get("sliding_window") is not None
        or dropout
    )
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped = query.reshape(batch, kv_heads, q_heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, q_heads, 1, head_dim).transpose(1, 2).contiguous(), None


def _register_grouped_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(GROUPED_ATTENTION, _grouped_decode_attention)


MAX_KEPT_STATES = 4
"""Cache + graph sets kept per decoder (each holds a full KV cache of its batch size and length)."""

MAX_KEPT_CACHE_BYTES = 6 * 1024**3
"""Kept states beyond this many bytes of KV cache together are dropped, oldest first (runs share a card)."""

GRAPH_SLOT_ALIGN = 256
"""With graphs, cache lengths are rounded up to this, and a kept state up to twice as long as needed is reused:
lockstep rollouts ask with a different prompt length at every step and should not capture a graph each time."""


def batch_bucket(n: int) -> int:
    """The batch size a graph is captured for: `n` rounded up to 8, 16, 32, 48, 64, then multiples of 64."""
    if n <= 8:
        return 8
    if n <= 64:
        return -(-n // 16) * 16
    return -(-n // 64) * 64


class Decoder:
    """Greedy or sampled decoding of left-padded batches over a static cache; one decoder per loaded model.

    Args:
        model: A decoder-only transformers model in eval mode.
        use_graph: Capture the decode step in a CUDA graph (CUDA only); False runs the same step eagerly.
        chunk: Decode steps between host checks (end of every row, the caller's `finished`).
        grouped_attention: Decode attention per KV-head group (no GQA copy); only for models on SDPA.
    """

    def __init__(self, model: PreTrainedModel, *, use_graph: bool, chunk: int = 16, grouped_attention: bool = True):
        if (reason := unsupported_reason(model)) is not None:
            raise EngineUnsupported(reason)
        self.model = model
        self.device = model.device
        self.use_graph = use_graph and self.device.type == "cuda"
        self.chunk = max(1, chunk)
        self.cache_arg = _forward_kwargs(model)
        self.grouped = grouped_attention and model.config._attn_implementation == "sdpa"
        if self.grouped:
            _register_grouped_attention()
        self.states: OrderedDict[tuple, _DecodeState] = OrderedDict()
        self.graph_seconds = 0.0
        self.graphs_captured = 0
        self.last_prefix: PrefixKV | None = None
        self._vocab_keys: torch.Tensor | None = None
        self._stop_masks: dict[frozenset[int], torch.Tensor] = {}

    # -- shared prefix ---------------------------------------------------------------------------------

    def prefix_kv(self, token_ids: Sequence[int]) -> PrefixKV:
        """Prefill a prompt prefix once at batch 1; its keys and values seed every row of later batches."""
        import torch
        from transformers import StaticCache

        ids = torch.tensor([list(token_ids)], device=self.device)
        cache = StaticCache(config=self.model.config, max_cache_len=len(token_ids))
        with torch.inference_mode():
            self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_arg: cache})
        self._check_static(cache)
        return PrefixKV(tuple(token_ids), [layer.keys for layer in cache.layers],
                        [layer.values for layer in cache.layers])

    def cached_prefix(self, token_ids: Sequence[int]) -> PrefixKV:
        """`prefix_kv`, remembering the last prefix (lockstep episodes ask again with the same one each step)."""
        if self.last_prefix is None or self.last_prefix.token_ids != tuple(token_ids):
            self.last_prefix = None  # free the old one first
            self.last_prefix = self.prefix_kv(token_ids)
        return self.last_prefix

    def weights_changed(self) -> None:
        """Forget what was computed from the old weights (the cached prefix); graphs read the weights in place
        and stay valid as long as the parameters keep their storage (an optimizer step or `copy_` does)."""
        self.last_prefix = None

    # -- decoding ----------------------------------------------------------------------------------------

    def decode(
        self,
        rows: Sequence[Sequence[int]],
        max_new_tokens: int,
        finished: Callable[[list[int]], bool] | None,
        pad_id: int,
        prefix: PrefixKV | None = None,
        *,
        sampling: Sampling | None = None,
        seeds: Sequence[int] | None = None,
        stop: StopTokens | None = None,
        report: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """The continuation of each row (`prefix + row` is its prompt); returns every row's new tokens.

        Greedy unless `sampling` is given (then `seeds` gives one seed per row). A row ends when the device sees
        one of `stop`'s tokens (it then emits `pad_id`), when `finished(tokens)` holds at a chunk boundary, or
        at `max_new_tokens`; its tokens past the real end (up to the boundary) are padding or whatever it
        decoded next, which the caller cuts. Without a graph, finished rows leave the batch. `report(n)` hears, at each chunk
        boundary, how many rows have finished so far.
        """
        import torch

        if not rows or max_new_tokens < 1:
            return [[] for _ in rows]
        if sampling is not None and (seeds is None or len(seeds) != len(rows)):
            raise ValueError("sampled decoding needs one seed per row")
        with torch.inference_mode():
            attn_before = self.model.config._attn_implementation
            if self.grouped:
                self.model.config._attn_implementation = GROUPED_ATTENTION
            try:
                return self._decode(rows, max_new_tokens, finished, pad_id, prefix, sampling, seeds, stop, report)
            finally:
                self.model.config._attn_implementation = attn_before

    def _decode(self, rows, max_new_tokens, finished, pad_id, prefix, sampling, seeds, stop, report=None):
        import torch

        n_rows = len(rows)
        batch = batch_bucket(n_rows) if self.use_graph else n_rows  # graph rows past n_rows: padding, done
        p = prefix.length if prefix else 0
        s = max(len(r) for r in rows)
        kind = sampling.kind if sampling is not None else GREEDY
        sequences = stop.sequences if stop is not None else ()
        state = self._state(batch, p + s + max_new_tokens, kind, sequences)
        slots = state.slots
        # Slot layout per row: [prefix | left padding | own suffix | generated ...]
        seq = torch.full((batch, slots), pad_id, dtype=torch.long)
        valid = torch.zeros((batch, slots), dtype=torch.bool)
        if prefix:
            seq[:, :p] = torch.tensor(prefix.token_ids)
            valid[:, :p] = True
        for i, r in enumerate(rows):
            if r:
                seq[i, p + s - len(r) : p + s] = torch.tensor(list(r))
                valid[i, p + s - len(r) : p + s] = True
        done = torch.zeros(batch, dtype=torch.bool)
        done[n_rows:] = True
        row_seed = torch.zeros(batch, dtype=torch.long)
        if seeds is not None:
            row_seed[:n_rows] = torch.tensor([int(x) & _M32 for x in seeds], dtype=torch.long)
        state.seq.copy_(seq, non_blocking=True)
        state.key_valid.copy_(valid, non_blocking=True)
        state.done.copy_(done, non_blocking=True)
        state.seeds.copy_(row_seed, non_blocking=True)
        state.pad.fill_(pad_id)
        state.temperature.fill_(sampling.temperature if sampling else 1.0)
        state.top_p.fill_(sampling.top_p if sampling else 1.0)
        state.stop_mask.copy_(self._stop_mask(stop.ids if stop is not None else frozenset(), state.stop_mask.numel()))
        state.cache.reset()
        if prefix:
            for layer, (k, v) in enumerate(zip(prefix.keys, prefix.values)):
                state.cache.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1), layer)
        start = p + s  # slot of the first generated token
        state.start.fill_(start)
        self._prefill(state, p, s, sampling)
        alive = list(range(n_rows))  # original row of each row of `state`
        results: list[list[int] | None] = [None] * n_rows
        produced = 1
        steps_left = max_new_tokens - 1
        host_check = finished is not None and not (stop is not None and stop.exact)
        while True:
            tokens = state.seq[: len(alive), start : start + produced].tolist()  # the host sync, once per chunk
            ended = state.done[: len(alive)].tolist()
            for row, t, end in zip(alive, tokens, ended):
                if results[row] is None and (steps_left == 0 or end or (host_check and finished(t))):
                    results[row] = t  # a finished row's tokens are final: later ones are cut anyway
            if report is not None:
                report(sum(r is not None for r in results))
            if all(r is not None for r in results):
                return results
            if not self.use_graph:
                keep = [j for j, row in enumerate(alive) if results[row] is None]
                if len(keep) < len(alive):  # no compute for finished rows (a graph keeps its batch instead)
                    state = self._compacted(state, keep)
                    alive = [alive[j] for j in keep]
            n = min(self.chunk, steps_left)
            self._steps(state, n)
            produced += n
            steps_left -= n

    def _stop_mask(self, ids: frozenset[int], vocab: int) -> torch.Tensor:
        import torch

        if ids not in self._stop_masks:
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[[i for i in ids if 0 <= i < vocab]] = True
            if len(self._stop_masks) > 8:
                self._stop_masks.clear()
            self._stop_masks[ids] = mask
        return self._stop_masks[ids]

    def _compacted(self, state: _DecodeState, keep: list[int]) -> _DecodeState:
        """A state holding only the rows `keep` (same slots, same cache contents up to the current slot)."""
        import dataclasses

        import torch
        from transformers import StaticCache

        index = torch.tensor(keep, device=self.device)
        written = int(state.slot.item())  # cache slots [0, slot) hold keys and values
        cache = StaticCache(config=self.model.config, max_cache_len=state.slots)
        for layer_idx, layer in enumerate(state.cache.layers):
            cache.update(layer.keys[index, :, :written], layer.values[index, :, :written], layer_idx)
        return dataclasses.replace(
            state, cache=cache, seq=state.seq[index], key_valid=state.key_valid[index], slot=state.slot.clone(),
            done=state.done[index], seeds=state.seeds[index], graph=None,
        )  # fmt: skip

    def _state(self, batch: int, needed: int, kind: tuple, sequences: tuple) -> _DecodeState:
        """A kept state of this batch and kind whose cache holds `needed` slots (at most twice that, or the length a
        new one would get), or a new one."""
        import torch
        from transformers import StaticCache

        align = GRAPH_SLOT_ALIGN if self.use_graph else SLOT_ALIGN
        slots = -(-needed // align) * align
        # Up to twice the need, and never less than a new state would get: a short request (needed < align / 2)
        # must still reuse the state (and graph) of its own rounded length, not capture a new one each call.
        longest = max(2 * needed, slots)
        fits = [key for key in self.states if key[0] == batch and key[2:] == (kind, sequences)
                and needed <= key[1] <= longest]  # fmt: skip
        if fits:
            key = min(fits, key=lambda k: k[1])
            self.states.move_to_end(key)
            return self.states[key]
        while len(self.states) >= MAX_KEPT_STATES:
            self.states.popitem(last=False)
        cache = StaticCache(config=self.model.config, max_cache_len=slots)
        self._check_static(cache)
        kept = lambda: sum(self._cache_bytes(x.batch, x.slots) for x in self.states.values())  # noqa: E731
        while self.states and self._cache_bytes(batch, slots) + kept() > MAX_KEPT_CACHE_BYTES:
            self.states.popitem(last=False)
        vocab = self._vocab_size()
        zeros = dict(device=self.device)
        state = _DecodeState(
            cache=cache,
            seq=torch.zeros((batch, slots), dtype=torch.long, **zeros),
            key_valid=torch.zeros((batch, slots), dtype=torch.bool, **zeros),
            slot=torch.zeros(1, dtype=torch.long, **zeros),
            start=torch.zeros(1, dtype=torch.long, **zeros),
            done=torch.zeros(batch, dtype=torch.bool, **zeros),
            seeds=torch.zeros(batch, dtype=torch.long, **zeros),
            temperature=torch.ones(1, dtype=torch.float32, **zeros),
            top_p=torch.ones(1, dtype=torch.float32, **zeros),
            pad=torch.zeros(1, dtype=torch.long, **zeros),
            stop_mask=torch.zeros(vocab, dtype=torch.bool, **zeros),
            kind=kind,
            sequences=sequences,
            patterns=[(torch.tensor(s, device=self.device), torch.arange(len(s) - 1, device=self.device))
                      for s in sequences],
        )  # fmt: skip
        self.states[(batch, slots, kind, sequences)] = state
        return state

    def _cache_bytes(self, batch: int, slots: int) -> int:
        """Bytes of the keys and values a static cache of `batch` rows and `slots` positions holds."""
        cfg = self.model.config
        heads = getattr(cfg, "num_attention_heads", 1)
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        itemsize = next(self.model.parameters()).element_size()
        return 2 * cfg.num_hidden_layers * batch * slots * kv_heads * head_dim * itemsize

    def _vocab_size(self) -> int:
        out = self.model.get_output_embeddings()
        return int(out.weight.shape[0]) if out is not None else int(self.model.config.vocab_size)

    def vocab_keys(self) -> torch.Tensor:
        import torch

        if self._vocab_keys is None:
            self._vocab_keys = _mix32(torch.arange(self._vocab_size(), dtype=torch.long, device=self.device))
        return self._vocab_keys

    def _logits(self, state: _DecodeState, input_ids, mask, positions):
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self.cache_arg: state.cache})
        return out.logits[:, -1]

    def _choose(self, state: _DecodeState, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The next token of every row, as a (B, 1) tensor; marks rows that produced a stop token as done."""
        import torch

        if state.kind == GREEDY:
            nxt = logits.argmax(-1)
        else:
            _, top_k, use_top_p = state.kind
            scores = logits.float() / state.temperature
            if top_k:
                kth = scores.topk(min(top_k, scores.shape[-1]), dim=-1).values[:, -1:]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            if use_top_p:
                ordered, order = scores.sort(dim=-1, descending=True)
                probs = ordered.softmax(-1)
                drop = (probs.cumsum(-1) - probs) > state.top_p  # keeps the smallest set reaching top_p, >= 1 token
                scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
            nxt = (scores + gumbel_noise(state.seeds, index, self.vocab_keys())).argmax(-1)
        nxt = torch.where(state.done, state.pad, nxt)
        ended = state.stop_mask[nxt]
        for want, offsets in state.patterns:  # multi-token stop strings: the new token and the row's last ones
            first = state.slot + 2 - want.numel()  # slot of the pattern's first token if it ends at the new one
            recent = state.seq.index_select(1, offsets + first.clamp(min=0))
            ended = ended | ((recent == want[:-1]).all(-1) & (nxt == want[-1]) & (first >= state.start))
        state.done |= ended
        return nxt[:, None]

    def _prefill(self, state: _DecodeState, p: int, s: int, sampling: Sampling | None) -> None:
        """Run the suffix slots [p, p+s) through the model; write the first generated token at slot p+s."""
        import torch

        slots = state.slots
        query = torch.arange(p, p + s, device=self.device)
        key = torch.arange(slots, device=self.device)
        # causal ∧ (real key ∨ diagonal): a padding query attends to itself only, so no row is all-masked
        own = key[None, :] == query[:, None]
        mask = (key[None, :] <= query[:, None]) & (state.key_valid[:, None, :] | own[None])
        positions = (state.key_valid.long().cumsum(-1)[:, p : p + s] - 1).clamp(min=0)
        logits = self._logits(state, state.seq[:, p : p + s], mask[:, None], positions)
        state.slot.fill_(p + s - 1)  # the prefill's last slot: the first generated token is token 0
        first = self._choose(state, logits, state.slot + 1 - state.start)
        state.seq[:, p + s : p + s + 1] = first
        state.key_valid[:, p + s] = True  # the first generated token is real
        state.slot.fill_(p + s)

    def _step(self, state: _DecodeState) -> None:
        """One decode step, entirely on device tensors: read the token at `slot`, write the next at slot+1."""
        current = state.seq.index_select(1, state.slot)
        state.key_valid.index_fill_(1, state.slot, True)
        positions = state.key_valid.sum(-1, keepdim=True) - 1
        logits = self._logits(state, current, state.key_valid[:, None, None, :], positions)
        nxt = self._choose(state, logits, state.slot + 1 - state.start)
        state.seq.index_copy_(1, state.slot + 1, nxt)
        state.slot.add_(1)

    def _steps(self, state: _DecodeState, n: int) -> None:
        if not self.use_graph:
            for _ in range(n):
                self._step(state)
            return
        import torch

        done = 0
        if state.graph is None:
            warm = min(n, 2)  # real steps, run eagerly on a side stream before capture (as CUDA graphs need)
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(warm):
                    self._step(state)
            torch.cuda.current_stream(self.device).wait_stream(side)
            done = warm
            if done == n:
                return
            import time

            started = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # recorded, not run: state is unchanged by the capture
                self._step(state)
            state.graph = graph
            self.graph_seconds += time.perf_counter() - started
            self.graphs_captured += 1
        for _ in range(n - done):
            state.graph.replay()

    @staticmethod
    def _check_static(cache) -> None:
        from transformers.cache_utils import StaticLayer

        kinds = {type(layer).__name__ for layer in cache.layers if type(layer) is not StaticLayer}
        if kinds:
            raise EngineUnsupported(f"cache layers {sorted(kinds)} are not plain static layers")
