# The two commands a newcomer needs: `make run` and `make test`.
# Each creates .venv when missing and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA_DIR ?= ./troupe-data
# Test workers (pytest-xdist, work-stealing: the simulator tests take 10-40 s each, so a worker
# that finishes early takes over the other's queue); 0 runs the suite in this one process.
TEST_WORKERS ?= 2

.PHONY: run test lint sweep bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

run: $(VENV)/.installed
	$(BIN)/troupe serve --data-dir $(DATA_DIR)

test: $(VENV)/.installed-dev
	$(BIN)/ruff check troupe tests bench
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check troupe tests bench

sweep: $(VENV)/.installed
	$(BIN)/troupe sim sweep --seeds 1..200 --steps 2000 --jobs 2

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/runtime.py

clean:
	rm -rf $(VENV) troupe-data .pytest_cache
