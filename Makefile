# Two entry points for a fresh machine (both idempotent):
#   make demo   set up .venv and run the demo study on CPU (run stores under data/runs/demo)
#   make test   set up .venv and run the whole test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 (or pass PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[train,notebooks,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/workbench demo --out data/runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check workbench tests benchmarks
	$(BIN)/mypy workbench

bench: $(STAMP)
	$(BIN)/python benchmarks/step_time.py

clean:
	rm -rf $(VENV) data/runs
