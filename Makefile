# Set-up is part of every target: the first `make` on a fresh machine builds .venv, with
# what the demo needs (INSTALLED); the tests and the linter add their tools (TOOLS_INSTALLED).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
TOOLS_INSTALLED := $(VENV)/.installed-tools

.PHONY: demo test test-slow test-all lint test-t5x

# The demo's flags, e.g. make demo DEMO_FLAGS=--extras (python -m speculative_t5x_lab.demo --help).
DEMO_FLAGS ?=
demo: $(INSTALLED)
	$(PYTHON) -m speculative_t5x_lab.demo $(DEMO_FLAGS)

# One pytest worker per core (pytest-xdist), each test module in one worker (its
# module-scoped fixtures built once): the suite is bound by XLA compilation, one
# program at a time per process.
PYTEST := $(PYTHON) -m pytest -n auto --dist loadfile

test: $(TOOLS_INSTALLED)
	$(PYTEST) -m "not slow" tests

# The rest of test-all beside make test: the slow tests (the t5x ones skip here; make test-t5x
# runs them).
test-slow: $(TOOLS_INSTALLED)
	$(PYTEST) -m "slow and not t5x" tests

test-all: $(TOOLS_INSTALLED)
	$(PYTEST) tests

# The T5X integration tests (-m t5x, slow ones included) against the real T5X, which is not on
# PyPI: scripts/t5x_venv.sh builds (or reuses) the side venv $(T5X_VENV) with T5X from
# T5X_SOURCE=<a T5X source tree> or else the snapshot ../shared/vendor/t5x-cc342d4.tar.gz, by
# the recipe of docs/t5x.md. There a t5x test that cannot import t5x, or skips, fails. One worker
# per core, a module per worker, as for make test.
T5X_VENV ?= .venv-t5x
test-t5x:
	scripts/t5x_venv.sh $(T5X_VENV)
	SPECULATIVE_T5X_REQUIRE_T5X=1 $(T5X_VENV)/bin/python -m pytest -n auto --dist loadfile -m t5x -rs tests

# The formatter and linter (ruff.toml); `ruff format .` rewrites in place.
lint: $(TOOLS_INSTALLED)
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m ruff check .

$(INSTALLED): setup.py
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	# The CPU build of PyTorch (only the Hugging Face parity tests and the peer
	# comparison use it); asked for first so that no CUDA build is pulled in.
	$(PYTHON) -m pip install --quiet torch==2.13.0
	$(PYTHON) -m pip install --quiet -e '.[hf]'
	touch $(INSTALLED)

$(TOOLS_INSTALLED): $(INSTALLED)
	$(PYTHON) -m pip install --quiet -e '.[test]'
	touch $(TOOLS_INSTALLED)
