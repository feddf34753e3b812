# Two commands do all the set-up: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test test-fast check lint typecheck bench bench-scale bench-memory dask-tests clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@ $(STAMP)

$(BENCH_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,bench]"
	touch $@ $(TEST_STAMP) $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/seed_resources.py

lint: $(TEST_STAMP)
	$(BIN)/python -m ruff check src tests benchmarks examples tools
	$(BIN)/python -m ruff format --check src tests benchmarks examples tools

typecheck: $(TEST_STAMP)
	$(BIN)/python -m mypy

check: lint typecheck

test: check
	$(BIN)/python -m pytest -q

# The pure and in-memory tiers only: no real process, no TCP socket.
test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n auto -m "not process and not tcp"

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/run_all.py

# 200 worker processes on this machine, beside Dask: too slow for `make bench`.
bench-scale: $(BENCH_STAMP)
	$(BIN)/python benchmarks/scale.py

# Dask collections of up to 18.6 GiB on 2 workers of 2 GiB, beside Dask: several
# minutes; `make bench` runs the same at half the sizes.
bench-memory: $(BENCH_STAMP)
	$(BIN)/python benchmarks/memory_order.py --full

# Dask.distributed's own tests of its public API, run against apportion; they are read
# from a checkout of dask/distributed: `make dask-tests DASK_CHECKOUT=path`. Minutes:
# not part of `make test`.
dask-tests: $(TEST_STAMP)
	@test -n "$(DASK_CHECKOUT)" || { echo "give DASK_CHECKOUT=<a clone of dask/distributed>"; exit 2; }
	$(BIN)/python tools/dask_tests/run.py --checkout $(DASK_CHECKOUT)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .mypy_cache .pytest_cache .ruff_cache
