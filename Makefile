# Two commands do everything on a fresh machine:  `make run`  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.a2rl-installed
ARGS ?=

.PHONY: setup run test

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

run: setup
	$(VENV)/bin/a2rl run $(ARGS)

test: setup
	$(VENV)/bin/pytest -q
