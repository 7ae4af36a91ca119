# Set-up is part of every target: the first `make` on a fresh machine builds .venv.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: demo test test-all lint

demo: $(INSTALLED)
	$(PYTHON) -m speculative_t5x.demo

test: $(INSTALLED)
	$(PYTHON) -m pytest -m "not slow" tests

test-all: $(INSTALLED)
	$(PYTHON) -m pytest tests

# The formatter and linter (ruff.toml); `ruff format .` rewrites in place.
lint: $(INSTALLED)
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m ruff check .

$(INSTALLED): setup.py
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	# The CPU build of PyTorch (only the Hugging Face parity tests and the peer
	# comparison use it); asked for first so that no CUDA build is pulled in.
	$(PYTHON) -m pip install --quiet torch==2.13.0
	$(PYTHON) -m pip install --quiet -e '.[test]'
	touch $(INSTALLED)
