# Two entry points for a fresh machine (both idempotent):
#   make demo   set up .venv and run the demo study on CPU (run stores under data/runs/demo)
#   make test   set up .venv and run the whole test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean chromium

setup: $(STAMP) chromium

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 (or pass PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[train,notebooks,test]"
	touch $(STAMP)

demo: $(STAMP) chromium
	$(BIN)/workbench demo --out data/runs/demo

test: $(STAMP) chromium
	$(BIN)/python -m pytest -q --durations=10

lint: $(STAMP)
	$(BIN)/ruff check workbench tests benchmarks data
	$(BIN)/mypy workbench

bench: $(STAMP)
	$(BIN)/python benchmarks/step_time.py

clean:
	rm -rf $(VENV) data/runs

# PNG/SVG/PDF figure export (kaleido) and the JupyterLab browser test need Chrome/Chromium;
# HTML export and everything else do not. Installs Debian's chromium when none is found and
# we are root with apt-get; otherwise says what to do (those tests are then skipped).
chromium:
	@if [ -n "$$BROWSER_PATH" ]; then \
	  if [ -x "$$BROWSER_PATH" ]; then echo "chromium: using BROWSER_PATH=$$BROWSER_PATH"; \
	  else echo "chromium: BROWSER_PATH=$$BROWSER_PATH is not an executable; static figure export will fail"; fi; \
	elif [ -x /usr/bin/chromium ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
	    || command -v google-chrome >/dev/null; then \
	  true; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "chromium: installing Debian's chromium (figure export, browser test)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
	    >/dev/null) || echo "chromium: apt-get install failed; PNG/SVG/PDF export and browser tests will be skipped"; \
	else \
	  echo "chromium: not found; PNG/SVG/PDF export and its tests will be skipped. Install it (sudo apt-get install chromium) or set BROWSER_PATH to a Chrome/Chromium binary."; \
	fi
