#!/usr/bin/env bash
# The RL-only bench (bench/bench_rl_only.py, issue 42) on one lent GPU, detached so that it outlives the calls.
#
# After the two staging calls of bench/gpu_alfworld_stage.sh's header (the model's GGUF parts and wheels in
# $STASH), a third call carries .gpu-3 and starts everything; later calls, back to back while the machine stays
# warm (~30 s after a call), wait on the runs and bring their rows back:
#
#   call 3, carry [".gpu-3"]:  S=$HOME/a2rl-stash; mkdir -p $S/whl3 && cp .gpu-3/whl/* $S/whl3/ && \
#                              STASH=$S ARMS_A="grpo:A2RL_GRPO_REF_KL=0.1 grpo" bash bench/gpu_rl_only.sh detach
#   calls 4-5:                 STASH=$HOME/a2rl-stash bash bench/gpu_rl_only.sh collect 540
#   last call:                 STASH=$HOME/a2rl-stash bash bench/gpu_rl_only.sh collect 500 && \
#                              tar -C $HOME/a2rl-stash -czf $OUT/rl.tgz out logs      # one file: fewer to copy back
#
# detach: copies this checkout outside the repository ($STASH/repo: the tool replaces the checkout under a detached
# process at the next call), installs the wheels, starts the CUDA MPS control daemon (the processes sharing the
# card run their kernels side by side, not in time slices), then starts, in the background, (a) SFT of the agent's
# own data (SFT_S seconds, then ANNEAL_S at half the rate; SFT_STEPS and ANNEAL_STEPS bound them by steps, so
# that the checkpoint does not follow the card's speed) and RL for each arm of ARMS_A over SEEDS, and (b) a
# waiter that, once the checkpoint is saved, starts the frozen arm (`none`, one seed: its greedy scores do not
# depend on the rollout seed) and ARMS_B (seed 0) from the same checkpoint. UPDATES updates each (default 12);
# 8 processes at 135M fit one H200 (11-14 GiB each) and 12 updates take ~800 s beside each other.
# collect [WAIT]: waits up to WAIT s for both benches' tables, then prints the time since the start, the logs'
# tails, the card's memory and the processes still running. Each bench prints its own table; one table of both
# (the arms beside the frozen one) is `bench_rl_only.table` of the rows of out/a.jsonl and out/b.jsonl (each merged
# from its per-arm files when its runs end).
set -uo pipefail
cd "$(dirname "$0")/.."
STASH=${STASH:?set STASH (e.g. $HOME/a2rl-stash)}
case "${1:-}" in
detach)
  R=$STASH/repo
  rm -rf "$R" "$STASH/out" "$STASH/logs"; mkdir -p "$R" "$STASH/out" "$STASH/logs" "$STASH/mps-log"
  cp -a . "$R/" && cd "$R"
  WHEELS="$STASH/whl $STASH/whl3" SITE=$STASH/site OUT=$STASH/logs BENCH_SCRIPT=bench/bench_rl_only.py \
    bash bench/gpu_alfworld.sh "$STASH/model.gguf.part00" --help > "$STASH/logs/install.log" 2>&1
  grep -m1 "wheels installed\|failed\|missing" "$STASH/logs/install.log"
  export PYTHONPATH=$STASH/site:$R HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false DO_NOT_TRACK=1
  CUDA_MPS_LOG_DIRECTORY=$STASH/mps-log nvidia-cuda-mps-control -d && echo "MPS control daemon started"
  parts="$STASH/model.gguf.part00 $STASH/model.gguf.part01"
  W=$STASH/work
  date +%s > "$STASH/logs/t0"
  # shellcheck disable=SC2086  # the arms and parts are word lists
  setsid nohup python3 bench/bench_rl_only.py $parts --sft-steps "${SFT_STEPS:-100000}" \
    --sft-s "${SFT_S:-300}" --sft-anneal-s "${ANNEAL_S:-120}" --sft-anneal-steps "${ANNEAL_STEPS:-0}" --updates "${UPDATES:-12}" --val-every 4 --arms ${ARMS_A:?set ARMS_A} \
    --seeds ${SEEDS:-0 1 2} --work "$W" --out "$STASH/out/a.jsonl" > "$STASH/logs/a.log" 2>&1 < /dev/null &
  setsid nohup bash -c "while ! grep -q '^{\"sft\"' '$STASH/logs/a.log'; do sleep 5; done
    ck=\$(ls -d '$W'/sft-*-steps-seed-0* | head -1); echo \"checkpoint \$ck at \$(date +%s)\"
    python3 bench/bench_rl_only.py $parts --sft \"\$ck\" --updates ${UPDATES:-12} --val-every 4 \
      --arms none ${ARMS_B:-} --seeds 0 --work '$W' --out '$STASH/out/b.jsonl'" > "$STASH/logs/b.log" 2>&1 < /dev/null &
  sleep 20; tail -3 "$STASH/logs/a.log"
  ;;
collect)
  wait_s=${2:-0}; t=$(date +%s)
  ended() { grep -q "^| " "$STASH/logs/a.log" 2>/dev/null && grep -q "^| " "$STASH/logs/b.log" 2>/dev/null; }
  while [ $(( $(date +%s) - t )) -lt "$wait_s" ] && ! ended; do sleep 10; done
  echo "$(( $(date +%s) - $(cat "$STASH/logs/t0") )) s since the start"
  for f in a b; do echo "== $f"; grep -v '^{"arm"' "$STASH/logs/$f.log" | tail -n 14
    grep '^{"arm"' "$STASH/logs/$f.log" | tail -n 2 | cut -c1-400; done  # the last rows: how far the runs are
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
  echo "bench processes running: $(pgrep -fc 'python3 bench/bench_rl_only' || true)"
  ;;
*)
  sed -n '2,25p' bench/gpu_rl_only.sh; exit 2  # the header
  ;;
esac
