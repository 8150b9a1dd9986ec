# tradecore: two user-facing targets, `make run` and `make test`.
# Both create .venv and install what they need on a machine with Python 3.11+ and make:
# `make run` only what serving needs (the server extra), `make test` the test tools too.
# Every install goes through constraints.txt, so two machines get the same versions.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check
CONSTRAINTS := constraints.txt
CREATED := $(VENV)/.created
SERVER_STAMP := $(VENV)/.installed-server
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test lint typecheck imports unit constraints clean

run: $(SERVER_STAMP)
	$(BIN)/tradecore serve --demo

test: $(TEST_STAMP) lint typecheck imports unit

$(CREATED):
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "tradecore needs Python 3.11 or newer"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

$(SERVER_STAMP): pyproject.toml $(CONSTRAINTS) | $(CREATED)
	$(PIP) install --quiet --constraint $(CONSTRAINTS) -e '.[server]'
	touch $@

# the test install includes the server extra, so it also satisfies `make run`
$(TEST_STAMP): pyproject.toml $(CONSTRAINTS) | $(CREATED)
	$(PIP) install --quiet --constraint $(CONSTRAINTS) -e '.[server,test]'
	touch $(SERVER_STAMP) $@

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests $(wildcard bench)
	$(BIN)/ruff format --check src tests $(wildcard bench)

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

imports: $(TEST_STAMP)
	$(BIN)/lint-imports

# tests/packaging runs hadolint on the Dockerfiles and checks compose.yaml against the
# vendored Compose schema (deploy/schema), besides the rest of the suite
unit: $(TEST_STAMP)
	$(BIN)/pytest -q -p no:cacheprovider

# Pin what a clean environment resolves today: run after changing a dependency.
constraints:
	rm -rf .constraints-venv
	$(PYTHON) -m venv .constraints-venv
	.constraints-venv/bin/python -m pip install --quiet --upgrade pip
	.constraints-venv/bin/python -m pip install --quiet '.[server,test]'
	{ sed -n '/^#/p' $(CONSTRAINTS); \
	  .constraints-venv/bin/python -m pip freeze --exclude tradecore \
	  | sed 's/^\(uvloop==.*\)$$/\1; sys_platform != "win32"/'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf .constraints-venv

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
