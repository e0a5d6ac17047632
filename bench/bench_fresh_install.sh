#!/bin/sh
# Times what a fresh clone pays before its tests run, as CI meets it: a clone of HEAD in a temporary directory
# with a fresh HOME (cold pip and npm caches), then each make target in turn.
#   bench/bench_fresh_install.sh cold setup tools      # an empty tools cache (A2RL_TOOLS_CACHE in the temp dir)
#   bench/bench_fresh_install.sh warm setup tools test # the machine's tools cache, as every later clone has it
set -eu
mode=${1:?usage: bench/bench_fresh_install.sh cold|warm TARGET...}
shift
src=$(git rev-parse --show-toplevel)
dir=$(mktemp -d -t a2rl-install-XXXX)
git clone -q "$src" "$dir/a2rl"
export HOME="$dir/home" PREFECT_HOME="$dir/prefect"
mkdir -p "$HOME"
[ "$mode" = cold ] && export A2RL_TOOLS_CACHE="$dir/tools-cache"
cd "$dir/a2rl"
echo "fresh clone of $(git rev-parse --short HEAD) in $dir, tools cache: $(sh scripts/tools.sh cache-dir), $mode"
for target in "$@"; do
  start=$(date +%s)
  rc=0
  make "$target" >"$dir/make-$target.log" 2>&1 || rc=$?
  echo "make $target: rc=$rc, $(( $(date +%s) - start )) s (load $(cut -d' ' -f1 /proc/loadavg); log $dir/make-$target.log)"
  [ $rc -eq 0 ] || exit $rc
done
