# Two entry points for a fresh machine: `make run` (local 3-node cluster) and `make test`.
# Both create .venv themselves from python3 (>= 3.11).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test check lint fmt typecheck bench chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/raftq cluster up --nodes 3

test: $(STAMP)
	bash tests/install-debian-tools.sh
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

bench: $(STAMP)
	$(BIN)/python bench/state_machine.py

# Long randomized chaos runs in network namespaces (needs root): make chaos DURATION=600 SEED=7
# Also NODES (3), RUNS (1), FAULTS (all, or a comma list). Exit status 1 on any anomaly.
DURATION ?= 300
NODES ?= 3
RUNS ?= 1
FAULTS ?= all
SEED ?=
chaos: $(STAMP)
	PYTHONPATH=chaos $(BIN)/python -m raftq_chaos --duration $(DURATION) --nodes $(NODES) \
		--runs $(RUNS) --faults $(FAULTS) $(if $(SEED),--seed $(SEED))

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache dist build
