"""Sampled decoding in the static-cache engine (CPU, no CUDA graph): the limit of a vanishing temperature is greedy
decoding; sampled token frequencies match the model's distribution and `generate`'s (statistical tests that
fail when the sampler is wrong); a seed reproduces a row whatever else is in the batch; top-k / top-p keep to
their sets; rows end on the device at a stop token without any host check."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from a2rl_bench.inference.decode_engine import Decoder, Sampling, StopTokens, gumbel_noise, row_seeds
from a2rl_bench.inference.generation import LoadedModel, _generate_batch, generate
from tests.tiny_model import tiny_questions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_SAMPLES = 4000
"""Rows per frequency test: each row one independent sample (its own seed)."""
P_FLOOR = 1e-3
"""A frequency test fails below this p-value: a correct sampler fails it once in a thousand runs."""


def chi2_sf(x: float, df: int) -> float:
    """Upper tail of the chi-square distribution (Wilson-Hilferty; ample for df >= 3 at these p-values)."""
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def goodness_of_fit(counts: Counter, probs: dict[int, float], n: int) -> tuple[float, int]:
    """(p-value, degrees of freedom) of observed token counts against exact probabilities; tokens expected
    fewer than 5 times are pooled into one cell."""
    stat, pooled_expected, pooled_observed, cells = 0.0, 0.0, 0, 0
    for token, p in probs.items():
        expected = n * p
        if expected >= 5:
            stat += (counts.get(token, 0) - expected) ** 2 / expected
            cells += 1
        else:
            pooled_expected += expected
            pooled_observed += counts.get(token, 0)
    if pooled_expected >= 5:
        stat += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        cells += 1
    return chi2_sf(stat, cells - 1), cells - 1


def two_sample(a: Counter, b: Counter) -> tuple[float, int]:
    """(p-value, df) of the chi-square test that two equal-size samples come from one distribution."""
    keys = [k for k in set(a) | set(b) if a.get(k, 0) + b.get(k, 0) >= 10]
    rest_a = sum(v for k, v in a.items() if k not in keys)
    rest_b = sum(v for k, v in b.items() if k not in keys)
    cells = [(a.get(k, 0), b.get(k, 0)) for k in keys] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
    stat = sum((x - y) ** 2 / (x + y) for x, y in cells if x + y)
    return chi2_sf(stat, len(cells) - 1), len(cells) - 1


@pytest.fixture(scope="module")
def prompt(tiny: LoadedModel) -> list[int]:
    tok = tiny.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": tiny_questions(3, 4)[0]}], tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def decoder(tiny: LoadedModel) -> Decoder:
    return Decoder(tiny.model, use_graph=False, chunk=4)


def exact_first_token(tiny: LoadedModel, prompt: list[int], temperature: float) -> dict[int, float]:
    import torch

    with torch.inference_mode():
        logits = tiny.model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    probs = torch.softmax(logits / temperature, -1)
    return {i: float(p) for i, p in enumerate(probs)}


def test_vanishing_temperature_is_greedy(tiny: LoadedModel, decoder: Decoder) -> None:
    tok = tiny.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": q * (1 + i % 2)}], tokenize=False,
                                     add_generation_prompt=True) for i, q in enumerate(tiny_questions(0, 6))]  # fmt: skip
    rows = tok(texts, add_special_tokens=False)["input_ids"]
    greedy = decoder.decode(rows, 24, None, tok.pad_token_id)
    cold = decoder.decode(rows, 24, None, tok.pad_token_id, sampling=Sampling(temperature=1e-5),
                          seeds=row_seeds(7, len(rows)))  # fmt: skip
    assert cold == greedy
    assert greedy == _generate_batch(tiny.model, tok, texts, {"max_new_tokens": 24, "do_sample": False,
                                                              "pad_token_id": tok.pad_token_id})  # fmt: skip


def test_first_token_frequencies_match_the_model_and_generate(tiny: LoadedModel, decoder: Decoder, prompt) -> None:
    """One prompt, N rows with N seeds: the first sampled token follows softmax(logits / T); `generate`'s
    samples of the same prompt are indistinguishable from the engine's."""
    import torch

    temperature = 1.5  # flatter than the model: many tokens get enough mass to be tested
    probs = exact_first_token(tiny, prompt, temperature)
    rows = [prompt] * N_SAMPLES
    tok = tiny.tokenizer
    ours = decoder.decode(rows, 1, None, tok.pad_token_id, sampling=Sampling(temperature=temperature),
                          seeds=row_seeds(11, N_SAMPLES))  # fmt: skip
    ours_counts = Counter(r[0] for r in ours)
    p_model, df = goodness_of_fit(ours_counts, probs, N_SAMPLES)
    assert df >= 5, "the test needs a distribution spread over several tokens"
    assert p_model > P_FLOOR, f"engine's first tokens do not follow the model (p={p_model:.2g}, df={df})"
    torch.manual_seed(3)
    text = tok.decode(prompt)
    theirs = _generate_batch(tiny.model, tok, [text] * N_SAMPLES,
                             {"max_new_tokens": 1, "do_sample": True, "temperature": temperature, "top_k": 0,
                              "top_p": 1.0, "pad_token_id": tok.pad_token_id})  # fmt: skip
    p_generate, _ = goodness_of_fit(Counter(r[0] for r in theirs), probs, N_SAMPLES)
    assert p_generate > P_FLOOR  # the reference itself (a broken fixture would show here)
    p_two, _ = two_sample(ours_counts, Counter(r[0] for r in theirs))
    assert p_two > P_FLOOR, f"engine and generate sample differently (p={p_two:.2g})"


def test_token_pairs_match_generate(tiny: LoadedModel, decoder: Decoder, prompt) -> None:
    """The first two tokens jointly, under top-k 4 (at most 16 pairs, so every cell is well filled): a sampler
    that reused one token's noise for the next, or drew it from the wrong position, changes the joint
    distribution even where every marginal is right."""
    import torch

    tok = tiny.tokenizer
    rows = [prompt] * N_SAMPLES
    ours = decoder.decode(rows, 2, None, tok.pad_token_id, sampling=Sampling(temperature=1.0, top_k=4),
                          seeds=row_seeds(5, N_SAMPLES))  # fmt: skip
    torch.manual_seed(4)
    theirs = _generate_batch(tiny.model, tok, [tok.decode(prompt)] * N_SAMPLES,
                             {"max_new_tokens": 2, "do_sample": True, "temperature": 1.0, "top_k": 4,
                              "eos_token_id": None, "pad_token_id": tok.pad_token_id})  # fmt: skip
    p_two, df = two_sample(Counter(tuple(r[:2]) for r in ours), Counter(tuple(r[:2]) for r in theirs))
    assert df >= 5
    assert p_two > P_FLOOR, f"token pairs differ from generate's (p={p_two:.2g}, df={df})"


def test_consecutive_tokens_draw_independent_noise(tiny: LoadedModel, decoder: Decoder, prompt) -> None:
    """At a huge temperature every token is (nearly) uniform over the vocabulary: the first and second token of
    a row agree about once in |V|, not always (noise reused across positions) and not never."""
    tok = tiny.tokenizer
    out = decoder.decode([prompt] * N_SAMPLES, 2, None, tok.pad_token_id, sampling=Sampling(temperature=1e4),
                         seeds=row_seeds(8, N_SAMPLES))  # fmt: skip
    vocab = tiny.model.config.vocab_size
    same = sum(r[0] == r[1] for r in out)
    expected = N_SAMPLES / vocab
    assert abs(same - expected) < 5 * math.sqrt(expected) + 1, f"{same} of {N_SAMPLES} pairs repeat (expected ~{expected:.1f})"
    p_uniform, _ = goodness_of_fit(Counter(r[1] for r in out), dict.fromkeys(range(vocab), 1 / vocab), N_SAMPLES)
    assert p_uniform > P_FLOOR


def test_a_seed_reproduces_a_row_whatever_the_batch(tiny: LoadedModel, decoder: Decoder) -> None:
    tok = tiny.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in tiny_questions(10, 16)]  # fmt: skip
    rows = tok(texts, add_special_tokens=False)["input_ids"]
    sampling = Sampling(temperature=1.0)
    seeds = row_seeds(2024, len(rows))
    first = decoder.decode(rows, 20, None, tok.pad_token_id, sampling=sampling, seeds=seeds)
    assert decoder.decode(rows, 20, None, tok.pad_token_id, sampling=sampling, seeds=seeds) == first
    # Row 2 alone, and inside another batch in another place: the same tokens.
    assert decoder.decode([rows[2]], 20, None, tok.pad_token_id, sampling=sampling, seeds=[seeds[2]]) == [first[2]]
    mixed = decoder.decode([rows[4], rows[2]], 20, None, tok.pad_token_id, sampling=sampling,
                           seeds=[seeds[4], seeds[2]])  # fmt: skip
    assert mixed == [first[4], first[2]]
    other = decoder.decode(rows, 20, None, tok.pad_token_id, sampling=sampling, seeds=row_seeds(2025, len(rows)))
    assert other != first


def test_library_generate_samples_reproducibly_through_the_engine(tiny: LoadedModel) -> None:
    questions = [[{"role": "user", "content": q}] for q in tiny_questions(30, 38)]
    one = generate(tiny, questions, max_new_tokens=12, temperature=1.0, seed=9, batch_size=3, engine="static")
    two = generate(tiny, questions, max_new_tokens=12, temperature=1.0, seed=9, batch_size=8, engine="static")
    assert one.completions == two.completions  # another batching, the same samples
    three = generate(tiny, questions, max_new_tokens=12, temperature=1.0, seed=10, batch_size=8, engine="static")
    assert three.completions != one.completions


def test_top_k_and_top_p_keep_to_their_sets(tiny: LoadedModel, decoder: Decoder, prompt) -> None:
    tok = tiny.tokenizer
    probs = exact_first_token(tiny, prompt, 1.0)
    ranked = sorted(probs, key=probs.get, reverse=True)
    rows = [prompt] * 600
    top3 = decoder.decode(rows, 1, None, tok.pad_token_id, sampling=Sampling(top_k=3), seeds=row_seeds(1, 600))
    assert {r[0] for r in top3} <= set(ranked[:3])
    assert len({r[0] for r in top3}) > 1
    mass, nucleus = 0.0, []
    for token in ranked:  # the smallest set of most likely tokens holding 0.6 of the mass
        nucleus.append(token)
        mass += probs[token]
        if mass >= 0.6:
            break
    sampled = decoder.decode(rows, 1, None, tok.pad_token_id, sampling=Sampling(top_p=0.6), seeds=row_seeds(2, 600))
    assert {r[0] for r in sampled} <= set(nucleus)


def test_rows_end_on_the_device_at_a_stop_token(tiny: LoadedModel, decoder: Decoder) -> None:
    """A stop token found on the device ends the row: it emits padding afterwards, and with only one-character
    stop strings no host check is made at all (`finished` would fail the test if it were called)."""
    tok = tiny.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in tiny_questions(40, 52)]  # fmt: skip
    rows = tok(texts, add_special_tokens=False)["input_ids"]
    eos = {tok.eos_token_id}
    stop = StopTokens.build(tok, [" "], eos)  # every token holding a space ends a row
    assert stop.exact and len(stop.ids) > 10

    def never(tokens):
        raise AssertionError("no host check is needed for one-character stop strings")

    out = decoder.decode(rows, 30, never, tok.pad_token_id, sampling=Sampling(temperature=1.0),
                         seeds=row_seeds(3, len(rows)), stop=stop)  # fmt: skip
    for tokens in out:
        real = stop.cut(tokens)
        assert real[-1] in stop.ids or len(real) == 30
        assert all(t == tok.pad_token_id for t in tokens[len(real) :])
    assert any(len(stop.cut(t)) < 30 for t in out)


def test_multi_token_stop_strings_end_rows_on_the_device(tiny: LoadedModel, decoder: Decoder) -> None:
    """A stop string the tokenizer spells with several tokens, produced by greedy decoding, is matched on the
    device (the row's `done` flag), so no `finished` check is needed for it to end early."""
    tok = tiny.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": tiny_questions(60, 61)[0]}], tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    row = tok(text, add_special_tokens=False)["input_ids"]
    free = decoder.decode([row], 40, None, tok.pad_token_id)[0]
    # A two-token stretch of the greedy output, spelled exactly as the tokenizer spells its text.
    for i in range(2, len(free) - 1):
        piece = tok.decode(free[i : i + 2])
        if tok(piece, add_special_tokens=False)["input_ids"] == free[i : i + 2] and piece not in tok.decode(free[:i]):
            break
    else:
        pytest.skip("no two-token stretch re-tokenizes to itself in this output")
    stop = StopTokens.build(tok, [piece], set())
    stop = StopTokens(frozenset(), stop.sequences, exact=False)  # only the sequence match may end the row
    out = decoder.decode([row], 40, None, tok.pad_token_id, stop=stop)[0]
    assert out[: i + 2] == free[: i + 2]
    assert all(t == tok.pad_token_id for t in out[i + 2 :])


def test_noise_is_a_function_of_seed_index_and_vocabulary() -> None:
    import torch

    keys = torch.arange(1000, dtype=torch.long)
    from a2rl_bench.inference.decode_engine import _mix32

    vocab_keys = _mix32(keys)
    seeds = torch.tensor([1, 2, 1], dtype=torch.long)
    g = gumbel_noise(seeds, torch.tensor([0]), vocab_keys)
    assert torch.equal(g[0], g[2]) and not torch.equal(g[0], g[1])
    assert not torch.equal(g[0], gumbel_noise(seeds, torch.tensor([1]), vocab_keys)[0])
    # Gumbel(0, 1): mean ~ 0.5772, variance ~ pi^2 / 6, over 3,000 draws of one row
    big = gumbel_noise(torch.arange(3, dtype=torch.long), torch.tensor([5]), vocab_keys).flatten().double()
    assert abs(big.mean().item() - 0.5772) < 0.1
    assert abs(big.var().item() - math.pi**2 / 6) < 0.25


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_a_short_request_reuses_the_state_of_its_rounded_length(tiny: LoadedModel, monkeypatch) -> None:
    """Cache lengths are rounded up (to 256 with graphs); a request needing under half of that must reuse the
    kept state, not make a new one (with graphs: capture a new graph) at every call. On CUDA this was the
    `graphs_captured` 2 != 1 of the graph test below: its prompts need ~60-100 slots, far below 256 / 2."""
    import a2rl_bench.inference.decode_engine as engine

    monkeypatch.setattr(engine, "SLOT_ALIGN", engine.GRAPH_SLOT_ALIGN)  # the graph path's rounding, on the CPU
    tok = tiny.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in tiny_questions(0, 12)]  # fmt: skip
    rows = tok(texts, add_special_tokens=False)["input_ids"]
    assert max(len(r) for r in rows) + 24 < engine.GRAPH_SLOT_ALIGN // 2
    decoder = Decoder(tiny.model, use_graph=False, chunk=4)
    decoder.decode(rows, 24, None, tok.pad_token_id)  # 12 rows: the eager path's batch is the row count
    (first,) = decoder.states.values()
    decoder.decode([r[:-3] for r in rows], 24, None, tok.pad_token_id)  # shorter prompts
    decoder.decode([r[:5] for r in rows], 3, None, tok.pad_token_id)  # far shorter
    (kept,) = decoder.states.values()
    assert kept is first


@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA device (the graph path)")
def test_graph_sampling_equals_eager_sampling_on_cuda(tiny_model_dir) -> None:
    """With a CUDA graph the same seeds give the same samples as without one (fp32: no near-tie noise), rows end
    on the device, and a second batch of another size replays graphs without capturing each step again."""
    from a2rl_bench.inference.generation import load_model

    cuda = load_model(tiny_model_dir, "cuda")
    cuda.model.float()
    tok = cuda.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in tiny_questions(0, 12)]  # fmt: skip
    rows = tok(texts, add_special_tokens=False)["input_ids"]
    stop = StopTokens.build(tok, [" "], {tok.eos_token_id})
    seeds = row_seeds(77, len(rows))
    kwargs = dict(sampling=Sampling(temperature=1.0), seeds=seeds, stop=stop)
    eager = Decoder(cuda.model, use_graph=False, chunk=4).decode(rows, 24, None, tok.pad_token_id, **kwargs)
    graph = Decoder(cuda.model, use_graph=True, chunk=4)
    # Rows are read at chunk boundaries, so their padding after the end may differ in length: compare real tokens.
    assert [stop.cut(t) for t in graph.decode(rows, 24, None, tok.pad_token_id, **kwargs)] == [stop.cut(t) for t in eager]
    captured = graph.graphs_captured
    assert [stop.cut(t) for t in graph.decode(rows[:10], 24, None, tok.pad_token_id, sampling=Sampling(temperature=1.0),
                                               seeds=seeds[:10], stop=stop)] == [stop.cut(t) for t in eager[:10]]  # fmt: skip
    # 10 rows share the bucket of 12 (16) and the cache length (256): the same state, the same graph.
    assert graph.graphs_captured == captured
