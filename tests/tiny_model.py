"""The tiny model the tests run on: a deterministic ~100k-parameter Llama and a locally trained tokenizer, built
offline in seconds (a test fixture, not a base model a user picks; the bench scripts use it too)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from a2rl_bench.base_models.build import MARKER, ModelProvenance, build_once, model_provenance

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TINY_VOCAB_SIZE = 512


def tiny_corpus(n: int = 600) -> list[str]:
    """Fixed, GSM8K-flavoured chat text (same every call) to train the tiny tokenizer on."""
    rng = random.Random(1234)
    names = ["Tom", "Ann", "Maria", "James", "Lee", "Sara", "Omar", "Julia", "Ken", "Nina", "Carlos", "Priya"]
    items = ["apples", "eggs", "books", "cookies", "marbles", "pencils", "stickers", "cards", "boxes", "shirts",
             "tickets", "flowers", "candies", "toys", "bottles", "pages", "chairs", "sandwiches"]
    places = ["store", "market", "school", "library", "farm", "bakery", "park", "garden"]
    templates = [
        "{n} has {a} {i}. {n} buys {b} more at the {p}. How many {i} does {n} have now?",
        "{n} had {s} {i} and gave away {b} to a friend. How many {i} are left?",
        "Each box holds {c} {i}. How many {i} are in {a} boxes?",
        "{n} earns ${a} per hour and works {c} hours every week. How much money does {n} earn in a week?",
        "A {p} sells {i} for ${c} each. {n} spends ${t} on {i}. How many {i} did {n} buy?",
        "{n} reads {b} pages each day. How many days will it take to read {t} pages?",
        "There are {a} students in a class. Half of them like {i}. How many students like {i}?",
        "{n} walks {c} miles on Monday and twice as far on Tuesday. What is the total distance?",
    ]
    texts = []
    for _ in range(n):
        a, b, c = rng.randint(2, 99), rng.randint(2, 60), rng.randint(2, 9)
        fill = dict(n=rng.choice(names), i=rng.choice(items), p=rng.choice(places), a=a, b=b, c=c, s=a + b, t=a * c)
        question = rng.choice(templates).format(**fill)
        answer = (
            f"Let's think step by step. First, {a} + {b} = {a + b}. Then {a} * {c} = {a * c}, "
            f"and {a * c} / {c} = {a}. So the answer is {a + b}.\n#### {a + b}"
        )
        texts.append(f"system\nYou are a helpful assistant.\nuser\n{question}\nassistant\n{answer}")
    return texts


def tiny_questions(start: int, stop: int) -> list[str]:
    """The user questions of `tiny_corpus()[start:stop]` (prompts the tiny model's tokenizer knows)."""
    return [text.split("user\n")[1].split("\nassistant")[0] for text in tiny_corpus()[start:stop]]


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE (vocab 512) trained on `tiny_corpus()`, digits split one per token, ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # One token per digit, as in Llama/SmolLM tokenizers, so numbers tokenise the same in any context.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any text encodes, no unknown tokens
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",  # end of an assistant turn ends generation, as in SmolLM2
        pad_token="<|pad|>",
        extra_special_tokens=["<|im_start|>"],
    )
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped


def build_tiny_model(path: Path, seed: int = 0) -> Path:
    """A deterministic ~100k-parameter Llama + tokenizer at `path` (returned as is if already built)."""
    path = Path(path)
    if (path / MARKER).is_file():
        return path

    def build(tmp: Path) -> ModelProvenance:
        import torch
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

        tokenizer = build_tiny_tokenizer()
        ids = {"pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            # With the default 0.02 a random model emits the same token whatever the prompt; 0.2 makes
            # completions prompt-dependent, so tests can tell prompts (and their order) apart.
            initializer_range=0.2,
            pad_token_id=ids["pad"],
            bos_token_id=ids["bos"],
            eos_token_id=ids["eos"],
        )
        with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config).eval()
        model.generation_config = GenerationConfig(
            pad_token_id=ids["pad"], bos_token_id=ids["bos"], eos_token_id=ids["eos"]
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        source = f"tests.tiny_model.build_tiny_model(seed={seed})"
        return model_provenance(key="tiny", source=source, label="random-init tiny Llama (tests only)")

    return build_once(path, build)
