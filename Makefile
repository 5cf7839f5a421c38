# Two commands do all set-up: `make run` starts the service, `make test` runs the tests.
# Each creates the virtualenv in .venv and installs the project into it first.
PYTHON ?= python3
VENV ?= .venv
# Installed again when pyproject.toml, setup.py or the C extension's source changes (an editable
# install compiles ledger/_batch_codec.c into ledger/ once, when it installs).
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py ledger/_batch_codec.c | cksum | cut -d' ' -f1)

.PHONY: run test test-postgres lint docs bench bench-quick install java maven go proto

# Spark needs Java 17 or 21: found, else installed (root on Debian/Ubuntu), else named in one
# line -- before anything else, so a fresh machine does not fail later in every compaction.
java:
	@.ci/java

# The Java client's tests build a Maven project: Maven and a JDK, installed when missing (root on Debian).
maven:
	@.ci/maven

# The Go client's tests build a Go module (tests/go) through the Go module proxy: Go 1.24 or
# newer, installed when missing (root on Debian).
go:
	@.ci/go

$(STAMP): pyproject.toml setup.py ledger/_batch_codec.c | java
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[server,test,postgres,docs]'
	@$(VENV)/bin/python -c 'import ledger._batch_codec' 2>/dev/null || echo "warning: ledger/_batch_codec.c did not compile (gcc and the Python headers, python3-dev, are needed): batches are decoded in Python, slowly" >&2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

run: java $(STAMP)
	$(VENV)/bin/compactor serve

test: java maven go $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The suite with PostgreSQL as the metadata store (installs and starts a local server).
test-postgres: java maven go $(STAMP)
	COMPACTOR_TEST_POSTGRES_URL="$$(.ci/postgres)" $(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check service compactor ledger api migrations tests
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --strict api/client

# Pulsar's protocol messages: api/pulsar/pulsar_api_pb2.py from api/pulsar/pulsar_api.proto
# (checked in; tests/api/pulsar/test_framing.py fails when it is not current).
proto: $(STAMP)
	cd api/pulsar && ../../$(VENV)/bin/python -m grpc_tools.protoc -I. --python_out=. pulsar_api.proto

# The guide (docs/, mkdocs.yml) with the client's API reference from its docstrings, in site/
# (the test suite builds it too, strictly, and checks every relative link of README.md,
# BENCHMARKS.md and the guide).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

# Benchmarks (tests/benchmarks; not part of `make test`): tables on stdout and in BENCHMARKS.md.
bench: $(STAMP)
	$(VENV)/bin/pip install --quiet -e '.[server,test,postgres,bench]'
	$(VENV)/bin/python -m tests.benchmarks

# Small sizes, a smoke run: its figures are not today's, so they go beside the virtualenv, not into BENCHMARKS.md.
bench-quick: $(STAMP)
	$(VENV)/bin/pip install --quiet -e '.[server,test,postgres,bench]'
	$(VENV)/bin/python -m tests.benchmarks --quick --out $(VENV)/BENCHMARKS-quick.md
