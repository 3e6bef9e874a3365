# Two entry points for a fresh machine (see README): `make demo` and `make test`.
# Both create .venv and install the project into it; CPU torch comes first so that
# no dependency pulls a multi-GB CUDA build (GPU users keep their own torch).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install lint test test-fast smoke demo bench clean

install: $(VENV)/.installed

# torch: pip picks the file (only pip reads the machine's pip configuration, which finds the CPU build on disk) and
# uv installs it with the rest: the same versions, byte-compiled in parallel (~37 s in all with the file kept, against
# ~55 s with pip installing torch and ~75 s with pip alone). Byte-compiled at install because machines that set
# PYTHONDONTWRITEBYTECODE (this one does) would otherwise compile every import again in every process: a suite run
# without it took 24 minutes instead of 16.

# Where pip leaves the torch file: one directory per TORCH_SPEC and user, kept. uv caches a local wheel by its path,
# so a file fetched into each new checkout (CI's fresh clones) would add another ~700 MB unpacked copy to uv's cache.
TORCH_WHEELS ?= $(HOME)/.cache/verl-evidence/wheels

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q uv
	$(PY) -m pip download -q --no-deps -d "$(TORCH_WHEELS)/$(TORCH_SPEC)" "$(TORCH_SPEC)"
	$(VENV)/bin/uv pip install --python $(PY) -q --compile-bytecode -e ".[serve,dev]" "$(TORCH_WHEELS)/$(TORCH_SPEC)"/torch-*.whl
	touch $@

# The suite keeps both cores ~90 % busy (vmstat over a run): smoke trainings, Ray/Serve starts, fresh interpreters
# importing verl. Two pytest-xdist workers, not three: a fresh-clone run on three took as long (19:37 against 19:41)
# and loaded this 2-core machine past Ray's fixed 30 s raylet start (a failed server start). tests/scheduling.py
# orders the tests longest first, schedules them one at a time (a few groups whole, to build their costly fixture
# once; marks on the tests) and tests/conftest.py shares one Ray/Serve cluster between the workers. TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2
# pytest exits 5 when it collected nothing: that is a broken suite, not a pass.
# Our own modules byte-compiled first: under PYTHONDONTWRITEBYTECODE (set here) no process writes them, so each of
# the suite's hundreds of processes (Ray workers, CLIs, recipes) would compile what it imports of them (~0.4 CPU-s).
test: install lint
	@$(PY) -m compileall -q -j 0 verl_evidence retrieval_server recipes > /dev/null
	@HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist load \
	$(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi; exit $$rc

# The fast tier: tests not marked slow (no Ray or Serve, no CLI/trainer subprocesses, no heavy model work;
# tests/conftest.py refuses a Ray fixture in an unmarked test). `make test` (CI) runs both tiers.
test-fast: install lint
	@HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest selected no fast tests: failing on purpose"; exit 1; fi; exit $$rc

# Ruff's rules and format as pyproject.toml sets them; test and test-fast run it first, so a lint failure fails them.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Every recipe, 2 real training steps on this machine's CPU (verl's own trainer; docs/debug-on-cpu.md).
SMOKE_RECIPES ?= eviomni_grpo lear_grpo evinote_grpo search_r1_baseline grace_dapo evipath_sft
smoke: install
	@for r in $(SMOKE_RECIPES); do echo "== $$r --smoke"; PYTHON=$(abspath $(PY)) bash recipes/$$r.sh --smoke || exit 1; done
	@echo "== evinote_grpo --smoke reward_preset=composite"; PYTHON=$(abspath $(PY)) bash recipes/evinote_grpo.sh --smoke reward_preset=composite

demo: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/verl-evidence demo $(DEMO_ARGS)

bench: install
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
