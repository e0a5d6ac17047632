#!/bin/sh
# Installs, once per machine, what every clone of a2rl uses the same way, into a cache keyed by the pinned
# versions, and links this checkout to it:
#   uv            the resolver the Python venvs are installed with      <cache>/uv-<version>/bin/uv
#   npm CLIs      claude-code, codex, gemini-cli, opencode              <cache>/npm-<hash of the pins>/
#   OpenHands     its own Python >= 3.12 venv                           <cache>/openhands-<version>-py<X.Y>/
# The cache is A2RL_TOOLS_CACHE if set, else /var/cache/a2rl/tools where this user may write (it survives a
# fresh HOME, as CI has), else ${XDG_CACHE_HOME:-$HOME/.cache}/a2rl/tools. A version bump is a new directory,
# installed anew; an install holds a lock and is marked done only at its end, so clones that install at the
# same time neither clash nor use half an install.
#
# Usage: scripts/tools.sh cache-dir | uv | npm | openhands   (pins come from the Makefile's variables:
#        UV_VERSION, CLI_PACKAGES, OPENHANDS_VERSION)
set -eu

cache_dir() {
  if [ -n "${A2RL_TOOLS_CACHE:-}" ]; then echo "$A2RL_TOOLS_CACHE"; return; fi
  if mkdir -p /var/cache/a2rl/tools 2>/dev/null && [ -w /var/cache/a2rl/tools ]; then
    echo /var/cache/a2rl/tools; return
  fi
  echo "${XDG_CACHE_HOME:-$HOME/.cache}/a2rl/tools"
}

CACHE=$(cache_dir)
mkdir -p "$CACHE"
export UV_CACHE_DIR="${UV_CACHE_DIR:-$CACHE/uv-cache}"  # downloads shared by every venv of every clone

# install_once DIR CHECK COMMAND...: run COMMAND with $TARGET=DIR, then mark DIR installed. A marked DIR (another
# clone, or an earlier run, installed it) is used only if CHECK (run with $TARGET=DIR: each program's --version)
# passes: a mark whose programs are gone or do not start is said so, removed and installed again, never trusted.
# Built in place (a venv and npm's links record their own path), one installer at a time; a half install (no
# mark) is removed and done again.
install_once() {
  dir=$1; check=$2; shift 2
  works "$dir" "$check" && return 0
  exec 9>"$dir.lock"
  if ! flock -n 9; then  # another clone installs it now: say so, and count the wait
    echo "waiting for another install of $dir to end (lock $dir.lock) ..." >&2
    waited=0
    until flock -w "$EVERY_S" 9; do
      waited=$((waited + EVERY_S))
      echo "still waiting for another install of $dir ($waited s)" >&2
    done
  fi
  if ! works "$dir" "$check"; then
    if [ -e "$dir/.a2rl-installed" ]; then
      echo "$dir is marked installed, but $(TARGET=$dir sh -c "$check" 2>&1 | tail -n 1 | cut -c1-200); installing it again" >&2
    fi
    rm -rf "$dir"
    TARGET=$dir
    export TARGET
    counted "installing $dir" "$@"
    touch "$dir/.a2rl-installed"
    if ! works "$dir" "$check"; then
      echo "installed $dir, but $(sh -c "$check" 2>&1 | tail -n 1 | cut -c1-200)" >&2
      rm -f "$dir/.a2rl-installed"
      exit 1
    fi
  fi
  exec 9>&-
}

# counted WHAT COMMAND...: run COMMAND (its output to stderr: stdout is the installed directory's path, for the
# Makefile) and say "still WHAT (N s)" every EVERY_S seconds while it runs: a quiet pip or npm showed nothing.
EVERY_S=${A2RL_WAIT_EVERY_S:-15}
counted() {
  what=$1; shift
  echo "$what ..." >&2
  "$@" >&2 &
  pid=$!
  start=$(date +%s); next=$EVERY_S
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    took=$(($(date +%s) - start))
    if [ "$took" -ge "$next" ] && kill -0 "$pid" 2>/dev/null; then
      echo "still $what ($took s)" >&2
      next=$((took + EVERY_S))
    fi
  done
  wait "$pid"
}

# works DIR CHECK: DIR is marked installed and CHECK passes.
works() {
  [ -e "$1/.a2rl-installed" ] && TARGET=$1 sh -c "$2" >/dev/null 2>&1
}

# A check that runs each command with --version; its last line says which one failed and how.
RUNS='for c in $COMMANDS; do out=$("$c" --version 2>&1) || { echo "\`$c --version\` fails: $(echo "$out" | tail -n 1)"; exit 1; }; done'

uv_dir() { echo "$CACHE/uv-${UV_VERSION:?UV_VERSION is set by the Makefile}"; }

do_uv() {
  # uv from PyPI, pinned, in a venv of its own: `pip install uv` needs nothing but the Python we have.
  install_once "$(uv_dir)" 'COMMANDS="$TARGET/bin/uv"; '"$RUNS" \
    sh -c '"${PYTHON:-python3}" -m venv "$TARGET" && "$TARGET/bin/pip" install -q "uv==$UV_VERSION"'
  echo "$(uv_dir)/bin/uv"
}

python312() {
  # A pyenv shim answers `command -v python3.12` even where it cannot run, so each candidate must run.
  for c in python3.12 python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[23]*/bin/python /root/.pyenv/versions/3.1[23]*/bin/python; do
    "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { echo "$c"; return 0; }
  done
  return 1
}

# node -e "$BINS" PACKAGE@VERSION...: the paths of the packages' commands (package.json `bin`), in node_modules/.bin.
BINS='for (const spec of process.argv.slice(1)) {
  const at = spec.indexOf("@", 1), name = at > 0 ? spec.slice(0, at) : spec;  // NAME@VERSION, @SCOPE/NAME@SPEC
  const p = require(process.cwd() + "/" + name + "/package.json");
  const bin = typeof p.bin === "string" ? {[p.name.split("/").pop()]: p.bin} : (p.bin || {});
  for (const c of Object.keys(bin)) console.log(process.cwd() + "/.bin/" + c);
}'
export BINS

do_npm() {
  command -v npm >/dev/null || { echo "the agent CLIs need Node.js and npm (apt-get install nodejs npm)" >&2; exit 1; }
  node_major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$node_major" -lt 20 ]; then
    echo "the agent CLIs need Node.js >= 20 (gemini-cli, codex); the node first on PATH is $(command -v node) $(node --version):" \
      "put a newer one's bin directory first (e.g. PATH=/opt/node-22/bin:\$PATH make tools), or install Node 20+ (apt-get install nodejs on Debian 13)" >&2
    exit 1
  fi
  key=$(printf '%s node%s' "${CLI_PACKAGES:?CLI_PACKAGES is set by the Makefile}" "$node_major" | sha256sum | cut -c1-12)
  dir="$CACHE/npm-$key"
  # Every package ships its program in the npm registry's tarballs (native binaries in platform packages such as
  # @openai/codex-linux-x64), so nothing is downloaded from elsewhere: --ignore-scripts skips the optional native
  # builds (gemini's node-pty, keytar) that would fetch prebuilt binaries from GitHub; the two postinstalls that
  # only link the platform binary into place (claude-code, opencode-ai) are run by hand. npm's EBADENGINE notice
  # for claude-code (node >= 22) is harmless here: its command is that native binary, Node only runs install.cjs.
  # The check runs every pinned package's commands (their `bin`) with --version.
  install_once "$dir" 'COMMANDS=$(cd "$TARGET/node_modules" && node -e "$BINS" $CLI_PACKAGES 2>&1) ||
    { echo "a pinned package is missing: $(echo "$COMMANDS" | grep -m1 Error)"; exit 1; }; '"$RUNS" sh -c '
    npm install --prefix "$TARGET" --ignore-scripts --no-audit --no-fund --no-save --loglevel=error $CLI_PACKAGES
    if [ -d "$TARGET/node_modules/@anthropic-ai/claude-code" ]; then (cd "$TARGET/node_modules/@anthropic-ai/claude-code" && node install.cjs); fi
    if [ -d "$TARGET/node_modules/opencode-ai" ]; then (cd "$TARGET/node_modules/opencode-ai" && node postinstall.mjs); fi'
  echo "$dir"
}

do_openhands() {
  py=$(python312) || { echo "openhands needs python3.12 or newer (apt-get install python3.12, or pyenv)" >&2; exit 1; }
  pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  uv=$(do_uv)
  dir="$CACHE/openhands-${OPENHANDS_VERSION:?OPENHANDS_VERSION is set by the Makefile}-py$pyver"
  # uv resolves OpenHands' ~200 dependencies in seconds (pip took 17-41 minutes); bytecode is compiled now,
  # so that the first `openhands --version` does not (it has a time limit).
  # Checked by running its Python (the venv's base interpreter may have moved); `openhands --version` takes 26 s.
  install_once "$dir" '"$TARGET/bin/python" -c "import openhands" && test -x "$TARGET/bin/openhands"' sh -c "\"$uv\" venv -q --python \"$py\" \"\$TARGET\" && \
    \"$uv\" pip install -q --compile-bytecode --python \"\$TARGET/bin/python\" \"openhands==\$OPENHANDS_VERSION\""
  echo "$dir"
}

case "${1:-}" in
  cache-dir) echo "$CACHE" ;;
  uv) do_uv ;;
  npm) do_npm ;;
  openhands) do_openhands ;;
  *) echo "usage: $0 cache-dir | uv | npm | openhands" >&2; exit 2 ;;
esac
