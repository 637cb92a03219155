# Two entry points for a fresh machine (both idempotent):
#   make demo   set up .venv-current and run the demo study on CPU (run stores under data/runs/demo)
#   make test   set up both environments and run the whole suite in one, what can change with the
#               megatron-core release in the other; print each phase's and folder's time beside its budget
#
# Two environments, each pinned exactly by its constraints file (the library itself declares ranges):
#   .venv-current  Python 3.12, torch 2.13.0 (the registry's CUDA build; runs on the CPU), megatron-core 0.19.2:
#                  what Megatron Core users train with, so the demo and the whole suite run here; megatron-core
#                  0.17 and 0.18 are tested here too, as overlays (MEGATRON_OVERLAYS) over the same venv
#   .venv          Python 3.11, the torch 2.13.0 CPU wheel, megatron-core 0.16.1: the supported floor
# Each interpreter is found on PATH or under pyenv; point make at another with
#   make test CURRENT_PYTHON=/path/to/python3.12 FLOOR_PYTHON=/path/to/python3.11
find_python = $(firstword $(foreach p,python$(1) $(wildcard $(HOME)/.pyenv/versions/$(1).*/bin/python$(1)) \
  $(wildcard /usr/local/bin/python$(1) /usr/bin/python$(1)),$(shell $(p) -c 'import sys; assert sys.version_info[:2] == ($(subst .,$(comma),$(1)))' 2>/dev/null && echo $(p))))
comma := ,
ifndef CURRENT_PYTHON
CURRENT_PYTHON := $(call find_python,3.12)
endif
ifndef FLOOR_PYTHON
FLOOR_PYTHON := $(call find_python,3.11)
endif
CURRENT := .venv-current
FLOOR := .venv
# docs: mkdocs, which builds the documentation site (make lint and make docs in the floor environment; the browser
# test renders it from the current one); it reads the sources and imports nothing of torch.
EXTRAS := train,notebooks,test,docs
FLOOR_EXTRAS := $(EXTRAS)
MEGATRON_OVERLAYS := 0.17.1 0.18.2
# What the overlays run: a user's own loop recorded with record(...), at TP=2 and PP=2, the configurations it
# refuses, the recorder's API, and Megatron-LM's own pretrain() recorded by the launcher (each release's signature).
USER_LOOP_TESTS := every_kind_is_recorded_from_a_tp2_loop_that_calls_finalize_model_grads_itself \
  two_runs_of_the_loop_are_bitwise_identical_one_with_a_validation_loss a_one_bit_change_is_found_at_its_step_and_module \
  a_pipeline_parallel_loop_with_1f1b_logs_the_loss_from_its_last_stage
# and a user's DP=2 loop and pretrain() with Megatron's distributed optimizer, overlapped reduction and parameter
# gathering.
ZERO1_TESTS := every_kind_is_recorded_under_the_distributed_optimizer \
  param_grad_and_update_are_the_full_tensors_the_loop_saw_at_every_step the_first_step_equals_megatrons_plain_optimizer
RANGE_TESTS := tests/unit/test_packaging.py::test_the_overlay_is_the_megatron_core_imported \
  tests/unit/test_cpu_compat.py tests/unit/test_unrecordable.py tests/integration/test_recorder_api.py \
  $(foreach t,$(USER_LOOP_TESTS),tests/integration/test_user_loop.py::test_$(t)) \
  tests/integration/test_megatron_pretrain.py::test_pretrain_is_recorded_with_every_site_kind_and_its_scalars \
  tests/integration/test_megatron_pretrain.py::test_pretrain_with_the_distributed_optimizer_and_overlap_is_recorded_like_the_plain_optimizer \
  $(foreach t,$(ZERO1_TESTS),tests/integration/test_distributed_optimizer.py::test_$(t))
PYTEST := python -m pytest -q -p no:cacheprovider
SINGLE_PROCESS_TESTS := tests/unit tests/property
MULTI_PROCESS_TESTS := tests/integration tests/notebooks tests/browser
# Each pytest session appends its phase's wall time and each folder's seconds here; `make test` prints them
# beside their budgets at the end (tests/budget.py).
TIMES := build/test-times.jsonl
timed = WORKBENCH_TEST_TIMES=$(CURDIR)/$(TIMES) WORKBENCH_TEST_PHASE="$(1)"

.PHONY: setup environments demo test times test-current test-floor test-range lint docs bench clean chromium corpus \
	click-at-scale lab

# The two environments install side by side (each mostly waits on its downloads), then the overlays over
# .venv-current; chromium beside them.
setup:
	@$(MAKE) --no-print-directory -j4 environments

environments: $(CURRENT)/.installed $(FLOOR)/.installed $(foreach v,$(MEGATRON_OVERLAYS),$(CURRENT)/megatron-$(v)) chromium

# $(1): venv folder, $(2): interpreter, $(3): what it is, $(4): constraints file, $(5): extras
define make_venv
	@test -n "$(2)" || { echo "make: no Python $(3) found on PATH or under pyenv; pass $(if $(filter $(FLOOR),$(1)),FLOOR_PYTHON,CURRENT_PYTHON)=/path/to/python$(3)"; exit 1; }
	test -x $(1)/bin/python || $(2) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet -c $(4) -e ".[$(5)]"
	touch $(1)/.installed
endef

$(CURRENT)/.installed: pyproject.toml constraints/current.txt
	$(call make_venv,$(CURRENT),$(CURRENT_PYTHON),3.12,constraints/current.txt,$(EXTRAS))

$(FLOOR)/.installed: pyproject.toml constraints/floor.txt
	$(call make_venv,$(FLOOR),$(FLOOR_PYTHON),3.11,constraints/floor.txt,$(FLOOR_EXTRAS))

# megatron-core alone, for PYTHONPATH over .venv-current (its torch and everything else stay).
$(CURRENT)/megatron-%: | $(CURRENT)/.installed
	$(CURRENT)/bin/python -m pip install --quiet --no-deps --target $@ "megatron-core==$*"

demo: $(CURRENT)/.installed chromium
	$(CURRENT)/bin/workbench demo --out data/runs/demo

# The bug-or-rounding corpus (docs/bug-or-rounding.md): known layout bugs and correct layouts, each judged; its runs
# land in build/corpus (kept: a second call only judges) and its confusion table in build/corpus/corpus.md.
corpus: $(CURRENT)/.installed
	$(CURRENT)/bin/python benchmarks/rounding_corpus.py --out build/corpus

# JupyterLab on copies of the notebooks in build/lab (not tracked): JupyterLab's autosave writes each notebook's
# outputs into the file it has open, so running the tracked ones would change them. A copy is refreshed when its
# tracked notebook is newer. As root (NVIDIA's containers) it passes --allow-root. LAB_ARGS adds options
# (LAB_ARGS="--ip=0.0.0.0 --no-browser" on a remote machine).
lab: $(CURRENT)/.installed
	@mkdir -p build/lab && cp -u notebooks/*.ipynb build/lab/
	$(CURRENT)/bin/jupyter lab --notebook-dir=build/lab $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(LAB_ARGS)

# The explorer's click in JupyterLab on a synthetic pair ten times the demo's size (3,000 sites x 600 steps), with
# the largest message the page sent its kernel printed beside the 1 MB limit (the suite tries the demo's size).
click-at-scale: $(CURRENT)/.installed chromium
	WORKBENCH_CLICK_SIZE=3000x600 $(CURRENT)/bin/python -m pytest -p no:cacheprovider -p no:xdist -s -q \
		tests/browser/test_notebooks_in_jupyterlab.py -k survives

test: setup times test-current test-floor test-range
	@$(CURRENT)/bin/python tests/budget.py $(TIMES)

times:
	@mkdir -p build && rm -f $(TIMES)

# The unit and property tests run one process per core (pytest-xdist). The multi-process tests run two at a
# time (most train on two ranks), each module on one worker (`--dist loadscope`), one thread per rank: the tiny
# models gain nothing from a second thread, and two workers' ranks already fill the cores. The runs that modules
# share (`runs`, `mini_demo`, `user_runs`) are trained once, by the first worker to ask (tests/helpers/training.py).
test-current: $(CURRENT)/.installed chromium
	$(call timed,current: unit and property) $(CURRENT)/bin/$(PYTEST) -n auto $(SINGLE_PROCESS_TESTS) --durations=5
	$(call timed,current: multi-process) OMP_NUM_THREADS=1 $(CURRENT)/bin/$(PYTEST) -n 2 --dist loadscope \
	  $(MULTI_PROCESS_TESTS) --durations=10

# The floor (megatron-core 0.16.1, Python 3.11) runs what can change with the release (`-m releases`).
test-floor: $(FLOOR)/.installed
	$(call timed,floor: unit and property) $(FLOOR)/bin/$(PYTEST) -n auto -m releases $(SINGLE_PROCESS_TESTS) \
	  --durations=5
	$(call timed,floor: multi-process) OMP_NUM_THREADS=1 $(FLOOR)/bin/$(PYTEST) -n 2 --dist loadscope -m releases \
	  $(MULTI_PROCESS_TESTS) --durations=5

test-range: $(foreach v,$(MEGATRON_OVERLAYS),$(CURRENT)/megatron-$(v))
	@for v in $(MEGATRON_OVERLAYS); do echo "megatron-core $$v over $(CURRENT):"; \
	  $(call timed,megatron-core $$v) PYTHONPATH=$(CURDIR)/$(CURRENT)/megatron-$$v WORKBENCH_OVERLAY=$$v \
	  OMP_NUM_THREADS=1 $(CURRENT)/bin/$(PYTEST) -n 2 --dist loadscope $(RANGE_TESTS) || exit 1; done

lint: $(FLOOR)/.installed
	$(FLOOR)/bin/ruff check workbench tests benchmarks data
	$(FLOOR)/bin/mypy workbench
	@$(MAKE) --no-print-directory docs

# The documentation site, into build/site (open build/site/index.html); --strict: a broken link, a missing page
# or an object the API page names that is not there fails the build.
docs: $(FLOOR)/.installed
	NO_MKDOCS_2_WARNING=1 $(FLOOR)/bin/mkdocs build --strict --quiet

bench: $(CURRENT)/.installed
	$(CURRENT)/bin/python benchmarks/step_time.py

clean:
	rm -rf $(CURRENT) $(FLOOR) data/runs

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
