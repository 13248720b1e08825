# Two entry points a new user needs: `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=
# Where packages come from: the index (default), or WHEELS=DIR, a folder `make wheels` filled on a machine
# with network (an offline compute node installs from it alone).
# SYSTEM_SITE=1: the venv sees the environment's packages (a cluster's torch module or container) and keeps
# each one that satisfies pyproject.toml's ranges; without it, CI's exact versions (constraints.txt) apply.
# Once given, later calls keep it (.installed records it); `make install SYSTEM_SITE=` goes back.
# EXTRAS=demo,onnx: the optional parts (vit-demo's page, the ONNX export). `make install` alone installs what
# vit-train, vit-classify, vit-rollout and vit-export --format timm need; `make test` adds the test tools.
EXTRAS ?=
# make wheels: the Python version and platform of the machine that installs from the folder
TARGET_PYTHON   ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
TARGET_PLATFORM ?= manylinux_2_28_$(shell uname -m)

comma  := ,
# .installed records the settings of the install ("SYSTEM_SITE=... WHEELS=..."; an empty one: the defaults)
RECORD := $(if $(wildcard $(VENV)/.installed),$(or $(shell cat $(VENV)/.installed),SYSTEM_SITE= WHEELS=))
recorded = $(patsubst $(1)=%,%,$(filter $(1)=%,$(RECORD)))
# make wheels describes the machine that installs from the folder: only a SYSTEM_SITE given to it counts
WHEELS_SYSTEM_SITE := $(if $(filter undefined,$(origin SYSTEM_SITE)),,$(SYSTEM_SITE))
ifeq ($(origin SYSTEM_SITE),undefined)
SYSTEM_SITE := $(call recorded,SYSTEM_SITE)
endif
ifeq ($(origin WHEELS),undefined)
WHEELS := $(call recorded,WHEELS)
endif
SETTINGS := SYSTEM_SITE=$(SYSTEM_SITE) WHEELS=$(WHEELS)
# a setting given that differs from the one the venv was installed with installs again (one not given is the
# recorded one: later calls install from where the venv's packages came from)
SEEN := SYSTEM_SITE=$(SYSTEM_SITE) WHEELS=$(WHEELS)
CHANGED := $(if $(RECORD),$(if $(subst x$(strip $(RECORD)),,x$(strip $(SEEN)))$(subst x$(strip $(SEEN)),,x$(strip $(RECORD))),yes))
# a venv whose view of the environment's packages is not the one asked for is made anew
HAS_SYSTEM := $(shell sed -n 's/^include-system-site-packages *= *//p' $(VENV)/pyvenv.cfg 2>/dev/null)
CLEAR  := $(if $(HAS_SYSTEM),$(if $(filter $(HAS_SYSTEM),$(if $(SYSTEM_SITE),true,false)),,--clear))

PIN    := $(if $(SYSTEM_SITE),,-c constraints.txt)
FROM   := $(if $(WHEELS),--no-index --find-links $(WHEELS) --no-build-isolation,)
PIP    := $(BIN)/python -m pip install --quiet $(FROM) $(PIN)
EXTRA_NAMES := $(subst $(comma), ,$(EXTRAS))
KNOWN_EXTRAS := demo onnx dev
ifneq ($(filter-out $(KNOWN_EXTRAS),$(EXTRA_NAMES)),)
$(error EXTRAS=$(EXTRAS): the extras are $(KNOWN_EXTRAS))
endif

# Without WHEELS the package index must answer before anything is installed: a compute node without
# network stops with one line instead of pip's resolver output.
NO_INDEX := no package index answers from this machine (a compute node without network?): run `make install` \
  on a login node of this cluster (the same folder), or `make install WHEELS=DIR` with a folder that \
  `make wheels` filled on a machine with network
INDEX_ANSWERS = $(shell $(BIN)/python -m pip index versions pip --retries 0 --timeout 20 >/dev/null 2>&1 && echo yes)
CHECK_INDEX = $(if $(WHEELS),,$(if $(INDEX_ANSWERS),,$(error $(NO_INDEX))))

.PHONY: install wheels data train test test-long test-lowest test-cluster benchmark figures FORCE

install: $(VENV)/.installed $(foreach e,$(EXTRA_NAMES),$(VENV)/.installed-$(e))

$(BIN)/python:  # quietly: where no index answers, the one line below is all a job's log shows
	@$(PYTHON) -m venv $(if $(SYSTEM_SITE),--system-site-packages) $(VENV)

$(VENV)/.installed: pyproject.toml constraints.txt $(if $(CHANGED),FORCE) | $(BIN)/python
	$(CHECK_INDEX)
	$(if $(CLEAR),$(PYTHON) -m venv --clear $(if $(SYSTEM_SITE),--system-site-packages) $(VENV))
	$(if $(WHEELS),,$(BIN)/python -m pip install --quiet --upgrade pip)
	$(if $(WHEELS),$(PIP) 'setuptools>=77')
	$(PIP) -e .
	echo '$(SETTINGS)' > $@

$(VENV)/.installed-%: $(VENV)/.installed
	$(CHECK_INDEX)
	$(PIP) -e '.[$*]'
	touch $@

# Every package `make install` takes (with EXTRAS) into WHEELS (default wheels/), as wheels for the machine
# that installs from the folder: TARGET_PYTHON (default: this one's) and TARGET_PLATFORM (default:
# manylinux_2_28 on this machine's architecture). SYSTEM_SITE=1 leaves torch, torchvision and their CUDA
# stack out (the environment's are kept) and takes the newest versions in pyproject's ranges, as
# `make install SYSTEM_SITE=1` does; without it, CI's versions (constraints.txt).
wheels:
	$(PYTHON) scripts/wheels.py --dest $(or $(WHEELS),wheels) --python-version $(TARGET_PYTHON) \
	  --platform $(TARGET_PLATFORM) $(if $(EXTRAS),--extras $(EXTRAS)) \
	  $(if $(WHEELS_SYSTEM_SITE),--without-torch,-c constraints.txt)

# CIFAR-10 into data/ (or ARGS="--root DIR"), downloaded and checked: on a login node, before jobs that
# run where there is no network
data: install
	$(BIN)/python -m vit.commands.data $(ARGS)

train: install
	$(BIN)/python scripts/train.py $(ARGS)

# Every check but the multi-process ones and the long ones (every README command runs here once)
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q --ignore=tests/cluster -m "not long" $(ARGS)

# The long checks (pytest's mark "long" in pyproject.toml: torch.compile's recipes with a cold cache, make
# figures over every plan, the bf16 recipes, ...). CI runs them after make test.
test-long: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q --ignore=tests/cluster -m long $(ARGS)

# pyproject's lower bounds: a venv of its own (LOWEST, default .venv-lowest) with every direct dependency at
# its lowest allowed version (torch and torchvision: the tested pair below), then the tests of README's
# commands in it. CI runs it after make test-long.
LOWEST       ?= .venv-lowest
LOWEST_TORCH ?= torch==2.14.1 torchvision==0.29.1
LOWEST_TESTS ?= tests/test_train.py tests/test_classify.py tests/test_rollout.py tests/test_hub.py \
  tests/test_demo.py tests/test_folders.py
test-lowest: $(VENV)/.installed-dev
	test -x $(LOWEST)/bin/python || $(PYTHON) -m venv $(LOWEST)
	$(BIN)/python scripts/lowest_versions.py $(LOWEST_TORCH) > $(LOWEST)/lowest.txt
	$(LOWEST)/bin/python -m pip install --quiet -r $(LOWEST)/lowest.txt -e .
	$(LOWEST)/bin/python -m pip check
	$(LOWEST)/bin/python -m pytest -q -p no:cacheprovider -m "not long" $(LOWEST_TESTS) $(ARGS)

# Multi-process runs: DDP with the defaults, torchrun across two "nodes", and jobs submitted to SLURM
# (scripts/slurm/local_cluster.sh starts a one-node cluster here; without sbatch those are skipped).
test-cluster: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q tests/cluster $(ARGS)

benchmark: install
	$(BIN)/python scripts/benchmark.py $(ARGS)

# README's figures on this machine: the plan of experiments/ for this machine (cpu.yaml, or gpu.yaml where
# CUDA is), its records copied to results/, and the tables of README and docs/ rendered from them;
# `make figures ARGS="--help"` says how. A plan of your own: scripts/plan.py (docs/experiments.md).
figures: install
	$(BIN)/python scripts/figures.py $(ARGS)

FORCE:
