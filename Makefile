# Two commands on a fresh machine: `make demo` and `make test` (see README.md).
#
# Each set-up step leaves a stamp under .make/, so the next run skips what is done; a step reruns
# when its script or pyproject.toml changes, or when what it made is gone. One line per step.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMPS := .make
# pip's own output goes to a log, shown only when it fails.
EXTRAS := '.[test,dev]'
PIP_LOG := $(STAMPS)/pip.log
pip = $(BIN)/python -m pip --disable-pip-version-check --no-input install -q $(1) >$(PIP_LOG) 2>&1 \
	|| { tail -n 20 $(PIP_LOG); echo "pip install $(1) failed; the whole log is $(PIP_LOG)"; exit 1; }

.PHONY: demo test test-fast lint setup setup-test clean FORCE
FORCE:

# Redo a step whose product is missing, whatever its stamp says.
redo-unless = $(if $(wildcard $(1)),,FORCE)

$(STAMPS)/system: scripts/system-packages
	@PYTHON=$(PYTHON) scripts/system-packages
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/clis: scripts/install-agent-clis $(STAMPS)/system $(call redo-unless,.npm-prefix/bin/codex)
	@scripts/install-agent-clis
	@touch $@

$(STAMPS)/venv: pyproject.toml $(call redo-unless,$(BIN)/fleet)
	@echo "venv: $(VENV) with fleet and its runtime dependencies"
	@mkdir -p $(STAMPS)
	@$(PYTHON) -m venv $(VENV)
	@$(call pip,-e .)
	@touch $@

$(STAMPS)/venv-test: $(STAMPS)/venv $(call redo-unless,$(BIN)/pytest)
	@echo "venv: $(VENV) with the test and dev extras (pytest, ruff, mypy)"
	@$(call pip,-e $(EXTRAS))
	@touch $@

setup: $(STAMPS)/venv

setup-test: $(STAMPS)/system $(STAMPS)/clis $(STAMPS)/venv-test

demo: setup
	@$(BIN)/fleet demo

# The suite runs on $(WORKERS) xdist workers
# (loadgroup: each worker takes the next test as it finishes, and the tests that must run one at
# a time, Ray clusters, go to one worker together; tests/conftest.py). CI prints the 15 slowest.
# Three on two cores: the heavy tests mostly wait on their subprocesses (tests/faults and
# tests/orchestrator/control -m slow: 107-117 s on three workers, 134-138 s on two).
WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup

test: setup-test
	$(PYTEST) --durations=15

test-fast: setup-test
	$(PYTEST) -m 'not slow'

lint: $(STAMPS)/venv-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(STAMPS) .pytest_cache .mypy_cache .ruff_cache
