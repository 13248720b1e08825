# Two entry points a new user needs: `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=
# Where packages come from: the index (default), or WHEELS=DIR, a folder `make wheels` filled on a machine
# with network (an offline compute node installs from it alone).
# SYSTEM_SITE=1: the venv sees the environment's packages (a cluster's torch module or container) and keeps
# each one that satisfies pyproject.toml's ranges; without it, CI's exact versions (constraints.txt) apply.
# An on/off setting (SYSTEM_SITE) is off when empty, 0, false, no or off (any case), on otherwise.
# TORCH=cu126|cu128|cu130|cpu (any build PyTorch publishes): torch and torchvision of constraints.txt's
# versions built for that CUDA (or for the CPU), from PyTorch's own index TORCH_INDEX/TORCH; everything else
# from the usual index. Such a build's wheels carry a local version (torch 2.14.1+cu126), which no other
# index has, so the constraints for a build pin torch==2.14.1+BUILD and torchvision likewise, and leave
# constraints.txt's CUDA libraries (nvidia-*, cuda-*: CUDA 13's) out, since each build of torch pins its
# own exactly. Without TORCH: torch from the usual index (PyPI's 2.14.1 is built for CUDA 13.0).
# docs/clusters.md says which build a driver runs.
# Once given, later calls keep them (.installed records them); `make install SYSTEM_SITE=` or `TORCH=` goes back.
# EXTRAS=demo,onnx: the optional parts (vit-demo's page, the ONNX export). `make install` alone installs what
# vit-train, vit-classify, vit-rollout and vit-export --format timm need; `make test` adds the test tools.
EXTRAS ?=
TORCH_INDEX ?= https://download.pytorch.org/whl
# make wheels: the Python version and platform of the machine that installs from the folder
TARGET_PYTHON   ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
TARGET_PLATFORM ?= manylinux_2_28_$(shell uname -m)

comma  := ,
lower   = $(subst A,a,$(subst E,e,$(subst F,f,$(subst L,l,$(subst N,n,$(subst O,o,$(subst S,s,$(1))))))))
# an on/off setting: 1 when on, empty when off (empty, 0, false, no, off, in any case)
on      = $(if $(filter-out 0 false no off,$(call lower,$(strip $(1)))),1)
given   = $(filter-out undefined,$(origin $(1)))
# .installed records the settings of the install ("SYSTEM_SITE=... WHEELS=... TORCH=..."; a setting it lacks,
# or an empty file: the default)
RECORD := $(if $(wildcard $(VENV)/.installed),$(or $(shell cat $(VENV)/.installed),SYSTEM_SITE=))
recorded = $(patsubst $(1)=%,%,$(filter $(1)=%,$(RECORD)))
# make wheels describes the machine that installs from the folder: only a SYSTEM_SITE or TORCH given to it counts
WHEELS_SYSTEM_SITE := $(call on,$(if $(call given,SYSTEM_SITE),$(SYSTEM_SITE)))
WHEELS_TORCH := $(if $(call given,TORCH),$(strip $(TORCH)))
SITE  := $(call on,$(if $(call given,SYSTEM_SITE),$(SYSTEM_SITE),$(call recorded,SYSTEM_SITE)))
ifeq ($(origin WHEELS),undefined)
WHEELS := $(call recorded,WHEELS)
endif
BUILD := $(strip $(if $(call given,TORCH),$(TORCH),$(call recorded,TORCH)))
SETTINGS := SYSTEM_SITE=$(SITE) WHEELS=$(WHEELS) TORCH=$(BUILD)
differs = $(subst x$(1),,x$(2))$(subst x$(2),,x$(1))
# a venv whose view of the environment's packages is not the one asked for, or whose torch is another build,
# is made anew (pip would keep torch 2.14.1+cu126 for constraints.txt's torch==2.14.1, and the CUDA libraries
# of the build before would stay)
HAS_SYSTEM := $(shell sed -n 's/^include-system-site-packages *= *//p' $(VENV)/pyvenv.cfg 2>/dev/null)
CLEAR  := $(if $(HAS_SYSTEM),$(if $(filter $(HAS_SYSTEM),$(if $(SITE),true,false)),$(if $(RECORD),$(if \
  $(call differs,$(call recorded,TORCH),$(BUILD)),--clear)),--clear))
# a setting given that differs from the one the venv was installed with installs again (one not given is the
# recorded one: later calls install from where the venv's packages came from)
CHANGED := $(if $(RECORD),$(strip $(CLEAR) $(call differs,$(call on,$(call recorded,SYSTEM_SITE)),$(SITE)) \
  $(call differs,$(call recorded,WHEELS),$(WHEELS))))

ifneq ($(BUILD)$(WHEELS_TORCH),)
BAD_BUILD := $(shell $(PYTHON) scripts/torch_build.py $(or $(WHEELS_TORCH),$(BUILD)) /dev/null 2>&1 >/dev/null)
ifneq ($(BAD_BUILD),)
$(error $(BAD_BUILD) (docs/clusters.md))
endif
endif
ifneq ($(BUILD),)
ifneq ($(SITE),)
$(error TORCH=$(BUILD) with SYSTEM_SITE=1: the first installs torch, the second keeps the environment's; give one)
endif
endif
ifneq ($(WHEELS_TORCH),)
ifneq ($(WHEELS_SYSTEM_SITE),)
$(error TORCH=$(WHEELS_TORCH) with SYSTEM_SITE=1: the first takes torch, the second leaves it out; give one)
endif
endif

# the constraints of a chosen build (see TORCH above), written beside the venv or the wheels
TORCH_PINS = $(PYTHON) scripts/torch_build.py $(1) constraints.txt > $(2)
PIN    := $(if $(SITE),,-c $(if $(BUILD),$(VENV)/constraints-$(BUILD).txt,constraints.txt))
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
	@$(PYTHON) -m venv $(if $(SITE),--system-site-packages) $(VENV)

$(VENV)/.installed: pyproject.toml constraints.txt $(if $(CHANGED),FORCE) | $(BIN)/python
	$(CHECK_INDEX)
	$(if $(CLEAR),$(PYTHON) -m venv --clear $(if $(SITE),--system-site-packages) $(VENV))
	$(if $(WHEELS),,$(BIN)/python -m pip install --quiet --upgrade pip)
	$(if $(BUILD),$(call TORCH_PINS,$(BUILD),$(VENV)/constraints-$(BUILD).txt))
	$(if $(BUILD),$(if $(WHEELS),,$(BIN)/python -m pip install --quiet --no-deps --index-url $(TORCH_INDEX)/$(BUILD) \
	  $(PIN) torch torchvision))
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
# `make install SYSTEM_SITE=1` does; TORCH=BUILD takes torch and torchvision of that build from
# TORCH_INDEX/BUILD (install from the folder with the same TORCH); otherwise CI's versions (constraints.txt).
wheels:
	$(if $(WHEELS_TORCH),mkdir -p $(or $(WHEELS),wheels) && \
	  $(call TORCH_PINS,$(WHEELS_TORCH),$(or $(WHEELS),wheels)/constraints-$(WHEELS_TORCH).txt))
	$(PYTHON) scripts/wheels.py --dest $(or $(WHEELS),wheels) --python-version $(TARGET_PYTHON) \
	  --platform $(TARGET_PLATFORM) $(if $(EXTRAS),--extras $(EXTRAS)) \
	  $(if $(WHEELS_SYSTEM_SITE),--without-torch,-c $(if $(WHEELS_TORCH),$(or $(WHEELS),wheels)/constraints-$(WHEELS_TORCH).txt \
	  --torch-index $(TORCH_INDEX)/$(WHEELS_TORCH),constraints.txt))

# CIFAR-10 into data/ (or ARGS="--root DIR"), downloaded and checked: on a login node, before jobs that
# run where there is no network
data: install
	$(BIN)/python -m vit.commands.data $(ARGS)

train: install
	$(BIN)/python scripts/train.py $(ARGS)

# The tests run in TEST_PROCESSES processes at once (pytest-xdist), each test file in one process: by
# default one per CPU this process may use, at most 4; TEST_PROCESSES=0 (or empty) runs them in this one,
# in order.
TEST_PROCESSES ?= auto
XDIST = -n $(or $(TEST_PROCESSES),0) $(if $(filter auto,$(TEST_PROCESSES)),--maxprocesses 4) --dist loadfile
PYTEST = $(BIN)/python -m pytest -q $(XDIST)

# Every check but the multi-process ones and the long ones (every README command runs here once)
test: $(VENV)/.installed-dev
	$(PYTEST) --ignore=tests/cluster -m "not long" $(ARGS)

# The long checks (pytest's mark "long" in pyproject.toml: torch.compile's recipes with a cold cache, make
# figures over every plan, the bf16 recipes, ...). CI runs them after make test.
test-long: $(VENV)/.installed-dev
	$(PYTEST) --ignore=tests/cluster -m long $(ARGS)

# pyproject's lower bounds: a venv of its own (LOWEST, default .venv-lowest) with every direct dependency at
# its lowest allowed version (torch and torchvision: LOWEST_TORCH, the GPU machines' 2.11.0, pyproject's bound),
# then the tests of README's commands, of vit-sync and of torch.compile in it, with the long ones marked
# `lowest`. CI runs it after make test-long.
LOWEST       ?= .venv-lowest
LOWEST_TORCH ?= torch==2.11.0 torchvision==0.26.0
LOWEST_TESTS ?= tests/test_train.py tests/test_classify.py tests/test_rollout.py tests/test_hub.py \
  tests/test_demo.py tests/test_folders.py tests/test_sync.py tests/test_compile.py tests/test_device_augment.py \
  tests/test_figures.py::test_the_gpu_plan_rehearsed_on_a_cpu_writes_every_rows_record_inside_its_scaled_budget \
  tests/test_optim.py::test_the_step_takes_the_norm_clips_and_is_timms_at_a_changing_lr \
  tests/test_evaluation.py::test_training_loss_and_accuracy_are_over_images_with_uneven_batches
test-lowest: $(VENV)/.installed-dev
	test -x $(LOWEST)/bin/python || $(PYTHON) -m venv $(LOWEST)
	$(BIN)/python scripts/lowest_versions.py $(LOWEST_TORCH) > $(LOWEST)/lowest.txt
	$(LOWEST)/bin/python -m pip install --quiet -r $(LOWEST)/lowest.txt -e .
	$(LOWEST)/bin/python -m pip check
	$(LOWEST)/bin/python -m pytest -q $(XDIST) -p no:cacheprovider -m "not long or lowest" $(LOWEST_TESTS) $(ARGS)

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
