"""RL only, the fast loop for tuning: from one fixed SFT checkpoint, N updates of GRPO, GiGPO and "none" (no
update: the frozen policy, whose wins per update show the sampling noise), for each rollout seed, side by side
on one card.

    python bench/bench_rl_only.py MODEL [--sft CKPT] [--updates 12] [--val-every 4] [--seeds 0 1 2] [--out F]
    BENCH_SCRIPT=bench/bench_rl_only.py bash bench/gpu_alfworld.sh MODEL_PARTS... [OPTIONS]   # on the GPU
    python bench/bench_rl_only.py TINY_MODEL_DIR --smoke          # CPU check with the tests' tiny model
    python bench/bench_rl_only.py MODEL --holdout 0.2 --arms none grpo grpo@seen \
        grpo:A2RL_GRPO_GOAL_DRAW=learnability                     # RL on games SFT never saw, against seen ones
    python bench/bench_rl_only.py MODEL --sft-s 300 --sft-anneal-s 120 --arms none grpo \
        grpo:A2RL_GRPO_GOAL_DRAW=learnability,A2RL_GRPO_SWEEP=1   # from a converged SFT; each goal played once first
    python bench/bench_rl_only.py MODEL --sft-s 300 --sft-anneal-s 120 --arms none grpo \
        grpo:A2RL_GRPO_REF_KL=0.05 --updates 24                    # a KL term anchoring RL to the SFT checkpoint

MODEL is a Hugging Face checkpoint directory (on the GPU: the converted SmolLM2-135M). Without `--sft`, the
agent's own SFT data (the offline alfworld worked examples plus its searching demonstrations built from the
training games, `sft_grpo_session.sft_examples`) trains the checkpoint first (`--sft-steps` at the agent's
defaults), once, in the work folder. Each arm and rollout seed starts from that checkpoint with the agent's own
code (`grpo_env_torch.GRPOEnv`, the knobs' defaults unless overridden) and records per update the training
episodes won (of goals x group), the update's clip fraction, approximate KL, entropy, minibatches taken, seconds
and the process's peak GPU memory (`torch.cuda.max_memory_allocated`), every `--val-every` updates the policy's
greedy win rate on the validation games, and after the last update the last checkpoint's greedy win rate on the
hidden test games (both through the evaluator's environment, prompts and step limit, played by
`grpo_env_torch.play`: not the grader's own evaluation, the same games), each game won or not (so that the
table pairs each arm with the frozen one on the same games: exact McNemar). Every (arm, seed) is its own process,
round-robin over the visible cards (`--sequential` for one after another in this process). Output: one JSON
line per update per arm and seed (`--out`), then a table.

An arm is `ALGORITHM[@GOALS][:A2RL_X=V,...]`: `none`, `grpo` or `gigpo`; the training games it plays, `held` (the
games `--holdout` kept out of SFT, as the agent does with `A2RL_GRPO_HOLDOUT`; the default when `--holdout` is
given), `seen` (the games SFT trained on) or `all` (the default without `--holdout`); and knob overrides for this
arm alone, after `--env`'s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ARMS = ("grpo", "gigpo", "none")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, nargs="+", help="base model: a Hugging Face checkpoint directory, a .gguf "
                   "file or its parts in order (converted once, as bench/gpu_alfworld.py does)")
    p.add_argument("--sft", type=Path, help="the SFT checkpoint to start from (default: made here)")
    p.add_argument("--sft-steps", type=int, default=300, help="SFT optimizer steps when no --sft is given")
    p.add_argument("--sft-s", type=float, default=3600, help="SFT seconds at most when no --sft is given")
    p.add_argument("--sft-anneal-s", type=float, default=0.0, help="then SFT this many seconds more at half the rate "
                   "(the agent's annealed rounds), for a stronger checkpoint")
    p.add_argument("--sft-anneal-steps", type=int, default=0,
                   help="the anneal's optimizer steps at most (0: --sft-steps). With --sft-steps, and both time limits "
                   "high, the checkpoint's step counts do not follow the card's speed: the same SFT 300 s + 120 s made "
                   "1,013 + 495 steps (90%% hidden) and 1,307 + 537 (77%%) on two H200 leases")
    p.add_argument("--no-search-demos", action="store_true", help="SFT on the worked examples alone")
    p.add_argument("--updates", type=int, default=12)
    p.add_argument("--val-every", type=int, default=4, help="validation every this many updates (and at 0)")
    p.add_argument("--val-limit", type=int, default=0, help="validation games (0: all 60)")
    p.add_argument("--val-max-steps", type=int, default=0, help="validation step limit (0: the evaluator's, 50)")
    p.add_argument("--test-limit", type=int, default=0, help="hidden test games for the last checkpoint (0: all)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), type=arm_spec,
                   help="ALGORITHM[@held|@seen|@all][:A2RL_X=V,...] (see above)")
    p.add_argument("--holdout", type=float, default=0.0, help="share of the training games kept out of SFT for RL "
                   "(the agent's A2RL_GRPO_HOLDOUT, drawn with --seed)")
    p.add_argument("--env", nargs="*", default=[], metavar="A2RL_GRPO_X=V", help="knob overrides for the RL arms")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="rollout seeds (one run each)")
    p.add_argument("--seed", type=int, default=0, help="the SFT checkpoint's seed")
    p.add_argument("--sequential", action="store_true", help="arms one after another in this process")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: a CPU check of the whole path")
    p.add_argument("--out", type=Path, default=Path("rl_only.jsonl"))
    p.add_argument("--work", type=Path, default=Path("/tmp/a2rl-rl-only"), help="the SFT checkpoint, the model")
    p.add_argument("--arm", type=arm_spec, help=argparse.SUPPRESS)  # one arm, in a child process
    p.add_argument("--arm-seed", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.sft_steps, args.updates, args.val_every, args.val_limit, args.val_max_steps = 2, 2, 1, 2, 2
        args.test_limit = 2
        args.env = ["A2RL_GRPO_GOALS_PER_STEP=2", "A2RL_GRPO_NUM_GENERATIONS=2", "A2RL_GRPO_MAX_EPISODE_STEPS=2",
                    "A2RL_GRPO_MAX_SAMPLES=16", *args.env]  # fmt: skip
    return args


GOAL_SETS = ("held", "seen", "all")


def arm_spec(text: str) -> str:
    """An arm as given (`ALGORITHM[@GOALS][:A2RL_X=V,...]`), checked: argparse's type for `--arms`."""
    base, _, knobs = text.partition(":")
    algorithm, _, goals = base.partition("@")
    if algorithm not in ARMS or (goals and goals not in GOAL_SETS):
        raise argparse.ArgumentTypeError(f"{text!r}: want one of {ARMS}, then @{'/@'.join(GOAL_SETS)} or nothing")
    if knobs and not all(kv.startswith("A2RL_") and "=" in kv for kv in knobs.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r}: knob overrides are A2RL_X=V, comma-separated")
    return text


def parse_arm(text: str) -> tuple[str, str, dict[str, str]]:
    """(algorithm, goal set or "", knob overrides) of an arm spec."""
    base, _, knobs = text.partition(":")
    algorithm, _, goals = base.partition("@")
    return algorithm, goals, dict(kv.split("=", 1) for kv in knobs.split(",") if kv)


def held_out(public: Path, args) -> frozenset[str]:
    """The training games `--holdout` keeps out of SFT, drawn as the agent draws them (`A2RL_GRPO_HOLDOUT`)."""
    from a2rl_bench.agents.reference_sft_grpo import grpo_env_torch
    from a2rl_bench.agents.reference_sft_grpo.sft_grpo_session import held_out_games

    ids = [str(g.get("id")) for g in grpo_env_torch.import_envlib(public).load_goals(public)]
    return held_out_games(ids, args.holdout, args.seed)


def arm_goals(goals: str, held: frozenset[str], every: list[str]) -> frozenset[str] | None:
    """The training-goal ids an arm plays (None: all of them)."""
    goals = goals or ("held" if held else "all")
    if goals == "all":
        return None
    if not held:
        raise SystemExit(f"an arm @{goals} needs --holdout")
    return held if goals == "held" else frozenset(every) - held


def load(path: Path):
    from bench_rollouts import load as load_on_device  # this folder is on the path: the script's own

    model, tokenizer, _ = load_on_device(path)
    return model, tokenizer


def make_sft(args, public: Path, knobs) -> Path:
    """A short SFT on the worked examples, saved once under the out folder (reused when already there)."""
    from a2rl_bench.agents.reference_sft.train_sft import save_checkpoint
    from a2rl_bench.agents.reference_sft_grpo import sft_torch
    from a2rl_bench.agents.reference_sft_grpo.sft_grpo_session import sft_examples

    search = not args.no_search_demos
    held = held_out(public, args)
    out = args.work / (f"sft-{args.sft_steps}-steps-seed-{args.seed}{'-search' if search else ''}"
                       + (f"-holdout-{args.holdout:g}" if held else "")
                       + (f"-anneal-{args.sft_anneal_s:g}s" if args.sft_anneal_s else "")
                       + (f"-{args.sft_anneal_steps}-steps" if args.sft_anneal_s and args.sft_anneal_steps
                          else ""))  # fmt: skip
    if (out / "model.safetensors").is_file():
        return out
    model, tokenizer = load(args.model)
    examples, rows = sft_examples(public, public / "sft.jsonl", "alfworld", tokenizer, knobs.sft_max_length, search,
                                  exclude=held)  # fmt: skip
    sft = sft_torch.SFTRounds(model, tokenizer, examples, lr=knobs.sft_lr, batch_size=knobs.sft_batch_size,
                              seed=args.seed)  # fmt: skip
    stats = sft.train(seconds=args.sft_s, max_steps=args.sft_steps)
    annealed = None
    if args.sft_anneal_s > 0:
        sft.set_lr(sft.lr / 2)
        annealed = sft.train(seconds=args.sft_anneal_s, max_steps=args.sft_anneal_steps or args.sft_steps)
    save_checkpoint(model, tokenizer, out)
    print(json.dumps({"sft": str(out), "steps": stats.steps, "examples": len(examples), "of": rows,
                      "loss": round(stats.loss, 4), "train_s": round(stats.train_s, 1), "held_out": len(held)}
                     | ({"anneal_steps": annealed.steps, "anneal_loss": round(annealed.loss, 4),
                         "anneal_s": round(annealed.train_s, 1)} if annealed else {})),
          flush=True)  # fmt: skip
    return out


def validation(grpo_env_torch, envlib, public: Path, goals: list[dict], model, tokenizer, max_steps: int) -> str:
    """Each game won (1) or not (0), in the games' order: per game, so that arms pair on the same games."""
    sample = grpo_env_torch.greedy_sampler(model, tokenizer, max_new_tokens=32, stop=envlib.STOP)
    steps = max_steps or envlib.MAX_STEPS["alfworld"]
    return "".join("1" if r.won else "0" for r in grpo_env_torch.play(envlib, "alfworld", public, goals, sample, steps,
                                                                        seed=0))  # fmt: skip


def scored(split: str, games: str) -> dict:
    """A row's fields for one greedy evaluation: games won, games played, and which (a string of 0/1)."""
    return {f"{split}_won": games.count("1"), f"{split}_n": len(games), f"{split}_games": games}


def _games(public: Path, split: str, limit: int) -> list[dict]:
    path = public.parent / "private" / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()][: limit or None]


def peak_gib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def run_arm(args, arm: str, seed: int, sft: Path, public: Path) -> None:
    """N updates of one arm and rollout seed from the SFT checkpoint, one JSON line per update to `args.out`."""
    import os

    from a2rl_bench.agents.reference_sft_grpo import grpo_env_torch
    from a2rl_bench.agents.reference_sft_grpo.sft_grpo_session import Knobs

    algorithm, goals, overrides = parse_arm(arm)
    knobs = Knobs.from_env({**os.environ, **dict(kv.split("=", 1) for kv in args.env), **overrides})
    envlib = grpo_env_torch.import_envlib(public)
    every = [str(g.get("id")) for g in envlib.load_goals(public)]
    goal_ids = arm_goals(goals, held_out(public, args), every)
    val_goals = _games(public, "validation", args.val_limit)
    model, tokenizer = load(sft)
    grpo = grpo_env_torch.GRPOEnv(
        model, tokenizer, envlib, "alfworld", public, lr=knobs.grpo_lr, goals_per_step=knobs.goals_per_step,
        group_size=knobs.group_size, max_episode_steps=knobs.max_episode_steps, temperature=knobs.temperature,
        loop_penalty=knobs.loop_penalty, invalid_penalty=knobs.invalid_penalty,
        algorithm=algorithm if algorithm != "none" else "grpo", gamma=knobs.gamma, seed=seed,
        engine=knobs.rollout_engine, max_samples=knobs.max_samples, micro_tokens=knobs.micro_tokens,
        schedule=knobs.schedule(grpo_env_torch), goal_draw=knobs.goal_draw, goal_ids=goal_ids,
        sweep=knobs.goal_sweep,
    )  # fmt: skip
    t0 = time.monotonic()
    with args.out.open("a", encoding="utf-8") as f:

        def emit(row: dict) -> None:
            row = {"arm": arm, "seed": seed, "goals": len(grpo.goals), "goal_draw": knobs.goal_draw,
                   "t_s": round(time.monotonic() - t0, 1), **row}  # fmt: skip
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row), flush=True)

        def val() -> dict:
            return scored("val", validation(grpo_env_torch, envlib, public, val_goals, model, tokenizer,
                                            args.val_max_steps))  # fmt: skip

        emit({"update": 0, **val()})
        if grpo.sweep_pending:  # A2RL_GRPO_SWEEP: every goal once, before the first update (its own row)
            started = time.monotonic()
            grpo.sweep_if_pending()
            draw = grpo.goal_draw
            emit({"update": 0, "sweep": sum(draw.episodes), "wins": sum(draw.episodes) - sum(draw.losses),
                  "sweep_s": round(time.monotonic() - started, 2)})  # fmt: skip
        for update in range(1, args.updates + 1):
            if algorithm == "none":  # the frozen policy: rollouts only
                started = time.monotonic()
                rollouts = grpo.rollouts()
                row = {"episodes": len(rollouts), "wins": sum(r.won for r in rollouts),
                       "rollout_s": round(time.monotonic() - started, 2)}  # fmt: skip
            else:
                stats = grpo.grpo_step()
                row = {"episodes": stats.episodes, "wins": stats.wins, "rollout_s": stats.rollout_s,
                       "update_s": stats.update_s, "samples": stats.samples, "mean_steps": stats.mean_steps,
                       "optimizer_steps": stats.update.optimizer_steps, "clip_fraction": stats.update.clip_fraction,
                       "approx_kl": stats.update.approx_kl, "entropy": stats.update.entropy, "lr": stats.update.lr,
                       "minibatches_used": stats.update.minibatches_used, "kl_stopped": stats.update.kl_stopped,
                       "entropy_alarm": stats.entropy_alarm, "cut": stats.cut}  # fmt: skip
                if stats.update.ref_kl is not None:  # A2RL_GRPO_REF_KL: how far from the SFT checkpoint
                    row["ref_kl"] = stats.update.ref_kl
            row["max_memory_gib"] = peak_gib()
            if update % args.val_every == 0 or update == args.updates:
                row |= val()
            emit({"update": update, **row})
        test_goals = _games(public, "test", args.test_limit)
        emit({"update": args.updates, "final": True, "max_memory_gib": peak_gib(),
              **scored("test", validation(grpo_env_torch, envlib, public, test_goals, model, tokenizer,
                                          args.val_max_steps))})  # fmt: skip


def against_frozen(rows: list[dict], mine: dict, split: str) -> str:
    """The last evaluation of `split` in `mine` (a final row for test, else the last validation) against the frozen
    arm's on the same games: the difference in points with its paired 95% interval (exact McNemar), or "-"."""
    from a2rl_bench.summary.intervals import paired_item_interval

    key = f"{split}_games"
    frozen = next((r for r in rows if parse_arm(r["arm"])[0] == "none" and r.get(key)
                   and r["update"] == mine["update"] and bool(r.get("final")) == bool(mine.get("final"))),
                  None)  # fmt: skip
    if frozen is None or not mine.get(key) or len(frozen[key]) != len(mine[key]):
        return "-"
    i = paired_item_interval([int(c) for c in frozen[key]], [int(c) for c in mine[key]])
    return f"{i.estimate:+.1f} [{i.low:+.1f}, {i.high:+.1f}] p={i.p_value:.2g} (n={i.n})"


def table(rows: list[dict]) -> str:
    """Per arm and seed: training wins per update (first three against last three), seconds per update, peak
    memory, the validation scores, the last checkpoint's hidden-test score, and the last validation and test
    against the frozen arm's on the same games (paired)."""
    lines = ["| arm | seed | wins per update | first 3 -> last 3 updates (Δ ± 95% CI, n episodes) | s / update | "
             "peak GiB | validation (won/n @ update) | test (last) | last validation - frozen (points, paired) | "
             "test - frozen (points, paired) |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in dict.fromkeys(r["arm"] for r in rows):  # in the order they ran
        for seed in sorted({r.get("seed", 0) for r in rows if r["arm"] == arm}):
            mine = sorted((r for r in rows if r["arm"] == arm and r.get("seed", 0) == seed and not r.get("final")),
                          key=lambda r: r["update"])  # fmt: skip
            final = next((r for r in rows if r["arm"] == arm and r.get("seed", 0) == seed and r.get("final")), {})
            trained = [r for r in mine if "episodes" in r]  # updates (a sweep row has wins but is no update)
            wins = ", ".join(f"{r['wins']}" for r in trained)
            k = min(3, len(trained) // 2)  # first k against last k updates, never overlapping
            first, last = trained[:k], trained[len(trained) - k :]
            delta = "-"
            if first and last:
                (a, n), (b, m) = ((sum(r["wins"] for r in x), sum(r["episodes"] for r in x)) for x in (first, last))
                p, q = a / n, b / m
                se = math.sqrt(p * (1 - p) / n + q * (1 - q) / m)  # Wald, episodes as independent (they are not quite)
                delta = f"{100 * p:.1f}% -> {100 * q:.1f}% ({100 * (q - p):+.1f} ± {196 * se:.1f}, n={n}, {m})"
            timed = [r["update_s"] for r in trained if "update_s" in r]
            per_update = f"{sum(timed) / len(timed):.1f} (n={len(timed)})" if timed else "-"
            peak = max((r["max_memory_gib"] for r in mine + [final] if r.get("max_memory_gib") is not None),
                       default=None)  # fmt: skip
            val = ", ".join(f"{r['val_won']}/{r['val_n']}@{r['update']}" for r in mine if "val_won" in r)
            test = f"{final['test_won']}/{final['test_n']}" if "test_won" in final else "-"
            last_val = next((r for r in reversed(mine) if "val_won" in r), None)
            paired = ["-", "-"] if parse_arm(arm)[0] == "none" else [
                against_frozen(rows, last_val, "val") if last_val else "-",
                against_frozen(rows, final, "test") if final else "-"]  # fmt: skip
            sweep = next((r for r in mine if "sweep" in r), None)
            if sweep:
                wins = f"sweep {sweep['wins']}/{sweep['sweep']}; {wins}"
            lines.append(f"| {arm} | {seed} | {wins} (of {trained[0]['episodes'] if trained else '-'}) | {delta} | "
                         f"{per_update} | {'-' if peak is None else peak} | {val} | {test} | {paired[0]} | "
                         f"{paired[1]} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from a2rl_bench.agents.reference_sft_grpo.sft_grpo_session import Knobs
    from a2rl_bench.benchmarks import get_task

    public = get_task("alfworld").prepare("offline").public_dir
    if args.arm:  # a child: one arm and seed
        run_arm(args, args.arm, args.arm_seed, args.sft, public)
        return 0
    from gpu_alfworld import model_dir

    given = len(args.model)
    args.model = model_dir(args.model, args.work, time.monotonic())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.unlink(missing_ok=True)
    sft = args.sft or make_sft(args, public, Knobs.from_env({}))
    release_cached_gpu_memory()
    t0 = time.monotonic()
    runs = [(arm, seed) for arm in args.arms for seed in args.seeds]
    if args.sequential:
        for arm, seed in runs:
            run_arm(args, arm, seed, sft, public)
    else:
        options = (argv if argv is not None else sys.argv[1:])[given:]  # the model parts first, as parsed
        passed = [str(args.model), *(a for a in options if a != "--sequential")]
        parts = {run: args.out.with_suffix(f".arm{i}-seed{run[1]}.jsonl") for i, run in enumerate(runs)}
        for part in parts.values():
            part.unlink(missing_ok=True)
        cards = cards_for(len(runs))
        children = [subprocess.Popen([sys.executable, __file__, *passed, "--sft", str(sft), "--arm", arm,
                                      "--arm-seed", str(seed), "--out", str(parts[arm, seed])],
                                     env=dict(os.environ, CUDA_VISIBLE_DEVICES=card) if card else None)
                    for (arm, seed), card in zip(runs, cards)]  # fmt: skip
        print(f"{len(runs)} runs on cards {cards}", flush=True)
        codes = [c.wait() for c in children]
        with args.out.open("a", encoding="utf-8") as f:
            for part in parts.values():
                if part.is_file():
                    f.write(part.read_text())
        if any(codes):
            print(f"runs exited {dict(zip(runs, codes))}", file=sys.stderr)
    rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    print(f"\nRL only from {sft}, {args.updates} updates, seeds {args.seeds}, {time.monotonic() - t0:.0f} s\n\n"
          f"{table(rows)}", flush=True)  # fmt: skip
    return 0


def release_cached_gpu_memory() -> None:
    """Give the SFT's cached GPU blocks back before the arms start: this process only waits for its children, and
    it held 32.6 GiB of a card idle for the whole bench (BENCHMARKS.md "RL, eleventh pass"), enough to run runs
    beside it out of memory."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cards_for(n: int, visible: str | None = None, count: int | None = None) -> list[str | None]:
    """The card each of `n` child runs uses: round-robin over the visible ones, so one bench spreads its arms
    over a machine's cards (None: the child inherits the parent's single card, or the CPU).

    >>> cards_for(4, "2,3", 2), cards_for(3, None, 2), cards_for(2, None, 1)
    (['2', '3', '2', '3'], ['0', '1', '0'], [None, None])
    """
    if count is None:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    ids = [c.strip() for c in visible.split(",") if c.strip()] if visible else [str(i) for i in range(count)]
    if count < 2 or len(ids) < 2:
        return [None] * n
    return [ids[i % len(ids)] for i in range(n)]


if __name__ == "__main__":
    sys.exit(main())
