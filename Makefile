# Two entry points a new user needs: `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=
# Where packages come from: the index (default), or WHEELS=DIR, a folder `make wheels` filled on a machine
# with network (an offline compute node installs from it alone).
WHEELS ?=
# SYSTEM_SITE=1: the venv sees the environment's packages (a cluster's torch module or container) and keeps
# each one that satisfies pyproject.toml's ranges; without it, CI's exact versions (constraints.txt) apply.
SYSTEM_SITE ?=
PIN    := $(if $(SYSTEM_SITE),,-c constraints.txt)
FROM   := $(if $(WHEELS),--no-index --find-links $(WHEELS) --no-build-isolation,)

.PHONY: install wheels train test test-long test-cluster benchmark figures

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(if $(SYSTEM_SITE),--system-site-packages) $(VENV)
	$(if $(WHEELS),,$(BIN)/python -m pip install --quiet --upgrade pip)
	$(if $(WHEELS),$(BIN)/python -m pip install --quiet $(FROM) $(PIN) 'setuptools>=77')
	$(BIN)/python -m pip install --quiet $(FROM) $(PIN) -e '.[dev]'
	touch $@

# Every package `make install` takes, CI's versions, into WHEELS (default wheels/), for an offline install.
wheels:
	$(PYTHON) -m pip download --quiet --dest $(or $(WHEELS),wheels) $(PIN) '.[dev]' 'setuptools>=77'

train: install
	$(BIN)/python scripts/train.py $(ARGS)

# Every check but the multi-process ones and the long ones (every README command runs here once)
test: install
	$(BIN)/python -m pytest -q --ignore=tests/cluster -m "not long" $(ARGS)

# The long checks (pytest's mark "long" in pyproject.toml: torch.compile's recipes with a cold cache, make
# figures over every plan, the bf16 recipes, ...). CI runs them after make test.
test-long: install
	$(BIN)/python -m pytest -q --ignore=tests/cluster -m long $(ARGS)

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
