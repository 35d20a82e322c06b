# Two entry points for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PIP := $(VENV)/bin/pip
CONSTRAINTS := constraints.txt

.PHONY: install install-test run test lint

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(VENV)/bin/python
	$(PIP) install -q -c $(CONSTRAINTS) -e .

install-test: $(VENV)/bin/python
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[dev]'

# The main job: the OpenAI-compatible server on the embedded tiny model (random weights).
run: install
	$(VENV)/bin/pagedserve serve --model tiny --host 127.0.0.1 --port 8000

test: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q

lint: install-test
	$(VENV)/bin/ruff check .
