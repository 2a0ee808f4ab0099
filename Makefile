# Two entry points (see README): `make run` starts dirmq on ./dirmq-data, `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck unit fuzz soak soak-gluster clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@# docs/operations.md's backup example runs rsync (its test says so and skips where it is missing)
	command -v rsync >/dev/null || [ "$$(id -u)" != 0 ] || apt-get install -y -q rsync >/dev/null 2>&1 \
		|| (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q rsync >/dev/null 2>&1) || true
	@# the browser tests drive Debian's chromium through Playwright (tests/support/browser.py; never `playwright install`)
	test -x /usr/bin/chromium || [ "$$(id -u)" != 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
		|| (apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1) || true
	touch $(STAMP)

# The HTTP server on $DIRMQ_ROOT (default ./dirmq-data), http://127.0.0.1:8080; or where you say:
# make run LISTEN=0.0.0.0:8080 ROOT=/var/lib/dirmq CONFIG=dirmq.toml (each optional).
run: $(STAMP)
	$(BIN)/dirmq serve$(if $(CONFIG), --config '$(CONFIG)')$(if $(LISTEN), --listen '$(LISTEN)')$(if $(ROOT), --root '$(ROOT)')

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# The whole suite, on TEST_WORKERS processes (pytest-xdist; most tests wait on fsync, servers and
# polls more than they compute, so more processes than CI's 2 cores pay); files that share one
# thing of the machine stay on one worker (tests/support/distribution.py). Failures are printed
# at the end as usual, then the 25 slowest tests (what to look at when it grows).
# `make unit TEST_WORKERS=0`: in this process, one test at a time.
TEST_WORKERS ?= 3
unit: $(STAMP)
	$(BIN)/pytest -q --durations=25$(if $(filter-out 0,$(TEST_WORKERS)), -n $(TEST_WORKERS) --dist loadfile)

test: lint typecheck unit

# By hand: the model-based store test and the HTTP/SQS fuzzers for $(FUZZ_SECONDS) s each; -rP prints their counts.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	DIRMQ_FUZZ_SECONDS=$(FUZZ_SECONDS) $(BIN)/pytest -q -rP -o timeout=0 -m fuzz tests

# By hand: SIGKILLs of a server under mixed load, then of one GlusterFS mount's processes (its
# server and clients; skipped, saying why, where the machine cannot run a volume); prints the
# counts of anything lost. `make soak-gluster`: the GlusterFS part alone.
soak: $(STAMP)
	$(BIN)/python -m tests.support.soak
	$(BIN)/python -m tests.support.soak_gluster

soak-gluster: $(STAMP)
	$(BIN)/python -m tests.support.soak_gluster

clean:
	rm -rf $(VENV) build src/*.egg-info
