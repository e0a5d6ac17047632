#!/usr/bin/env bash
# alfworld through the real flow on one GPU (issues #17, #16 item 5), unattended; see bench/gpu_alfworld.py.
#
#   bash bench/gpu_alfworld.sh MODEL [MODEL_PART ...] [OPTIONS of bench/gpu_alfworld.py]
#
# On the lent GPU machine (Python 3.12, the image's CUDA torch / transformers, no prefect or duckdb) the
# harness's missing packages come as wheels in $WHEELS (default .whl/). They are installed with --no-deps into
# $SITE and put first on PYTHONPATH; the image's torch stays in use. (A `venv --system-site-packages` would
# not see it: the image's python3 is itself a venv, /opt/torch/.venv, whose packages are not "system" ones.)
# The agent's processes get no PYTHONPATH and need only what the image has (torch, transformers, safetensors,
# numpy); the flow, the Prefect server and the grader's evaluation processes inherit it.
# CPU check with the installed packages and the test model: WHEELS= PY=.venv/bin/python bash bench/gpu_alfworld.sh
#   <tiny model dir> --val-limit 3 --test-limit 4 --eval-batch-size 8 --deadline-s 1200
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}            # one or more folders of wheels (space-separated), e.g. ".gpu/whl-a .gpu/whl-b"
SITE=${SITE:-/tmp/a2rl-site}
PY=${PY:-python3}
OUT=${OUT:-$PWD/gpu-out}
export OUT
mkdir -p "$OUT"
t0=$(date +%s)
# Staged carries (bench/gpu_alfworld_stage.sh) vanish when the machine went cold between calls: say so at once.
for a in "$@"; do
  case "$a" in -*) break ;; esac
  [ -e "$a" ] || { echo "model part $a is missing here (machine restarted since it was carried?)"; exit 4; }
done
wheels=()
for d in $WHEELS; do
  n_before=${#wheels[@]}
  for w in "$d"/*.whl; do [ -f "$w" ] && wheels+=("$w"); done
  if [ "$WHEELS" != ".whl" ] && [ ${#wheels[@]} -eq "$n_before" ]; then
    echo "no wheels in $d (machine restarted since it was carried?)"; exit 4
  fi
done
if [ ${#wheels[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" \
    > "$OUT/pip.log" 2>&1 || { echo "wheel install failed (see pip.log)"; tail -5 "$OUT/pip.log"; exit 3; }
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  echo "${#wheels[@]} wheels installed in $(( $(date +%s) - t0 )) s"
else
  echo "no wheels in $WHEELS: using the installed packages"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import importlib.metadata as m, prefect, duckdb, pandas, gguf, torch; m.version('alfworld'); print('imports ok; cuda', torch.cuda.is_available())" \
  2>&1 | tail -3 | tee "$OUT/imports.log"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
exec "$PY" "${BENCH_SCRIPT:-bench/gpu_alfworld.py}" "$@"   # BENCH_SCRIPT=bench/bench_rl_only.py: the RL-only bench
