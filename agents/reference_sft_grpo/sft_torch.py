"""Full fine-tuning on worked examples in plain PyTorch, in time-limited rounds of one loaded model.

The examples are the task's ``sft.jsonl`` (prompt-completion conversations in the evaluator's own prompt
format); the loss is on the completion only (the reply and its end-of-turn), with the output layer run on
those positions alone (`target_log_probs`). On CUDA the forward pass runs under bf16 autocast with fp32
master weights; on CPU everything is fp32.

Stand-alone: copied into the workspace's ``code/`` and imported by the agent; imports nothing from the harness.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

IGNORE = -100
"""Label of a token that carries no loss (the prompt, the padding)."""
MIN_SHARED_PREFIX = 32
"""Shortest prefix all rows of a batch share that is worth running once (the task's system prompt is ~200)."""


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]
    """`IGNORE` over the prompt, the token ids over the completion."""


@dataclass
class RoundStats:
    steps: int
    examples: int
    tokens: int
    loss: float
    """Mean training loss of the round's steps."""
    train_s: float


def first_target(example: Example) -> int:
    return next(i for i, label in enumerate(example.labels) if label != IGNORE)


def split_conversation(tokenizer, prompt: list[dict], completion: list[dict]) -> tuple[str, str] | None:
    """(prompt text with the generation header, reply text with its end-of-turn) as the chat template renders
    them; None if the template does not render the prompt as a prefix of the whole conversation."""
    before = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + completion, tokenize=False, add_generation_prompt=False)
    return (before, full[len(before) :]) if full.startswith(before) else None


def to_example(prompt_ids: list[int], reply_ids: list[int], max_length: int) -> Example | None:
    """The loss on the reply only; None if empty or longer than `max_length` (skipped, not truncated)."""
    if not reply_ids or len(prompt_ids) + len(reply_ids) > max_length:
        return None
    return Example(prompt_ids + reply_ids, [IGNORE] * len(prompt_ids) + reply_ids)


def load_examples(path: Path, tokenizer, max_length: int) -> tuple[list[Example], int]:
    """(examples that fit, rows read) of a prompt-completion JSONL file (tokenised in one batch)."""
    with Path(path).open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return examples_from_rows(rows, tokenizer, max_length)


def examples_from_rows(rows: list[dict], tokenizer, max_length: int) -> tuple[list[Example], int]:
    """(examples that fit, well-formed rows) of prompt-completion rows (tokenised in one batch)."""
    pairs, n = [], 0
    for row in rows:
        if not (isinstance(row.get("prompt"), list) and isinstance(row.get("completion"), list)):
            continue
        n += 1
        if (pair := split_conversation(tokenizer, row["prompt"], row["completion"])) is not None:
            pairs.append(pair)
    if not pairs:
        return [], n
    prompts = tokenizer([b for b, _ in pairs], add_special_tokens=False)["input_ids"]
    replies = tokenizer([r for _, r in pairs], add_special_tokens=False)["input_ids"]
    examples = [to_example(p, r, max_length) for p, r in zip(prompts, replies)]
    return [e for e in examples if e is not None], n


def epoch_batches(n: int, batch_size: int, rng: random.Random, lengths: list[int]) -> list[list[int]]:
    """One epoch of index batches: shuffled, then sorted by length within windows of 16 batches (less
    padding), and the batches shuffled again. Every index appears exactly once."""
    order = list(range(n))
    rng.shuffle(order)
    window = batch_size * 16
    batches = []
    for start in range(0, n, window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def collate(examples: list[Example], pad_id: int, device):
    """Right-padded tensors: input ids, attention mask, labels."""
    import torch

    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids)
        labels[row, : len(e.labels)] = torch.tensor(e.labels)
        mask[row, : len(e.input_ids)] = 1
    return ids.to(device), mask.to(device), labels.to(device)


def target_log_probs(model, ids, mask, targets, device, chunk_rows: int = 512, prefix: int = 0,
                     temperature: float = 1.0, checkpoint_layers: bool = False):
    """Log-probabilities of the target tokens only: `targets` is a bool (B, L) tensor marking the tokens to
    score (each predicted from the position before it). Returns a flat tensor in row-major order.

    The output layer runs on the selected positions alone, in chunks of `chunk_rows` whose logits are recomputed
    in the backward pass: each chunk's log-prob is the sampled token's logit minus the logsumexp of its row, so
    no (B, L, vocabulary) tensor and no fp32 log-softmax copy of a whole chunk is ever held (fp32 logits over a
    49k vocabulary were most of a 30-45 GB peak). `temperature`: the logits are divided by it first, so an RL
    ratio is taken against the distribution the sampler drew from at that temperature.

    `prefix`: the first `prefix` tokens are the same real tokens in every row (a shared system prompt) and
    hold no target: they run through the model once, at batch 1, and every row attends to their keys and
    values (gradients flow back through them), so the batch costs its suffixes only.

    `checkpoint_layers`: each decoder layer keeps only its input for the backward pass and runs again there (one
    more forward pass), so activations shrink from ~0.7 MiB a token (135M, bf16 autocast) to the layers' inputs;
    the shared prefix's own forward (batch 1) is not checkpointed."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature})")
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    with autocast(device):
        if prefix > 0:
            hidden = _suffix_hidden(decoder, ids, mask, prefix, checkpoint_layers)
            ids, targets = ids[:, prefix - 1 :], targets[:, prefix - 1 :]  # hidden covers positions prefix-1 ..
        else:
            with _checkpointed(decoder, checkpoint_layers):
                hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
    picked = hidden[:, :-1][targets[:, 1:]]  # the position before each target predicts it
    wanted = ids[:, 1:][targets[:, 1:]]

    def score(h, t):
        with autocast(device):
            logits = head(h)
        logits = logits.float() / temperature if temperature != 1.0 else logits.float()
        return logits.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    parts = [checkpoint(score, picked[i : i + chunk_rows], wanted[i : i + chunk_rows], use_reentrant=False)
             for i in range(0, picked.shape[0], chunk_rows)]  # fmt: skip
    return torch.cat(parts) if parts else picked.new_zeros(0, dtype=torch.float32)


def _suffix_hidden(decoder, ids, mask, prefix: int, checkpoint_layers: bool = False):
    """Hidden states of positions prefix-1 .. L-1 of every row, the shared prefix computed once."""
    import inspect

    import torch
    from transformers import DynamicCache

    params = inspect.signature(decoder.forward).parameters
    cache_arg = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.2x renamed it
    head = decoder(input_ids=ids[:1, :prefix], use_cache=True)
    shared = getattr(head, cache_arg, None) or head.past_key_values
    batch = ids.shape[0]
    cache = _read_only_cache() if checkpoint_layers else DynamicCache()
    for i, layer in enumerate(shared.layers):
        DynamicCache.update(cache, layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1), i)
    positions = torch.arange(prefix, ids.shape[1], device=ids.device)[None].expand(batch, -1)
    with _checkpointed(decoder, checkpoint_layers):
        rest = decoder(input_ids=ids[:, prefix:], attention_mask=mask, position_ids=positions, use_cache=True,
                       **{cache_arg: cache}).last_hidden_state
    last = head.last_hidden_state[:, -1:].expand(batch, -1, -1)  # the prefix's last position predicts token `prefix`
    return torch.cat([last, rest], dim=1)


def _read_only_cache():
    """A prefix cache whose `update` returns the prefix's keys and values followed by the new ones without storing
    them: a checkpointed layer runs twice (forward, then again in the backward pass), and a cache that grew on
    the first run would hand the second a longer sequence."""
    import torch
    from transformers import DynamicCache

    class ReadOnlyPrefixCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            layer = self.layers[layer_idx]
            return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)

    return ReadOnlyPrefixCache()


def _checkpointed(decoder, on: bool):
    """Each decoder layer under activation checkpointing for the duration (its forward wrapped per instance)."""
    import contextlib
    import functools

    if not on:
        return contextlib.nullcontext()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(decoder).__name__} has no `layers` to checkpoint")

    @contextlib.contextmanager
    def wrapped():
        from torch.utils.checkpoint import checkpoint

        for layer in layers:
            layer.forward = functools.partial(checkpoint, type(layer).forward.__get__(layer), use_reentrant=False)
        try:
            yield
        finally:
            for layer in layers:
                del layer.forward

    return wrapped()


def shared_prefix_length(rows: list[list[int]], targets_from: list[int]) -> int:
    """Tokens every row starts with, and short of each row's first target (which needs a token before it)."""
    if len(rows) < 2:
        return 0
    first, limit = rows[0], min(min(len(r) for r in rows), min(targets_from)) - 1
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows):
        n += 1
    return n


def micro_batches(batch: list[Example], micro_tokens: int | None) -> list[list[Example]]:
    """The batch's rows in runs of similar length whose padded size (rows x the longest) stays within
    `micro_tokens`; a row longer than that alone. None: the whole batch at once.

    >>> ex = lambda n: Example([0] * n, [0] * n)
    >>> [[len(e.input_ids) for e in part] for part in micro_batches([ex(5), ex(2), ex(4), ex(3)], 8)]
    [[2, 3], [4], [5]]
    """
    if micro_tokens is None:
        return [batch]
    parts: list[list[Example]] = []
    for example in sorted(batch, key=lambda e: len(e.input_ids)):  # the longest last: each part pads to its own
        if parts and (len(parts[-1]) + 1) * len(example.input_ids) <= micro_tokens:
            parts[-1].append(example)
        else:
            parts.append([example])
    return parts


def autocast(device):
    """bf16 autocast on CUDA (fp32 master weights), nothing on CPU."""
    import contextlib

    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class SFTRounds:
    """One optimizer over the whole session: each `train` call continues where the last one stopped."""

    def __init__(self, model, tokenizer, examples: list[Example], *, lr: float, batch_size: int, seed: int,
                 warmup_steps: int = 10, max_grad_norm: float = 1.0, checkpoint_layers: bool = False,
                 micro_tokens: int | None = None):  # fmt: skip
        import torch

        if not examples:
            raise ValueError("no worked example fits; nothing to train on")
        self.model, self.tokenizer, self.examples = model, tokenizer, examples
        self.batch_size, self.lr, self.warmup_steps, self.max_grad_norm = batch_size, lr, warmup_steps, max_grad_norm
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        self.rng = random.Random(seed)
        self.lengths = [len(e.input_ids) for e in examples]
        self.queue: list[list[int]] = []
        self.steps = 0
        self.checkpoint_layers = checkpoint_layers
        """Each decoder layer keeps only its input and runs again in the backward pass (as the RL update does on
        CUDA). Off by default: it only gets slower, where the update's checkpointed layers let 4x larger
        micro-batches run in fewer calls. On an H200 (bench/bench_sft_step.py, 30 steps of the agent's batches):
        peak 4.3 GiB against 20.1, 2.07x the time a step."""
        if micro_tokens is not None and micro_tokens < 1:
            raise ValueError(f"micro_tokens must be >= 1 (got {micro_tokens})")
        self.micro_tokens = micro_tokens
        """Padded tokens per forward and backward call at most (rows of a batch split into micro-batches whose
        gradients add up to the batch's: the loss is the mean over the whole batch's targets either way). None:
        one call per batch. Bounds a step's activations (~0.7 MiB a token at 135M under bf16 autocast): a batch
        of 32 rows of up to 1,024 tokens otherwise peaks at ~20 GiB, which keeps four runs, not eight, on a card."""

    def set_lr(self, lr: float) -> None:
        self.lr = lr

    def next_batch(self) -> list[Example]:
        if not self.queue:
            self.queue = epoch_batches(len(self.examples), self.batch_size, self.rng, self.lengths)
        return [self.examples[i] for i in self.queue.pop()]

    def train(self, seconds: float, max_steps: int | None = None) -> RoundStats:
        """Steps until the next one would end past `seconds` (judged by the last step's time) or `max_steps`."""
        import torch

        self.model.train()
        t0 = last = time.monotonic()
        steps = examples = tokens = 0
        loss_sum = 0.0
        while max_steps is None or steps < max_steps:
            batch = self.next_batch()
            scale = min(1.0, (self.steps + 1) / max(1, self.warmup_steps))
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr * scale
            targets = sum(label != IGNORE for e in batch for label in e.labels[1:])  # what .mean() divided by
            for part in micro_batches(batch, self.micro_tokens):
                ids, mask, labels = collate(part, self.pad_id, self.device)
                prefix = shared_prefix_length([e.input_ids for e in part], [first_target(e) for e in part])
                prefix = prefix if prefix >= MIN_SHARED_PREFIX else 0
                loss = -target_log_probs(self.model, ids, mask, labels != IGNORE, self.device, prefix=prefix,
                                         checkpoint_layers=self.checkpoint_layers).sum() / targets  # fmt: skip
                loss.backward()  # gradients accumulate over the parts: the batch's mean loss
                tokens += int(mask.sum())
                loss_sum += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.steps += 1
            steps += 1
            examples += len(batch)
            now = time.monotonic()
            if now - t0 + (now - last) > seconds:
                break
            last = now
        self.model.eval()
        return RoundStats(steps, examples, tokens, round(loss_sum / max(1, steps), 4), round(time.monotonic() - t0, 1))
