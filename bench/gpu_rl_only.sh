#!/usr/bin/env bash
# The RL-only bench on one lent GPU (issue 42), in two calls back to back; see bench/bench_rl_only.py.
#
#   STASH=$HOME/rl-stash BASE=<checkout of the previous agent> bash bench/gpu_rl_only.sh a   # ~430 s
#   STASH=$HOME/rl-stash bash bench/gpu_rl_only.sh b                                         # ~460 s
#
# The model's two GGUF parts and the wheels are in $STASH (copied there by earlier calls, as in
# bench/gpu_alfworld_stage.sh). (a): peak GPU memory and seconds per update, the agent at $BASE against this
# checkout, one after the other from this checkout's SFT checkpoint (made here: the agent's SFT data with its
# searching demonstrations, 300 steps); GPU memory per process sampled by nvidia-smi for both,
# torch.cuda.max_memory_allocated from this checkout's bench. (b): from that checkpoint, GRPO over rollout
# seeds 0 1 2 and the frozen arm (one seed: its greedy scores do not depend on the rollout seed), four
# processes on the card, in the foreground (a run detached from a call does not survive the next call: the
# tool replaces the checkout under it).
set -uo pipefail
cd "$(dirname "$0")/.."
STASH=${STASH:?set STASH}
OUT=${OUT:-$PWD/gpu-out}
W=$STASH/work
PARTS="$STASH/model.gguf.part00 $STASH/model.gguf.part01"
export BENCH_SCRIPT=bench/bench_rl_only.py WHEELS="$STASH/whl" OUT
mkdir -p "$W" "$OUT"
UPDATES_B=${UPDATES_B:-6}
t0=$(date +%s)

if [ "$1" = a ]; then
  BASE=${BASE:?set BASE}
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -l 1 > "$OUT/mem.csv" 2>/dev/null &
  w=$!
  bash bench/gpu_alfworld.sh $PARTS --arms grpo --seeds 0 --updates 3 --val-every 3 --val-limit 8 --test-limit 8 \
    --work "$W" --out "$OUT/new.jsonl" > "$OUT/new.log" 2>&1
  echo "new done at $(( $(date +%s) - t0 )) s" | tee -a "$OUT/mem.csv"
  sft=$(ls -d "$W"/sft-*-search 2>/dev/null | head -1)
  [ -n "$sft" ] || { echo "no SFT checkpoint made"; tail -20 "$OUT/new.log"; exit 3; }
  (cd "$BASE" && bash bench/gpu_alfworld.sh $PARTS --sft "$sft" --arms grpo --updates 3 --val-every 3 \
    --val-limit 8 --work "$W" --out "$OUT/old.jsonl" > "$OUT/old.log" 2>&1)
  kill "$w"
  echo "(a) done in $(( $(date +%s) - t0 )) s"
else
  bash bench/gpu_alfworld.sh --help > /dev/null 2>&1  # installs the wheels into $SITE once
  export PYTHONPATH=${SITE:-/tmp/a2rl-site}:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  sft=$(ls -d "$W"/sft-*-search | head -1)
  timeout 540 python3 bench/bench_rl_only.py $PARTS --sft "$sft" --arms grpo --seeds 0 1 2 --updates "$UPDATES_B" \
    --val-every "$UPDATES_B" --work "$W" --out "$OUT/rl.jsonl" > "$OUT/rl.log" 2>&1 &
  timeout 540 python3 bench/bench_rl_only.py $PARTS --sft "$sft" --arms none --seeds 0 --updates "$UPDATES_B" \
    --val-every "$UPDATES_B" --work "$W" --out "$OUT/frozen.jsonl" > "$OUT/frozen.log" 2>&1 &
  wait
  tail -8 "$OUT/rl.log"
  tail -5 "$OUT/frozen.log"
fi
