"""Greedy decoding over a static KV cache, the decode step optionally captured once in a CUDA graph.

Plain `model.generate` spends most of a GPU decode step launching ~1,400 small kernels and waiting on a few
host syncs; the GPU idles. Here every decode step is the same fixed-shape program over fixed buffers:

* the KV cache is transformers' `StaticCache` (one slot per position, written in place);
* the attention mask is a 4-D boolean tensor built from `key_valid` (which cache slots hold a real token),
  so transformers returns it as-is and never builds a mask (no host sync);
* positions are the mask's running count (`key_valid.sum - 1`), so left padding and padding in the middle
  (between a shared prefix and each row's suffix) give every real token the position it has unpadded;
* the step reads its input token and slot index from device tensors and advances them itself, so one
  captured graph replays step after step (one graph per batch size × cache length, reused across batches);
* EOS and stop strings are checked on the host between fixed chunks of steps.

Rows that finish early keep decoding until their chunk ends; the caller cuts each row at its first EOS or
stop string, exactly as it cuts the pad tokens `generate` appends, so the outputs are the same.

A shared prefix (e.g. few-shot exemplars) can be prefilled once at batch 1 and copied into every row's
slots `[0, P)`; each row's own suffix then sits left-padded in `[P, P+S)`.
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

MAX_KEPT_STATES = 2
"""Cache + graph sets kept per model (each holds a full KV cache of its batch size)."""

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


@dataclass
class _DecodeState:
    """Everything one (batch, cache length) decode needs, at fixed addresses so a graph can replay it."""

    cache: Any
    seq: torch.Tensor  # (B, M) token at each cache slot: prompt slots, then generated tokens
    key_valid: torch.Tensor  # (B, M) bool: slot holds a real token (not padding, not yet unwritten)
    slot: torch.Tensor  # (1,) long: cache slot of the token the next decode step reads
    graph: Any = None
    uses: int = field(default=0)


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


class GreedyDecoder:
    """Greedy decoding of left-padded batches over a static cache; one decoder per loaded model.

    Args:
        model: A decoder-only transformers model in eval mode.
        use_graph: Capture the decode step in a CUDA graph (CUDA only); False runs the same step eagerly.
        chunk: Decode steps between host checks for EOS / stop strings.
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
        self.states: OrderedDict[tuple[int, int], _DecodeState] = OrderedDict()
        self.graph_seconds = 0.0
        self.graphs_captured = 0
        self.last_prefix: PrefixKV | None = None

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

    # -- decoding ----------------------------------------------------------------------------------------

    def decode(
        self,
        rows: Sequence[Sequence[int]],
        max_new_tokens: int,
        finished: Callable[[list[int]], bool],
        pad_id: int,
        prefix: PrefixKV | None = None,
        report: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """Greedy continuation of each row (`prefix + row` is its prompt); returns every row's new tokens.

        A row's tokens end at the first chunk boundary where `finished(tokens)` holds (or at `max_new_tokens`);
        tokens past its real end (up to the boundary) are whatever it decoded next. Without a graph, finished
        rows leave the batch, so the long rows do not carry the finished ones. `report(n)` hears, at each chunk
        boundary, how many rows have finished so far.
        """
        import torch

        if not rows or max_new_tokens < 1:
            return [[] for _ in rows]
        with torch.inference_mode():
            attn_before = self.model.config._attn_implementation
            if self.grouped:
                self.model.config._attn_implementation = GROUPED_ATTENTION
            try:
                return self._decode(rows, max_new_tokens, finished, pad_id, prefix, report)
            finally:
                self.model.config._attn_implementation = attn_before

    def _decode(self, rows, max_new_tokens, finished, pad_id, prefix, report=None):
        import torch

        batch = len(rows)
        p = prefix.length if prefix else 0
        s = max(len(r) for r in rows)
        slots = -(-(p + s + max_new_tokens) // SLOT_ALIGN) * SLOT_ALIGN
        state = self._state(batch, slots)
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
        state.seq.copy_(seq, non_blocking=True)
        state.key_valid.copy_(valid, non_blocking=True)
        state.cache.reset()
        if prefix:
            for layer, (k, v) in enumerate(zip(prefix.keys, prefix.values)):
                state.cache.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1), layer)
        self._prefill(state, p, s)
        start = p + s  # slot of the first generated token
        alive = list(range(batch))  # original row of each row of `state`
        results: list[list[int] | None] = [None] * batch
        produced = 1
        steps_left = max_new_tokens - 1
        while True:
            tokens = state.seq[:, start : start + produced].tolist()  # the host sync, once per chunk
            for row, t in zip(alive, tokens):
                if results[row] is None and (steps_left == 0 or finished(t)):
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

    def _compacted(self, state: _DecodeState, keep: list[int]) -> _DecodeState:
        """A state holding only the rows `keep` (same slots, same cache contents up to the current slot)."""
        import torch
        from transformers import StaticCache

        index = torch.tensor(keep, device=self.device)
        written = int(state.slot.item())  # cache slots [0, slot) hold keys and values
        cache = StaticCache(config=self.model.config, max_cache_len=state.seq.shape[1])
        for layer_idx, layer in enumerate(state.cache.layers):
            cache.update(layer.keys[index, :, :written], layer.values[index, :, :written], layer_idx)
        return _DecodeState(cache=cache, seq=state.seq[index], key_valid=state.key_valid[index],
                            slot=state.slot.clone())

    def _state(self, batch: int, slots: int) -> _DecodeState:
        import torch
        from transformers import StaticCache

        key = (batch, slots)
        if key in self.states:
            self.states.move_to_end(key)
            return self.states[key]
        while len(self.states) >= MAX_KEPT_STATES:
            self.states.popitem(last=False)
        cache = StaticCache(config=self.model.config, max_cache_len=slots)
        self._check_static(cache)
        state = _DecodeState(
            cache=cache,
            seq=torch.zeros((batch, slots), dtype=torch.long, device=self.device),
            key_valid=torch.zeros((batch, slots), dtype=torch.bool, device=self.device),
            slot=torch.zeros(1, dtype=torch.long, device=self.device),
        )
        self.states[key] = state
        return state

    def _forward(self, state: _DecodeState, input_ids, mask, positions):
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self.cache_arg: state.cache})
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def _prefill(self, state: _DecodeState, p: int, s: int) -> None:
        """Run the suffix slots [p, p+s) through the model; write the first generated token at slot p+s."""
        import torch

        slots = state.seq.shape[1]
        query = torch.arange(p, p + s, device=self.device)
        key = torch.arange(slots, device=self.device)
        # causal ∧ (real key ∨ diagonal): a padding query attends to itself only, so no row is all-masked
        own = key[None, :] == query[:, None]
        mask = (key[None, :] <= query[:, None]) & (state.key_valid[:, None, :] | own[None])
        positions = (state.key_valid.long().cumsum(-1)[:, p : p + s] - 1).clamp(min=0)
        first = self._forward(state, state.seq[:, p : p + s], mask[:, None], positions)
        state.seq[:, p + s : p + s + 1] = first
        state.key_valid[:, p + s] = True  # the first generated token is real
        state.slot.fill_(p + s)

    def _step(self, state: _DecodeState) -> None:
        """One decode step, entirely on device tensors: read the token at `slot`, write the next at slot+1."""
        current = state.seq.index_select(1, state.slot)
        state.key_valid.index_fill_(1, state.slot, True)
        positions = state.key_valid.sum(-1, keepdim=True) - 1
        nxt = self._forward(state, current, state.key_valid[:, None, None, :], positions)
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
