# Two commands on a fresh machine:  make report   and   make test
# Both create .venv if missing and install the project first; both are idempotent.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PRESET ?= standard
# The CPU wheel that lies on this project's machines. Never install an unpinned torch here:
# it would pull a multi-GB CUDA build. On a GPU machine: make setup TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
# the stamp names the torch spec too, so `make setup TORCH_SPEC=...` installs that torch
STAMP  := $(VENV)/.installed-$(shell printf '%s' '$(TORCH_SPEC)' | cksum | cut -d' ' -f1)
# pip (>= 25) shows the build backend's warnings even with --quiet: setuptools' editable
# install prints a 10-line "Editable installation" banner that says nothing about this
# project. This filter (a -W message prefix, no category to import) drops that one alone.
QUIET_EDITABLE := ignore:Editable installation
# Jupyter refuses to start as root without this flag (containers, cloud notebooks)
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: setup test report publish lab lint clean-results help

help:
	@echo "make report [PRESET=smoke|quick|standard|full]   run a study into out/<preset>/ (ignored by git) and compare it with the committed one (default standard: a fresh clone resumes the committed runs, ~14 min; ~66 min from scratch; budget 30 min); report: out/<preset>/rpka_report.html"
	@echo "make test                               the whole test suite (pytest + nbval + ruff), ~11 min on a fresh clone"
	@echo "make lint                               ruff over the repository"
	@echo "make lab                                open the notebooks in JupyterLab (kernel: Python (rpka))"
	@echo "make publish PRESET=standard|full [FROM_RESULTS=1]   the one step that rewrites the committed study (data/results/, figures/, docs/ reports)"
	@echo "make clean-results                      remove your runs and reports (out/, reports/), never the committed study"
	@echo "make setup TORCH_SPEC='torch==2.13.0'   (re)install with another torch (e.g. a CUDA build)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --upgrade "$(TORCH_SPEC)"
	PYTHONWARNINGS="$(QUIET_EDITABLE)" $(BIN)/python -m pip install --quiet -e ".[test,lab]"
	$(BIN)/python -m ipykernel install --sys-prefix --name rpka --display-name "Python (rpka)"
	rm -f $(VENV)/.installed*
	touch $(STAMP)

setup: $(STAMP)

test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest
	$(BIN)/ruff check .

lint: setup
	$(BIN)/ruff check .

# a user's run: everything under out/$(PRESET)/ (git ignores it), compared at the end with
# the committed study of that preset, which it resumes from and never writes
report: setup
	$(BIN)/python -m rpka report --preset $(PRESET)

# the one step that rewrites the committed study (data/results/, figures/, docs/ reports);
# FROM_RESULTS=1 re-renders its figures and report from its result files alone
publish: setup
	$(BIN)/python -m rpka report --preset $(PRESET) --publish $(if $(FROM_RESULTS),--from-results)

# a user's runs, results, figures and reports (never the committed study)
clean-results:
	rm -rf out reports/smoke reports/quick reports/standard reports/full reports/rpka_report.html

# Lab at the repository root (notebooks/, reports/, data/ side by side); the notebooks
# name the project kernel "Python (rpka)" that setup installs into the venv
lab: setup
	$(BIN)/jupyter lab $(ALLOW_ROOT) --ServerApp.root_dir="$(CURDIR)"
