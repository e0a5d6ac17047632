#!/usr/bin/env bash
# The RL-only bench on one lent GPU (issue 42), in two calls back to back; see bench/bench_rl_only.py.
#
#   STASH=$HOME/rl-stash BASE=<checkout of the previous agent> bash bench/gpu_rl_only.sh a   # call 1
#   STASH=$HOME/rl-stash bash bench/gpu_rl_only.sh b                                         # call 2
#
# The model's two GGUF parts and the wheels are in $STASH (copied there by earlier calls, as in
# bench/gpu_alfworld_stage.sh). Call 1: (a) peak GPU memory and seconds per update, the agent at $BASE against
# this checkout, one after the other from this checkout's SFT checkpoint (GPU memory sampled by nvidia-smi for
# both, torch.cuda.max_memory_allocated from this checkout's bench); then (b) the bench over rollout seeds
# (frozen arm and GRPO) started detached, and what it wrote so far copied to $OUT. Call 2 waits for (b) and
# copies its rows.
set -uo pipefail
cd "$(dirname "$0")/.."
STASH=${STASH:?set STASH}
OUT=${OUT:-$PWD/gpu-out}
W=$STASH/work
PARTS="$STASH/model.gguf.part00 $STASH/model.gguf.part01"
export BENCH_SCRIPT=bench/bench_rl_only.py WHEELS="$STASH/whl" OUT
mkdir -p "$W" "$OUT" "$STASH/b"
UPDATES_B=${UPDATES_B:-8}
LIMIT_S=${LIMIT_S:-560}
t0=$(date +%s)

watch_memory() {  # per-process GPU memory (MiB) every second, until killed
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -l 1 > "$1" 2>/dev/null
}

if [ "$1" = a ]; then
  BASE=${BASE:?set BASE}
  watch_memory "$OUT/new-mem.csv" & w=$!
  bash bench/gpu_alfworld.sh $PARTS --arms grpo --seeds 0 --updates 3 --val-every 3 --val-limit 8 --test-limit 8 \
    --work "$W" --out "$OUT/new.jsonl" > "$OUT/new.log" 2>&1
  kill $w
  sft=$(ls -d "$W"/sft-*-search 2>/dev/null | head -1)
  [ -n "$sft" ] || { echo "no SFT checkpoint made"; tail -20 "$OUT/new.log"; exit 3; }
  watch_memory "$OUT/old-mem.csv" & w=$!
  (cd "$BASE" && bash bench/gpu_alfworld.sh $PARTS --sft "$sft" --arms grpo --updates 3 --val-every 3 \
    --val-limit 8 --work "$W" --out "$OUT/old.jsonl" > "$OUT/old.log" 2>&1)
  kill $w
  echo "(a) done in $(( $(date +%s) - t0 )) s"
  setsid nohup bash bench/gpu_alfworld.sh $PARTS --sft "$sft" --arms grpo none --seeds 0 1 2 \
    --updates "$UPDATES_B" --val-every 4 --work "$W" --out "$STASH/b/rl_only.jsonl" > "$STASH/b/log" 2>&1 < /dev/null &
fi
while pgrep -f "bench_rl_only.py" > /dev/null && [ $(( $(date +%s) - t0 )) -lt "$LIMIT_S" ]; do sleep 10; done
cp -r "$STASH/b" "$OUT/" 2>/dev/null
pgrep -f "bench_rl_only.py" > /dev/null && echo "(b) still running after $(( $(date +%s) - t0 )) s" || echo "(b) finished"
tail -25 "$STASH/b/log" 2>/dev/null
