# Two commands on a fresh machine:  make report   and   make test
# Both create .venv if missing and install the project first; both are idempotent.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PRESET ?= full
# The CPU wheel that lies on this project's machines. Never install an unpinned torch here:
# it would pull a multi-GB CUDA build. On a GPU machine: make setup TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: setup test report lab lint clean-results help

help:
	@echo "make report [PRESET=smoke|quick|full]   run the study and render reports/rpka_report.html"
	@echo "make test                               the whole test suite (pytest + nbval + ruff)"
	@echo "make lab                                open the notebooks in JupyterLab"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test,lab]"
	touch $(STAMP)

setup: $(STAMP)

test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest
	$(BIN)/ruff check .

lint: setup
	$(BIN)/ruff check .

report: setup
	$(BIN)/python -m rpka report --preset $(PRESET)

lab: setup
	$(BIN)/jupyter lab notebooks/
