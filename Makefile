# Two entry points a new user needs: `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: install train test benchmark

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

train: install
	$(BIN)/python scripts/train.py $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

benchmark: install
	$(BIN)/python scripts/benchmark.py $(ARGS)
