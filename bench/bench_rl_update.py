"""The RL update alone: peak memory and seconds per update of `GRPOEnv.update` (the agent's own code) on update
batches of the real shape, for several settings of the update side by side in one process.

    python bench/bench_rl_update.py MODEL_DIR [--random-init] [--updates 3] [--settings default micro_tokens=4096]
        [--baseline OLD/grpo_env_torch.py --settings baseline:default default] [--data PUBLIC] [--deadline-s S]
    python bench/bench_rl_update.py MODEL_DIR --random-init --plan-only   # the batch and micro-batches, no update
    python bench/bench_rl_update.py TINY_MODEL_DIR --smoke          # CPU check with the tests' tiny model

The batch: `--goals` training games x `--group` episodes of the REAL offline alfworld environment, played by the
agent's own episode code (`grpo_env_torch.play`: the evaluator's prompts, its history window, its action parsing)
with a fixed scripted policy (uniformly random commands built from what the observations name: `go to`, `open`,
`examine`, `take ... from`, `look`, `inventory`), each action tokenised as the sampler returns it (the command,
then the stop). Random commands rarely win, so returns are set by rule (the first half of each group's episodes
"won"): every step then carries a non-zero advantage, as in a group with a win, and the agent's own sample
selection (`GRPOEnv.update_samples`: at most `max_samples`, a uniform subset) makes the update batch. The
update runs with the agent's schedule (`Knobs`: epochs, minibatches, clipping, lr) except the KL target, off here
so that every setting takes all its minibatches (the update's full work, the same in each).

MODEL_DIR is a Hugging Face checkpoint directory; with `--random-init` only its config and tokenizer are read and
the weights are a seeded random init of that config (memory and time of a fixed batch do not depend on the
values; labelled so in the output). On CUDA the sampler is the agent's own (`EngineSampler`: the bf16 copy whose
log-probs the ratio is taken against, and its decode engine, run once on 64 of the batch's prompts so that its
cache is held as in a real run). Each setting starts from the same weights, a fresh optimizer and the same
minibatch order; per update: seconds (CUDA synchronised), `torch.cuda.max_memory_allocated` (reset by the
update itself; on CPU the process's peak RSS, which never falls), memory held before it, padded tokens run
through the model per update. Output: one JSON line per update (`--out`), then a table with each setting's
ratios to the first one. `--baseline FILE` with settings named `baseline:...`: another version of the agent's
`grpo_env_torch.py` (e.g. main's, from `git show`) runs its own update on the same instance, batch and sampler.

Imports neither prefect, duckdb nor pydantic (runs on a bare torch + transformers image): the task data come from
`--data` (the offline alfworld public folder: `envlib.zip`, `train.jsonl`) or, when not given, from the harness.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import random
import re
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SETTINGS = ("micro_tokens", "micro_batch", "chunk_rows", "checkpoint_layers")
"""The update's memory settings a `--settings` entry may give (`GRPOEnv` attributes)."""


def parse_setting(text: str) -> dict[str, int]:
    """`default` or `name=value[,name=value]` over `SETTINGS`, either after `baseline:` (`--baseline`'s code).

    >>> parse_setting("baseline:micro_tokens=4096,chunk_rows=128")
    {'micro_tokens': 4096, 'chunk_rows': 128}
    """
    text = text.removeprefix("baseline:")
    if text == "default":
        return {}
    out = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        low, high = (0, 1) if name == "checkpoint_layers" else (1, 1 << 30)
        if not sep or name not in SETTINGS or not value.isdigit() or not low <= int(value) <= high:
            raise SystemExit(f"bad setting {part!r}: give default or NAME=N with NAME one of {SETTINGS}, N >= 1 "
                             "(checkpoint_layers: 0 or 1)")
        out[name] = int(value)
    return out


def scripted_sampler(tokenizer, stop: str, rng: random.Random):
    """A fixed policy in the sampler's shape: conversations -> [(prompt ids, action ids, text)]. It picks a command
    at random among those the episode's observations make up (receptacles and objects named so far)."""
    from grpo_env_torch import _render  # the workspace's copy (`workspace_modules`)

    named = re.compile(r"\ba ([a-z]+ \d+)")

    def commands(conversation: list[dict]) -> list[str]:
        seen = [m for turn in conversation if turn["role"] == "user" for m in named.findall(turn["content"])]
        places = sorted(set(seen)) or ["desk 1"]
        out = ["look", "inventory"]
        out += [f"{verb} {p}" for p in places for verb in ("go to", "open", "examine")]
        out += [f"take {o} from {p}" for o in places[:6] for p in places[:6] if o != p]
        return out

    def sample(conversations: list[list[dict]]):
        rows = _render(tokenizer, conversations)
        out = []
        for prompt, conversation in zip(rows, conversations):
            text = rng.choice(commands(conversation))
            action = tokenizer(text + stop, add_special_tokens=False)["input_ids"]
            out.append((prompt, action, text))
        return out

    return sample


def load_model(path: Path, random_init: bool, device: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if random_init:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.to(device).eval(), tokenizer


class PassTimer:
    """Times `GRPOEnv.sampling_log_probs` (the sampling copy's pass over the whole batch) inside each update."""

    def __init__(self, grpo, device: str):
        self.seconds, self.grpo, self.device = 0.0, grpo, device
        grpo.sampling_log_probs = self

    def __call__(self, samples):
        import torch

        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        out = type(self.grpo).sampling_log_probs(self.grpo, samples)  # the class's current version
        sync()
        self.seconds += time.perf_counter() - t0
        return out


WORKSPACE = {"search_demos": "agents/reference_sft_grpo/search_demos.py",
             "sft_torch": "agents/reference_sft_grpo/sft_torch.py",
             "decode_engine": "a2rl_bench/inference/decode_engine.py",
             "train_grpo": "agents/reference_grpo/train_grpo.py",
             "grpo_env_torch": "agents/reference_sft_grpo/grpo_env_torch.py",
             "round_loop": "agents/reference_sft/agent.py",
             "sft_grpo_session": "agents/reference_sft_grpo/sft_grpo_session.py"}
"""Module name in an agent's workspace (``code/``) -> its source here, as the adapters copy them; in import order
(each imports the ones before it by these names)."""


@contextlib.contextmanager
def workspace_modules():
    """The agent's modules imported as its workspace imports them (each by its ``code/`` name), not through the
    harness's packages (whose ``__init__`` pulls in pydantic and the rest of the harness): the files a run
    executes, on a bare torch + transformers image. Undone on exit (a test process keeps its own modules)."""
    import importlib.util

    names = [*WORKSPACE, "train_common"]
    before = {name: sys.modules.get(name) for name in names}
    try:
        for name, rel in WORKSPACE.items():
            spec = importlib.util.spec_from_file_location(name, REPO / rel)
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        yield sys.modules["grpo_env_torch"], sys.modules["sft_grpo_session"]
    finally:
        for name, module in before.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def load_baseline(path: Path):
    """Another version of the agent's `grpo_env_torch` module, imported under its own name."""
    import importlib.util

    if not path.is_file():
        raise SystemExit(f"--baseline {path}: no such file")
    spec = importlib.util.spec_from_file_location("grpo_env_torch_baseline", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def peak_rss_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)  # KiB on Linux


def padded_tokens(grpo, samples: list[tuple], minibatches: int) -> int:
    """Tokens (rows x width, less the shared prefix run once) one update runs through the policy and the copy."""
    from sft_torch import MIN_SHARED_PREFIX, shared_prefix_length  # the workspace's copy (`workspace_modules`)

    def cost(indices: list[int]) -> int:
        total = 0
        for idx in grpo.micro_batches(indices, samples):
            chunk = [samples[i] for i in idx]
            width = max(len(p) + len(a) for p, a, *_ in chunk)
            prefix = shared_prefix_length([x[0] for x in chunk], [len(x[0]) for x in chunk])
            prefix = prefix if prefix >= MIN_SHARED_PREFIX else 0
            total += len(chunk) * (width - prefix) + prefix
        return total

    everything = list(range(len(samples)))
    parts = [everything[k::minibatches] for k in range(minibatches)]  # the sizes of the update's minibatches
    return cost(everything) + sum(cost(sorted(p)) for p in parts if p)


def micro_batch_counts(grpo, samples: list[tuple], minibatches: int) -> dict[str, int]:
    """Micro-batches of one update: the sampling copy's pass (the whole batch) and the policy's (per minibatch)."""
    everything = list(range(len(samples)))
    parts = [sorted(everything[k::minibatches]) for k in range(minibatches)]
    return {"copy_pass": len(grpo.micro_batches(everything, samples)),
            "policy_pass": sum(len(grpo.micro_batches(p, samples)) for p in parts if p)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, help="a Hugging Face checkpoint directory (config and tokenizer at least)")
    p.add_argument("--random-init", action="store_true", help="a seeded random init of the model's config")
    p.add_argument("--data", type=Path, help="the offline alfworld public folder (default: the harness's)")
    p.add_argument("--goals", type=int, default=8, help="training games per update (the agent's default: 8)")
    p.add_argument("--group", type=int, default=8, help="episodes per game (the agent's default: 8)")
    p.add_argument("--max-steps", type=int, default=30, help="steps per episode (the fourth pass: 15-38 mean)")
    p.add_argument("--updates", type=int, default=3, help="updates per setting, on the same batch")
    p.add_argument("--settings", nargs="+", default=["default", "micro_tokens=4096", "micro_tokens=8192",
                                                     "micro_tokens=12288"], help="the first is the ratios' base")
    p.add_argument("--baseline", type=Path, help="another version of grpo_env_torch.py (e.g. main's) whose update "
                   "the settings named baseline:... run, on the same batch, model and sampler")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: a CPU check of the whole path")
    p.add_argument("--plan-only", action="store_true", help="the batch and each setting's tokens, no update run")
    p.add_argument("--out", type=Path, help="JSON lines, one per update, written as they come")
    p.add_argument("--deadline-s", type=float, default=0, help="start no further setting past this many seconds")
    args = p.parse_args(argv)
    settings = [(text, parse_setting(text)) for text in args.settings]
    if any(text.startswith("baseline:") for text in args.settings) and args.baseline is None:
        raise SystemExit("a baseline:... setting needs --baseline FILE")
    if args.smoke:
        args.goals, args.group, args.max_steps, args.updates = 2, 2, 3, 1

    with workspace_modules() as (grpo_env_torch, sft_grpo_session):
        return run(args, settings, grpo_env_torch, sft_grpo_session.Knobs)


def run(args, settings, grpo_env_torch, Knobs) -> int:  # noqa: N803 - the class
    import torch

    if args.data is None:
        from a2rl_bench.benchmarks import get_task

        args.data = get_task("alfworld").prepare("offline").public_dir
    device = "cuda" if torch.cuda.is_available() else "cpu"
    envlib = grpo_env_torch.import_envlib(args.data)
    knobs = Knobs.from_env({})
    schedule = knobs.schedule(grpo_env_torch)
    schedule = type(schedule)(**{**schedule.__dict__, "kl_target": 0.0})  # every minibatch taken: the full work
    model, tokenizer = load_model(args.model, args.random_init, device)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    grpo = grpo_env_torch.GRPOEnv(
        model, tokenizer, envlib, "alfworld", args.data, lr=knobs.grpo_lr, goals_per_step=args.goals,
        group_size=args.group, max_episode_steps=args.max_steps, temperature=knobs.temperature,
        loop_penalty=knobs.loop_penalty, invalid_penalty=knobs.invalid_penalty, seed=0, engine=knobs.rollout_engine,
        max_samples=knobs.max_samples, micro_tokens=knobs.micro_tokens, schedule=schedule,
    )  # fmt: skip
    defaults = {name: getattr(grpo, name) for name in SETTINGS}
    goals = random.Random(0).sample(grpo.goals, min(args.goals, len(grpo.goals)))
    rollouts = grpo_env_torch.play(envlib, "alfworld", args.data, [g for g in goals for _ in range(args.group)],
                                   scripted_sampler(tokenizer, envlib.STOP, random.Random(0)), args.max_steps, 0)
    for i, r in enumerate(rollouts):  # returns by rule: half of each group won (a group with a signal)
        r.reward, r.won = float(i % args.group < args.group // 2), i % args.group < args.group // 2
    grpo.rng = random.Random(0)
    samples = grpo.update_samples(rollouts)
    if hasattr(grpo.sample, "copy"):  # the engine's cache held as after real rollouts
        grpo.sample(_conversations(envlib, args.data, goals, 64))
    prompt_lengths = sorted(len(s[0]) for s in samples)
    facts = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "model": args.model.name,
        "weights": "random init" if args.random_init else "loaded",
        "params": sum(p.numel() for p in model.parameters()), "attention": model.config._attn_implementation,
        "sampler": type(grpo.sample).__name__, "episodes": len(rollouts),
        "mean_steps": round(sum(len(r.steps) for r in rollouts) / len(rollouts), 1), "samples": len(samples),
        "action_tokens": sum(len(s[1]) for s in samples),
        "prompt_tokens_mean": round(sum(prompt_lengths) / len(prompt_lengths), 1),
        "prompt_tokens_max": prompt_lengths[-1], "epochs": schedule.epochs, "minibatches": schedule.minibatches,
        "defaults": defaults,
    }  # fmt: skip
    emit = _emitter(args.out)
    emit(facts)
    t_start = time.monotonic()
    classes = {False: type(grpo), True: args.baseline and load_baseline(args.baseline).GRPOEnv}
    timer = PassTimer(grpo, device)
    rows = []
    if not args.plan_only:  # one untimed update first: allocator, kernels, the optimizer's state
        grpo.update(samples)
    for text, setting in settings:
        if args.deadline_s and time.monotonic() - t_start > args.deadline_s:
            print(f"deadline: settings from {text!r} on not run", flush=True)
            break
        grpo.__class__ = classes[text.startswith("baseline:")]  # the same instance, that version's methods
        model.load_state_dict(start)
        for name, value in {**defaults, **setting}.items():
            setattr(grpo, name, value)
        grpo.optimizer = torch.optim.AdamW(model.parameters(), lr=knobs.grpo_lr, weight_decay=0.0)
        grpo.optimizer_steps, grpo.lr_scale, grpo.rng = 0, 1.0, random.Random(0)
        grpo.weights_changed()
        tokens = padded_tokens(grpo, samples, schedule.minibatches)
        if args.plan_only:
            print(json.dumps({"setting": text, "tokens": tokens,
                              "micro_batches": micro_batch_counts(grpo, samples, schedule.minibatches)}), flush=True)
        for update in range(1, 0 if args.plan_only else args.updates + 1):
            held = torch.cuda.memory_allocated() / 2**30 if device == "cuda" else None
            if device == "cuda":
                torch.cuda.synchronize()
            t0, timer.seconds = time.perf_counter(), 0.0
            stats = grpo.update(samples)
            if device == "cuda":
                torch.cuda.synchronize()
            row = {"setting": text, **{n: getattr(grpo, n) for n in SETTINGS}, "update": update,
                   "seconds": round(time.perf_counter() - t0, 3), "tokens": tokens,
                   "peak_gib": stats.peak_gib if device == "cuda" else None,
                   "held_before_gib": None if held is None else round(held, 2),
                   "micro_batches": micro_batch_counts(grpo, samples, schedule.minibatches),
                   "copy_pass_s": round(timer.seconds, 3), "peak_rss_gib": peak_rss_gib(), "loss": stats.loss,
                   "optimizer_steps": stats.optimizer_steps}  # fmt: skip
            grpo.weights_changed()  # the copy follows, as after a real update
            rows.append(row)
            emit(row)
    if rows:
        print(f"\n{table(rows)}", flush=True)
    return 0


def _emitter(out: Path | None):
    """Prints each row and appends it to `out` at once (a run cut short keeps what it measured)."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("")

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        if out is not None:
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    return emit


def _conversations(envlib, data: Path, goals: list[dict], n: int) -> list[list[dict]]:
    """`n` first-step prompts of the batch's games (for the engine's one warm-up call)."""
    make_env, prompter = envlib.make_env("alfworld", data), envlib.prompter("alfworld")
    firsts = [(g, make_env().reset(g, seed=0)[0]) for g in goals]
    return [prompter(g, obs, []) for g, obs in (firsts * n)[:n]]


def table(rows: list[dict]) -> str:
    """Per setting: mean seconds per update after the first (the first too when there is one), peak memory, and
    each as a ratio to the first setting's."""
    lines = ["| setting | micro_tokens | chunk_rows | updates | s / update (mean) | of which the copy's pass | "
             "x faster | peak GiB | x memory | padded tokens / update |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    base = None
    for text in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == text]
        timed = mine[1:] or mine
        s = sum(r["seconds"] for r in timed) / len(timed)
        peaks = [r["peak_gib"] for r in mine if r["peak_gib"] is not None]
        peak = max(peaks) if peaks else None
        base = base or (s, peak)
        speed = f"{base[0] / s:.2f}" if s else "-"
        mem = f"{peak / base[1]:.2f}" if peak and base[1] else "-"
        copy = sum(r["copy_pass_s"] for r in timed) / len(timed)
        lines.append(f"| {text} | {mine[0]['micro_tokens']} | {mine[0]['chunk_rows']} | {len(timed)} of {len(mine)} "
                     f"| {s:.2f} | {copy:.2f} | {speed} | {'-' if peak is None else peak} | {mem} "
                     f"| {mine[0]['tokens']} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
