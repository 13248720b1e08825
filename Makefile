# Two entry points a new user needs: `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: install train test test-cluster benchmark figures

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

train: install
	$(BIN)/python scripts/train.py $(ARGS)

test: install
	$(BIN)/python -m pytest -q --ignore=tests/cluster $(ARGS)

# Multi-process runs: DDP with the defaults, torchrun across two "nodes", and jobs submitted to SLURM
# (scripts/slurm/local_cluster.sh starts a one-node cluster here; without sbatch those are skipped).
test-cluster: install
	$(BIN)/python -m pytest -q tests/cluster $(ARGS)

benchmark: install
	$(BIN)/python scripts/benchmark.py $(ARGS)

# README's figures on this machine (records in results/, README's tables rendered from them):
# `make figures ARGS="--help"` says how.
figures: install
	$(BIN)/python scripts/figures.py $(ARGS)
