"""Batched chat generation with plain transformers: the one decoding path every evaluator uses.

Prompts are rendered with the checkpoint's chat template, sorted by length (less padding), left-padded
(decoder-only models continue from the right end) and generated in batches; the original order is restored.
`batch_size=1` runs the very same code one prompt at a time and is the baseline batching is measured against.

Batches go through `a2rl_bench.inference.decode_engine` where it pays: on CUDA always (static cache + CUDA graph, greedy
or sampled), on CPU for greedy prompts that share a long token prefix (few-shot exemplars), which is then
prefilled once per call.
Its outputs are cut exactly like `generate`'s; any engine failure falls back to `generate` with a warning.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pydantic import BaseModel

from a2rl_bench.inference.decode_engine import Sampling, StopTokens, row_seeds, shared_prefix

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

Conversation = list[dict[str, str]]

ENGINES = ("auto", "generate", "static", "graph")
"""`auto`: the engine on CUDA, or on CPU when prompts share a prefix; `generate`: plain transformers;
`static`: the engine without CUDA graphs; `graph`: the engine with them (CUDA only, else as `static`)."""

MIN_SHARED_PREFIX = 32
"""Shortest common token prefix worth prefilling once (shorter ones are re-read with each prompt)."""


class GenerationOutput(BaseModel):
    """Completions in the order of the input conversations, with what it cost to make them."""

    completions: list[str]
    """Decoded completion per conversation, special tokens removed, cut before the first stop string."""
    completion_tokens: list[int]
    """Real generated tokens per conversation (up to EOS or the end of the first stop string; no padding)."""
    generated_tokens: int
    """Sum of `completion_tokens`."""
    seconds: float
    """Wall time of tokenization + generation + decoding (model loading excluded)."""


class LoadedModel(NamedTuple):
    """A model ready for `generate`; pass it instead of a directory to avoid loading twice."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


def pick_device(device: str | torch.device | None = None) -> torch.device:
    import torch

    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(
    model_dir: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    own_forward: bool = False,
) -> LoadedModel:
    """Load a checkpoint for inference: bf16 on CUDA; on CPU `dtype`, default fp32 (the same answers at any batch;
    evaluation asks for bf16 only where A2RL_CPU_EVAL_DTYPE opts in, `a2rl_bench.inference.numerics`).

    `own_forward`: on the CPU in fp32, a Llama checkpoint is loaded without importing transformers
    (`a2rl_bench.inference.llama_forward`: same logits, seconds less per process); other checkpoints, and the
    paths the own forward does not run, get transformers' model."""
    import torch

    target = pick_device(device)
    if own_forward and target.type == "cpu" and dtype in (None, torch.float32):
        from a2rl_bench.inference import llama_forward

        if (own := llama_forward.load(model_dir)) is not None:
            return LoadedModel(*own)
    return load_transformers(model_dir, target, dtype)


def load_transformers(
    model_dir: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> LoadedModel:
    """`load_model` through transformers' Auto classes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = pick_device(device)
    if target.type == "cuda" or dtype is None:
        dtype = torch.bfloat16 if target.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(target).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return LoadedModel(model, _prepare_tokenizer(tokenizer))


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    tokenizer.padding_side = "left"  # decoder-only: every prompt must end where generation starts
    if tokenizer.pad_token is None:  # some chat models ship without one; padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def render_prompt(tokenizer: PreTrainedTokenizerBase, conversation: Conversation | str) -> str:
    """The checkpoint's chat template applied to a conversation, with the assistant turn opened."""
    if isinstance(conversation, str):
        return conversation
    return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


def generate(
    model_dir: str | Path | LoadedModel | tuple[PreTrainedModel, PreTrainedTokenizerBase],
    conversations: Sequence[Conversation | str],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    stop: Sequence[str] = (),
    batch_size: int = 16,
    device: str | torch.device | None = None,
    seed: int | None = None,
    num_threads: int | None = None,
    engine: str | None = None,
    on_done: Callable[[int], None] | None = None,
) -> GenerationOutput:
    """Generate one assistant reply per conversation; greedy when `temperature == 0`.

    Args:
        model_dir: A checkpoint directory, or an already loaded `(model, tokenizer)`.
        conversations: Chat messages (`{"role", "content"}`) per prompt; a generation prompt is appended. A
            `str` is a prompt already rendered with the chat template (what a remote worker receives).
        max_new_tokens: Upper bound on generated tokens per completion.
        temperature: 0 for greedy decoding, otherwise plain temperature sampling (with `top_p`).
        stop: Completions are cut before the first of these strings; a batch ends early once every row
            has produced a stop string or EOS.
        batch_size: Prompts per `model.generate` call; 1 is the unbatched baseline.
        device: `cuda`/`cpu`/...; default CUDA when available. Ignored for an already loaded model.
        seed: Seeds torch before sampling, for repeatable sampled completions.
        num_threads: torch CPU threads for this call (restored afterwards); None keeps the current number.
            On cores shared with other busy processes, spinning OpenMP threads wait for each other at every
            op: 1 thread, or OMP_WAIT_POLICY=PASSIVE set before torch starts, can be several times faster
            than the default 2 (tiny model: 0.06 s vs 0.4-4 s per call; SmolLM2 batch 16 on the loaded
            2-core machine: 54 tok/s with 1 thread, 28 with 2 + PASSIVE, 8 with 2).
        engine: One of `ENGINES`; None reads A2RL_DECODE_ENGINE (default `auto`). Sampled decoding uses the
            engine on CUDA (`auto`) or when asked (`static`, `graph`): each prompt's sample is then a function of
            `seed` and its position in `conversations`, whatever the batching.
        on_done: Called with n as n more completions are final (rows of a batch end at different steps), for
            progress counted per item rather than per batch.
    """
    import torch

    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1 (got {batch_size}, {max_new_tokens})")
    stop = tuple(stop)
    if "" in stop:
        raise ValueError("an empty stop string would cut every completion to nothing")
    engine = engine or os.environ.get("A2RL_DECODE_ENGINE") or "auto"
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES} (got {engine!r})")
    if not conversations:
        return GenerationOutput(completions=[], completion_tokens=[], generated_tokens=0, seconds=0.0)
    model, tokenizer = model_dir if isinstance(model_dir, tuple) else load_model(model_dir, device)
    tokenizer = _prepare_tokenizer(tokenizer)
    if seed is not None:
        torch.manual_seed(seed)
    threads_before = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        return _generate_all(
            model, tokenizer, conversations, max_new_tokens, temperature, top_p, stop, batch_size, engine, seed,
            on_done,
        )
    finally:
        torch.set_num_threads(threads_before)


def _generate_all(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[Conversation | str],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stop: tuple[str, ...],
    batch_size: int,
    engine: str = "auto",
    seed: int | None = None,
    on_done: Callable[[int], None] | None = None,
) -> GenerationOutput:
    started = time.perf_counter()
    prompts = [render_prompt(tokenizer, c) for c in conversations]
    token_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    lengths = [len(ids) for ids in token_ids]
    # Longest first: similar lengths share a batch (less padding), and a too-long batch fails at once.
    order = sorted(range(len(prompts)), key=lambda i: -lengths[i])
    completions: list[str] = [""] * len(prompts)
    counts: list[int] = [0] * len(prompts)
    options = _decoding_options(tokenizer, max_new_tokens, temperature, top_p, stop)
    eos_ids = _eos_ids(model, tokenizer)
    on_done = _Capped(len(prompts), on_done)  # a path that fails part-way hands its rows to the next
    if engine == "auto" and temperature <= 0 and model.device.type == "cpu":
        new_tokens = _continuous(model, tokenizer, token_ids, max_new_tokens, stop, eos_ids, batch_size, on_done)
        if new_tokens is not None:
            texts, counts = _finish_rows(new_tokens, tokenizer, stop, eos_ids)
            return GenerationOutput(completions=texts, completion_tokens=counts, generated_tokens=sum(counts),
                                    seconds=time.perf_counter() - started)  # fmt: skip
    if getattr(model, "own_forward", False):  # the rest is transformers' (same tokenizer files, same template)
        if model.fallback is None:  # loaded once per model
            model.fallback = load_transformers(model.model_dir, "cpu")
        model, tokenizer = model.fallback
        tokenizer = _prepare_tokenizer(tokenizer)
        options = _decoding_options(tokenizer, max_new_tokens, temperature, top_p, stop)
    fast = _EngineRun.plan(model, engine, temperature, top_p, token_ids)
    seeds = row_seeds(seed if seed is not None else int.from_bytes(os.urandom(4), "little"), len(prompts))
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        report = _BatchReport(len(rows), on_done)
        new_tokens = None
        if fast is not None:
            new_tokens = fast.try_batch([token_ids[i] for i in rows], max_new_tokens, tokenizer, stop, eos_ids,
                                        [seeds[i] for i in rows], report)  # fmt: skip
        if new_tokens is None:
            new_tokens = _generate_batch(model, tokenizer, [prompts[i] for i in rows], options, report, eos_ids)
        report(len(rows))  # the rest: rows that ran to max_new_tokens, or ended unseen
        texts, tokens = _finish_rows(new_tokens, tokenizer, stop, eos_ids)
        for row, text, count in zip(rows, texts, tokens):
            completions[row], counts[row] = text, count
    return GenerationOutput(
        completions=completions,
        completion_tokens=counts,
        generated_tokens=sum(counts),
        seconds=time.perf_counter() - started,
    )


def _decoding_options(
    tokenizer: PreTrainedTokenizerBase, max_new_tokens: int, temperature: float, top_p: float, stop: tuple[str, ...]
) -> dict:
    options: dict = {"max_new_tokens": max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
    if temperature > 0:
        # top_k=0 turns off transformers' default top-k of 50: sampling is temperature (+ top_p) only.
        options.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    else:
        options.update(do_sample=False)
    if stop:
        options.update(stop_strings=list(stop), tokenizer=tokenizer)  # lets a batch end before max_new_tokens
    return options


class _Capped:
    """`on_done` told at most `total` items in all (a failed path's rows are finished again by the next)."""

    def __init__(self, total: int, on_done: Callable[[int], None] | None):
        self.left, self.on_done = total, on_done

    def __call__(self, n: int) -> None:
        n = min(n, self.left)
        if n > 0 and self.on_done is not None:
            self.left -= n
            self.on_done(n)


def _continuous(model, tokenizer, token_ids, max_new_tokens, stop, eos_ids, slots, on_done) -> list[list[int]] | None:
    """Greedy new tokens per prompt from the CPU shared-prefix batcher (`a2rl_bench.inference.prefix_batching`), or
    None where it does not apply or fails (then the batch-by-batch path runs)."""
    from a2rl_bench.inference.prefix_batching import PrefixBatcher, Unsupported

    if model.__dict__.get("_a2rl_batcher_failed"):
        return None
    prefix = shared_prefix(token_ids)
    if len(prefix) < MIN_SHARED_PREFIX:
        prefix = []
    stops = StopTokens.build(tokenizer, stop, eos_ids)

    def finished(tokens: list[int]) -> bool:
        if tokens[-1] in stops.ids:
            return True
        return not stops.exact and _has_stop(tokenizer.decode(tokens, skip_special_tokens=True), stop)

    try:
        batcher = PrefixBatcher(model)
        p = len(prefix)
        return batcher.decode(prefix, [ids[p:] for ids in token_ids], max_new_tokens, slots, finished, on_done)
    except Unsupported as e:
        log.info("shared-prefix batcher not used: %s", e)
    except Exception as e:  # noqa: BLE001 - any failure: the same outputs from the batch-by-batch path
        log.warning("shared-prefix batcher failed (%s: %s); decoding batch by batch", type(e).__name__, e)
    model.__dict__["_a2rl_batcher_failed"] = True
    return None


class _BatchReport:
    """Counts a batch's finished rows towards `on_done`, never more than the batch has (an engine that fails
    mid-batch hands it to `generate`, which finishes the same rows again)."""

    def __init__(self, size: int, on_done: Callable[[int], None] | None):
        self.size, self.on_done, self.reported = size, on_done, 0

    def __call__(self, finished: int) -> None:
        """`finished`: rows of the batch known to be final by now (a running total)."""
        new = min(finished, self.size) - self.reported
        if new > 0 and self.on_done is not None:
            self.reported += new
            self.on_done(new)


def _generate_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    options: dict,
    report: Callable[[int], None] | None = None,
    eos_ids: set[int] | None = None,
) -> list[list[int]]:
    """New tokens per prompt from `model.generate` (rows that ended early are padded); `report(n)` hears how
    many rows have ended so far, step by step."""
    import torch
    from transformers import StoppingCriteriaList

    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    prompt_length = batch["input_ids"].shape[1]
    if report is not None:
        ends = {*(eos_ids or ()), *([tokenizer.pad_token_id] if tokenizer.pad_token_id is not None else [])}
        options = {**options, "stopping_criteria": StoppingCriteriaList([_rows_ended(prompt_length, ends, report)])}
    with torch.inference_mode():
        output = model.generate(**batch, **options)
    return output[:, prompt_length:].tolist()


def _rows_ended(prompt_length: int, end_ids: set[int], report: Callable[[int], None]):
    """A stopping criterion that stops nothing: it counts the rows whose new tokens hold an end (EOS, or the pad
    `generate` writes after a row stopped on a stop string) and reports the total."""
    import torch
    from transformers import StoppingCriteria

    class RowsEnded(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            ends = torch.tensor(sorted(end_ids), device=input_ids.device)
            report(int(torch.isin(input_ids[:, prompt_length:], ends).any(dim=1).sum()))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return RowsEnded()


def _finish_rows(
    new_tokens: list[list[int]], tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...], eos_ids: set[int]
) -> tuple[list[str], list[int]]:
    """Each row cut at its first EOS or stop string: the completion text and its real token count."""
    texts, counts = [], []
    for ids in new_tokens:
        ids = ids[: _real_length(ids, tokenizer, stop, eos_ids)]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        texts.append(_cut_at_stop(text, stop))
        counts.append(len(ids))
    return texts, counts


def _real_length(ids: list[int], tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...], eos_ids: set[int]) -> int:
    """Tokens the model really generated for this row: through the first EOS or the token completing a stop.

    After a row finishes, `generate` fills it with pad (which often equals EOS) while other rows go on, so
    neither "drop pad" nor "up to EOS" alone is right when a row ended on a stop string.
    """
    length = next((i + 1 for i, token in enumerate(ids) if token in eos_ids), len(ids))
    if stop and _has_stop(tokenizer.decode(ids[:length], skip_special_tokens=True), stop):
        low, high = 1, length  # smallest prefix whose text contains a stop string (monotone in the prefix)
        while low < high:
            mid = (low + high) // 2
            if _has_stop(tokenizer.decode(ids[:mid], skip_special_tokens=True), stop):
                high = mid
            else:
                low = mid + 1
        length = low
    return length


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every id that ends generation: the tokenizer's EOS and the generation config's (may be a list)."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    return ids


def _has_stop(text: str, stop: tuple[str, ...]) -> bool:
    return any(s in text for s in stop)


def _cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


class _EngineRun:
    """The decode engine for one `generate` call: which decoder, which shared prefix, fallback on failure."""

    def __init__(self, decoder, prefix_ids: list[int], sampling: Sampling | None = None):
        self.decoder = decoder
        self.prefix_ids = prefix_ids
        self.prefix = None
        self.sampling = sampling
        self.stop: StopTokens | None = None

    @classmethod
    def plan(cls, model: PreTrainedModel, engine: str, temperature: float, top_p: float, token_ids) -> _EngineRun | None:
        if engine == "generate":
            return None
        prefix = shared_prefix(token_ids)
        if len(prefix) < MIN_SHARED_PREFIX:
            prefix = []
        on_cuda = model.device.type == "cuda"
        if engine == "auto" and not on_cuda and (temperature > 0 or not prefix):
            return None  # on CPU `generate` is the sampler, and without a shared prefix the engine saves nothing
        use_graph = on_cuda and engine in ("auto", "graph")
        decoder = _decoder_for(model, use_graph)
        sampling = Sampling(temperature=temperature, top_p=top_p) if temperature > 0 else None
        return cls(decoder, prefix, sampling) if decoder is not None else None

    def try_batch(self, rows, max_new_tokens, tokenizer, stop, eos_ids, seeds, report=None) -> list[list[int]] | None:
        """New tokens per row from the engine, or None (after one warning) to use `generate` instead;
        `report(n)`: n rows of the batch have finished by now."""
        if self.decoder is None:
            return None
        p = len(self.prefix_ids)

        def finished(tokens: list[int]) -> bool:
            if any(t in eos_ids for t in tokens):
                return True
            return bool(stop) and _has_stop(tokenizer.decode(tokens, skip_special_tokens=True), stop)

        try:
            if p and self.prefix is None:
                self.prefix = self.decoder.cached_prefix(self.prefix_ids)
            if self.stop is None:
                self.stop = StopTokens.build(tokenizer, stop, eos_ids)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            return self.decoder.decode([r[p:] for r in rows], max_new_tokens, finished, pad, self.prefix,
                                       sampling=self.sampling, seeds=seeds if self.sampling else None,
                                       stop=self.stop, report=report)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - any engine failure: same outputs from `generate`
            log.warning("decode engine failed (%s: %s); falling back to transformers generate", type(e).__name__, e)
            _disable_decoder(self.decoder.model)
            self.decoder = None
            return None


def _decoder_for(model: PreTrainedModel, use_graph: bool):
    """The model's decoder (kept on the model: its caches and graphs serve later calls), or None."""
    from a2rl_bench.inference.decode_engine import Decoder, EngineUnsupported

    decoders = model.__dict__.setdefault("_a2rl_decoders", {})
    if use_graph not in decoders:
        try:
            chunk = 32 if model.device.type == "cuda" else 4  # host checks: cheap on CPU, a sync on CUDA
            decoders[use_graph] = Decoder(model, use_graph=use_graph, chunk=chunk)
        except EngineUnsupported as e:
            log.info("decode engine not used: %s", e)
            decoders[use_graph] = None
    return decoders[use_graph]


def _disable_decoder(model: PreTrainedModel) -> None:
    model.__dict__["_a2rl_decoders"] = {True: None, False: None}
