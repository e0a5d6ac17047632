#!/usr/bin/env bash
# Prepare, on this machine, what bench/gpu_alfworld.sh needs on the lent GPU machine, in three carries of at
# most 64 MiB each (the tool's limit per call): the SmolLM2 GGUF (94 MiB) in two parts and the wheels of
# bench/gpu_alfworld_wheels.txt (69 MiB). Folders .gpu-1, .gpu-2, .gpu-3 (ignored by git: /.gpu*/ in
# .git/info/exclude). Then make three calls back to back while the machine stays warm (30 s after a call). A
# carried folder does not survive the next call that carries another one, so each call copies its carry to a
# folder outside the repository first, $STASH (e.g. STASH=$HOME/a2rl-stash):
#   call 1: carry [".gpu-1"]  command: mkdir -p $STASH/whl && cp .gpu-1/model.gguf.part00 $STASH/ && cp .gpu-1/whl/* $STASH/whl/
#   call 2: carry [".gpu-2"]  command: cp .gpu-2/model.gguf.part01 $STASH/ && cp .gpu-2/whl/* $STASH/whl/
#   call 3: carry [".gpu-3"]  command: WHEELS="$STASH/whl .gpu-3/whl" bash bench/gpu_alfworld.sh \
#                                      $STASH/model.gguf.part00 $STASH/model.gguf.part01
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
rm -rf .gpu-1 .gpu-2 .gpu-3 .gpu-wheels
mkdir -p .gpu-1/whl .gpu-2/whl .gpu-3/whl .gpu-wheels
git check-ignore -q .gpu-1 || { echo "add /.gpu*/ to .git/info/exclude first"; exit 2; }
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
  --platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .gpu-wheels -r bench/gpu_alfworld_wheels.txt
gguf=$(PYTHONPATH=$PWD "${A2RL_PY:-.venv/bin/python}" -c \
  "from a2rl_bench.base_models.registry import REGISTRY, gguf_path; print(gguf_path(REGISTRY['smollm2-135m-instruct']))")
split -n 2 -d "$gguf" .gpu-wheels/model.gguf.part
mv .gpu-wheels/model.gguf.part00 .gpu-1/
mv .gpu-wheels/model.gguf.part01 .gpu-2/
mv .gpu-wheels/pandas-*.whl .gpu-1/whl/
mv .gpu-wheels/prefect-*.whl .gpu-wheels/cryptography-*.whl .gpu-2/whl/
mv .gpu-wheels/*.whl .gpu-3/whl/
rmdir .gpu-wheels
n=$(ls .gpu-*/whl/*.whl | wc -l)
expected=$(grep -c '^[^#].*==' bench/gpu_alfworld_wheels.txt)
[ "$n" -eq "$expected" ] || { echo "got $n wheels, expected $expected"; exit 3; }
du -sh .gpu-1 .gpu-2 .gpu-3
for d in .gpu-1 .gpu-2 .gpu-3; do
  [ "$(du -sm "$d" | cut -f1)" -lt 62 ] || { echo "$d is over the carry limit"; exit 3; }
done
echo "staged: $n wheels and the model in two parts; make the three calls in the header, back to back"
