"""Route labels from code snapshots, and the mode check, on real training scripts (some run on the tiny model)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from a2rl_bench.grading.route_audit import (analyze_python, analyze_routes, check_mode, check_snapshot, combine_methods,
                                      route_label)
from a2rl_bench.agents import get_agent

# -- real training scripts, as an agent would write them (they read MODEL_PATH, DATA_PATH, OUTPUT_DIR) ------
SFT_TRL = '''\
"""Supervised fine-tuning on worked solutions."""
import json, os
from datasets import Dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

rows = [json.loads(l) for l in open(os.path.join(os.environ["DATA_PATH"], "train.jsonl"))]
data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}],
                           "completion": [{"role": "assistant", "content": r["answer"]}]} for r in rows])
args = SFTConfig(output_dir="/tmp/sft", max_steps=int(os.environ.get("STEPS", 100)), per_device_train_batch_size=2,
                 bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no", use_cpu=True)
trainer = SFTTrainer(model=os.environ["MODEL_PATH"], args=args, train_dataset=data,
                     peft_config=LoraConfig(r=4, target_modules="all-linear"))
trainer.train()
trainer.model.merge_and_unload().save_pretrained(os.path.join(os.environ["OUTPUT_DIR"], "v1"))
'''

GRPO_TRL = '''\
import json, os, re
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

def reward_correct(completions, target, **kwargs):
    numbers = [re.findall(r"-?\\d+", c[0]["content"]) for c in completions]
    return [1.0 if n and n[-1] == t else 0.0 for n, t in zip(numbers, target)]

rows = [json.loads(l) for l in open(os.path.join(os.environ["DATA_PATH"], "train.jsonl"))]
data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}], "target": r["target"]}
                          for r in rows])
args = GRPOConfig(output_dir="/tmp/grpo", max_steps=int(os.environ.get("STEPS", 50)), per_device_train_batch_size=4,
                  num_generations=4, max_completion_length=16, bf16=False, gradient_checkpointing=False,
                  report_to="none", save_strategy="no", use_cpu=True)
trainer = GRPOTrainer(model=os.environ["MODEL_PATH"], reward_funcs=reward_correct, args=args, train_dataset=data)
trainer.train()
trainer.save_model(os.path.join(os.environ["OUTPUT_DIR"], "v1"))
'''

DPO_TRL = '''\
import json, os
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

tok = AutoTokenizer.from_pretrained(os.environ["MODEL_PATH"])
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL_PATH"])
rows = [json.loads(l) for l in open(os.path.join(os.environ["DATA_PATH"], "train.jsonl"))]
pairs = Dataset.from_list([{"prompt": r["question"], "chosen": " The answer is " + r["target"],
                            "rejected": " The answer is " + str(int(r["target"]) + 1)} for r in rows])
args = DPOConfig(output_dir="/tmp/dpo", max_steps=int(os.environ.get("STEPS", 50)), per_device_train_batch_size=2,
                 max_length=96, bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no",
                 use_cpu=True, learning_rate=1e-3)
DPOTrainer(model=model, args=args, train_dataset=pairs, processing_class=tok).train()
model.save_pretrained(os.path.join(os.environ["OUTPUT_DIR"], "v1"))
tok.save_pretrained(os.path.join(os.environ["OUTPUT_DIR"], "v1"))
'''

# A hand-written GRPO loop (no TRL): group sampling, group-normalised advantages, policy-gradient loss.
HANDWRITTEN_GRPO = '''\
import json, os, re
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

tok = AutoTokenizer.from_pretrained(os.environ["MODEL_PATH"])
policy = AutoModelForCausalLM.from_pretrained(os.environ["MODEL_PATH"])
opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
rows = [json.loads(l) for l in open(os.path.join(os.environ["DATA_PATH"], "train.jsonl"))]
group_size = 4
for step, row in enumerate(rows[: int(os.environ.get("STEPS", 100))]):
    prompt = tok(row["question"], return_tensors="pt")
    n = prompt["input_ids"].shape[1]
    seqs = policy.generate(**prompt, do_sample=True, max_new_tokens=8, num_return_sequences=group_size,
                           pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(seqs[:, n:], skip_special_tokens=True)
    rewards = torch.tensor([1.0 if row["target"] in re.findall(r"\\d+", t) else 0.0 for t in texts])
    group_std = rewards.std()
    advantages = (rewards - rewards.mean()) / (group_std + 1e-4)
    logits = policy(seqs).logits[:, n - 1 : -1]
    log_probs = torch.log_softmax(logits, -1).gather(-1, seqs[:, n:, None]).squeeze(-1).sum(-1)
    loss = -(advantages * log_probs).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
policy.save_pretrained(os.path.join(os.environ["OUTPUT_DIR"], "v1"))
tok.save_pretrained(os.path.join(os.environ["OUTPUT_DIR"], "v1"))
'''

HANDWRITTEN_PPO = '''\
import torch
def ppo_loss(log_probs, old_log_probs, advantages, eps=0.2):
    ratio = torch.exp(log_probs - old_log_probs)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
    return -torch.min(ratio * advantages, clipped * advantages).mean()
def train(policy, batches, opt):
    for b in batches:
        loss = ppo_loss(b.log_probs, b.old_log_probs, b.advantages)
        loss.backward()
        opt.step()
'''

HANDWRITTEN_DPO = '''\
import torch.nn.functional as F
def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=0.1):
    logits = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(beta * logits).mean()
def train(batches, opt, f):
    for b in batches:
        loss = dpo_loss(*f(b))
        loss.backward()
        opt.step()
'''

HANDWRITTEN_SFT = '''\
import torch
def train(model, loader, opt):
    for batch in loader:
        out = model(input_ids=batch["input_ids"], labels=batch["labels"])
        out.loss.backward()
        opt.step()
        opt.zero_grad()
'''

COPY_BASE = '''\
import os, shutil
shutil.copytree(os.environ["MODEL_PATH"], os.path.join(os.environ["OUTPUT_DIR"], "v1"))
'''

PROSE_ONLY = '''\
"""Plan: try GRPOTrainer next, maybe DPOTrainer; run `trl grpo` later."""
NOTE = "GRPOTrainer would be better than SFTTrainer here"
# from trl import GRPOTrainer
print(NOTE)
'''


def snapshot(tmp_path: Path, files: dict[str, str]) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    for name, text in files.items():
        (code / name).parent.mkdir(parents=True, exist_ok=True)
        (code / name).write_text(text)
    return code


@pytest.mark.parametrize(
    ("files", "label"),
    [
        ({"train.py": SFT_TRL}, "SFT"),
        ({"train.py": GRPO_TRL}, "GRPO"),
        ({"train.py": DPO_TRL}, "DPO"),
        ({"sft.py": SFT_TRL, "rl.py": GRPO_TRL}, "SFT+RL"),  # SFT warm-up, then GRPO
        ({"sft.py": SFT_TRL, "pref.py": DPO_TRL}, "SFT+DPO"),
        ({"loop.py": HANDWRITTEN_GRPO}, "GRPO"),
        ({"ppo.py": HANDWRITTEN_PPO}, "PPO"),
        ({"dpo.py": HANDWRITTEN_DPO}, "DPO"),
        ({"loop.py": HANDWRITTEN_SFT}, "SFT"),
        ({"ppo.py": HANDWRITTEN_PPO, "grpo.py": GRPO_TRL}, "RL"),  # two RL methods
        ({"copy.py": COPY_BASE}, "copy"),
        ({"plan.py": PROSE_ONLY, "NOTES.md": "We used GRPOTrainer and `trl grpo`."}, "none"),
        ({"run.sh": "#!/bin/bash\n# trl sft would be simpler\ntrl dpo --model_name_or_path $MODEL_PATH\n"}, "DPO"),
        ({"go": "#!/bin/sh\ncp -r models/base output/v1\n"}, "copy"),
        ({"launch.py": 'import subprocess\nsubprocess.run(["trl", "grpo", "--config", "c.yaml"])\n'}, "GRPO"),
        ({"verl.py": 'import os\nos.system("python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo")'}, "GRPO"),
        ({"broken.py": "from trl import SFTTrainer\ntrainer = SFTTrainer(model=\n"}, "SFT"),  # does not parse
        ({"pkg/deep/x.py": "import trl\ntrl.RLOOTrainer(model='m')\n"}, "RLOO"),
        ({}, "none"),
    ],
    ids=lambda v: v if isinstance(v, str) else "+".join(v) or "empty",
)
def test_route_label_of_a_snapshot(tmp_path, files, label):
    assert route_label(snapshot(tmp_path, files)) == label


def test_a_notebook_is_read_as_code_and_shell(tmp_path):
    cells = [{"cell_type": "markdown", "source": ["We will use GRPOTrainer"]},
             {"cell_type": "code", "source": ["%pip install trl\n", "!trl sft --model_name_or_path m\n"]}]
    nb = {"cells": cells}
    assert route_label(snapshot(tmp_path, {"work.ipynb": json.dumps(nb)})) == "SFT"


def test_analysis_gives_evidence_with_file_and_line(tmp_path):
    analysis = analyze_routes(snapshot(tmp_path, {"sft.py": SFT_TRL, "rl.py": GRPO_TRL}))
    assert analysis.methods == ["GRPO", "SFT"] and analysis.files_scanned == 2
    assert {"method": "GRPO", "file": "rl.py", "line": 15, "what": "uses GRPOTrainer"} in analysis.evidence


def test_names_in_strings_and_comments_are_not_evidence():
    assert analyze_python(PROSE_ONLY) == []
    assert analyze_python('x = "from trl import SFTTrainer"\n') == []


@pytest.mark.parametrize(
    ("agent_id", "label", "files"),
    [
        ("reference-sft", "SFT", {"agent.py", "train_sft.py", "train_precision.py", "train_common.py"}),
        ("reference-grpo", "GRPO", {"agent.py", "train_grpo.py", "train_grpo_env.py", "round_loop.py",
                                    "train_precision.py", "train_common.py", "decode_engine.py"}),
        ("reference-sft-grpo", "SFT+RL", {"agent.py", "train_grpo.py", "train_grpo_env.py", "round_loop.py",
                                          "train_sft.py", "train_precision.py", "train_common.py",
                                          "sft_grpo_session.py", "sft_torch.py", "grpo_env_torch.py", "search_demos.py",
                                          "decode_engine.py"}),
        ("reference-sft-gigpo", "SFT+RL", {"agent.py", "train_grpo.py", "train_grpo_env.py", "round_loop.py",
                                           "train_sft.py", "train_precision.py", "train_common.py",
                                           "sft_grpo_session.py", "sft_torch.py", "grpo_env_torch.py",
                                           "search_demos.py", "decode_engine.py"}),
    ],
)
def test_reference_agents_code_gets_its_route(tmp_path, agent_id, label, files):
    (tmp_path / "code").mkdir()
    get_agent(agent_id).install(tmp_path)
    assert {p.name for p in (tmp_path / "code").iterdir()} == files
    # round_loop.py (reference-sft's loop) names SFTTrainer in its notes text: prose, not evidence.
    assert route_label(tmp_path / "code") == label


@pytest.mark.parametrize(
    ("mode", "label", "ok"),
    [
        ("free", "DPO", True), ("free", "none", True), ("multi", "SFT+RL", True),
        ("sft-only", "SFT", True), ("sft-only", "copy", True), ("sft-only", "none", True),
        ("sft-only", "GRPO", False), ("sft-only", "SFT+RL", False), ("sft-only", "DPO", False),
        ("sft-only", "SFT+DPO", False),
        ("rl-only", "GRPO", True), ("rl-only", "PPO", True), ("rl-only", "RLOO", True), ("rl-only", "RL", True),
        ("rl-only", "SFT+RL", True),  # an SFT warm-up before RL is allowed
        ("rl-only", "SFT", False), ("rl-only", "DPO", False), ("rl-only", "SFT+DPO", False),
        ("rl-only", "copy", False), ("rl-only", "none", False),
    ],
)  # fmt: skip
def test_check_mode(mode, label, ok):
    result = check_mode(mode, label)
    assert result.ok is ok and label in result.message


def test_dpo_satisfies_rl_only_only_when_asked():
    assert "preference optimisation" in check_mode("sft-only", "DPO").message
    refused = check_mode("rl-only", "DPO")
    assert not refused.ok and "DPO is offline preference optimisation" in refused.message
    assert check_mode("rl-only", "DPO", dpo_counts_as_rl=True).ok
    with pytest.raises(ValueError, match="unknown mode"):
        check_mode("rl-maybe", "GRPO")


def test_combine_methods():
    assert combine_methods(set()) == "none" and combine_methods(set(), copies_base_model=True) == "copy"
    assert combine_methods({"SFT", "copy"} - {"copy"}, copies_base_model=True) == "SFT"
    assert combine_methods({"GRPO", "DPO"}) == "GRPO"


# -- the fixtures are real: the DPO and hand-written GRPO scripts train the tiny model for real -------------
@pytest.fixture
def tiny_workspace(tmp_path, tiny_model_dir, monkeypatch) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": f"What is {i} plus 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}", "target": str(i + 1)}
            for i in range(4)]  # fmt: skip
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "output").mkdir()
    for k, v in {"MODEL_PATH": str(tiny_model_dir), "DATA_PATH": str(data), "OUTPUT_DIR": str(tmp_path / "output"),
                 "STEPS": "1"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    return tmp_path


@pytest.mark.parametrize(("script", "mode_ok"), [(DPO_TRL, {"rl-only": False, "sft-only": False}),
                                                 (HANDWRITTEN_GRPO, {"rl-only": True, "sft-only": False})],
                         ids=["trl-dpo", "handwritten-grpo"])  # fmt: skip
def test_fixture_scripts_really_train_and_their_snapshot_is_checked(tiny_workspace, script, mode_ok):
    code = snapshot(tiny_workspace, {"train.py": script})
    runpy.run_path(str(code / "train.py"), run_name="__main__")
    assert (tiny_workspace / "output" / "v1" / "config.json").is_file()
    for mode, ok in mode_ok.items():
        analysis, result = check_snapshot(code, mode)
        assert result.ok is ok, (analysis.label, result.message)


def test_generation_and_gradient_clipping_are_not_a_ppo_ratio():
    """`ratio` inside `generation` and `clip_grad_norm_` (gradient clipping) are no clipped policy-ratio loss."""
    src = (
        "import torch\n"
        "def step(model, opt, generation, advantages, group_std, logprobs):\n"
        "    loss = -(advantages * logprobs).mean()\n"
        "    loss.backward()\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    )
    assert [e.method for e in analyze_python(src)] == ["GRPO"]
    ppo = src.replace("loss = -(", "ratio = torch.exp(logprobs)\n    loss = -torch.clamp(ratio, 0.8, 1.2) * (")
    assert [e.method for e in analyze_python(ppo)] == ["PPO"]


def test_a_bounded_scan_stops_says_so_and_the_next_one_goes_on_without_rereading(tmp_path, monkeypatch):
    """Route scans in the grader (issue 24): bounded per scan (names, bytes, seconds), and incremental: a script
    analysed once is not read again while it is unchanged; a scan cut short says `complete=False`."""
    from a2rl_bench.grading import route_audit as routes

    code = tmp_path / "code"
    code.mkdir()
    for i in range(30):
        (code / f"m{i:02}.py").write_text("import os\n" * 50)
    (code / "train.py").write_text(GRPO_TRL)
    reads = []
    real = routes._analyze_entry
    monkeypatch.setattr(routes, "_analyze_entry", lambda e, *a: reads.append(e.rel) or real(e, *a))
    scanner = routes.RouteScanner(routes.ScanLimits(max_entries=1000, max_new_bytes=10 * 500, seconds=60))
    first = scanner.scan(code)
    assert not first.complete and first.left > 0 and len(reads) == first.files_scanned
    while not (analysis := scanner.scan(code)).complete:
        pass
    assert analysis.label == "GRPO" and sorted(reads) == sorted({*reads}), "a script was read twice"
    reads.clear()
    assert scanner.scan(code).label == "GRPO" and reads == []  # nothing changed: nothing read
    (code / "m00.py").write_text("print('changed')\n")
    scanner.scan(code)
    assert reads == ["m00.py"]
