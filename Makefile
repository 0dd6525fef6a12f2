# The whole developer loop: `make install`, `make demo`, `make test`, `make lint`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VENV_LATEST ?= .venv-latest
PY_LATEST := $(VENV_LATEST)/bin/python
WORKERS ?= 3
SITEMAP ?=
RUN_ID ?=
FAULTS_SIZE ?= small
DEEP_URLS ?= 10000000
RECRAWL_OF ?=

.PHONY: all install demo crawl test test-latest unit integration e2e faults bench lint typecheck up down \
	clean images-offline compose-test deep-up deep-down bench-deep

all: lint typecheck test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Serve the bundled demo site on 127.0.0.2-4, crawl it with several workers, print the accounting.
demo: install
	$(PY) -m ops.crawl --demo --workers $(WORKERS)

# Crawl a sitemap (or a site root) with WORKERS workers and a dead-letter consumer until done.
# RUN_ID of an interrupted run finishes it; RECRAWL_OF=<earlier run> fetches only what changed.
crawl: install
	@test -n "$(SITEMAP)" || { echo "usage: make crawl SITEMAP=https://example.com/sitemap.xml [WORKERS=N] [RUN_ID=id] [RECRAWL_OF=id]"; exit 2; }
	$(PY) -m ops.crawl --sitemap "$(SITEMAP)" --workers $(WORKERS) $(if $(RUN_ID),--run-id $(RUN_ID)) $(if $(RECRAWL_OF),--recrawl-of $(RECRAWL_OF))

# Unit, integration and end-to-end tests. Never stops or restarts a service (the fault scenarios
# are `make faults`). First turns on the RabbitMQ management API if it is off, which is not a
# restart: some tests read queue arguments and figures from it, and skip saying why without it.
test: install
	$(PY) -m tests.prepare
	$(PY) -m pytest

# Unit and integration tests against the newest versions pyproject.toml's ranges allow, in a
# virtualenv of their own (upgraded on every run): an upgrade that breaks us, or turns off one of
# the fast paths built on a library's private parts (docs/UPGRADING.md), shows here first.
test-latest:
	test -x $(PY_LATEST) || $(PYTHON) -m venv $(VENV_LATEST)
	$(PY_LATEST) -m pip install --quiet --upgrade pip
	$(PY_LATEST) -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[dev]'
	$(PY_LATEST) -m tests.library_versions
	$(PY_LATEST) -m tests.prepare
	$(PY_LATEST) -m pytest -m 'unit or integration'

unit: install
	$(PY) -m pytest -m unit

integration: install
	$(PY) -m pytest -m integration

e2e: install
	$(PY) -m pytest -m e2e

# The fault scenarios, small by default; FAULTS_SIZE=large for the sizes docs/RELIABILITY.md
# reports. They stop and restart the local RabbitMQ, Redis and PostgreSQL: run them on a
# machine of your own.
faults: install
	$(PY) -m tests.prepare
	FAULTS_SIZE=$(FAULTS_SIZE) $(PY) -m pytest -m faults tests/faults

# Our pipeline beside Scrapy on the same local sites, in one run; prints one table
# (docs/PERFORMANCE.md). Takes about 15 minutes; needs a quiet machine.
bench: install
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.perf

# A deep frontier (docs/SCALING.md): DEEP_URLS queued at once on a RabbitMQ node and a Redis of
# their own (deep-up / deep-down, loopback only), never the shared ones.
deep-up:
	deploy/local/deep.sh up

deep-down:
	deploy/local/deep.sh down

bench-deep: install
	$(PY) -m bench.deep_frontier --urls $(DEEP_URLS)

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: install
	$(PY) -m mypy

# With a Docker engine: the same services as containers (see docker-compose.yml).
up:
	docker compose up -d --scale worker=$(WORKERS)

down:
	docker compose down

# Where no image registry can be reached: every image docker-compose.yml names, built from
# Debian packages and tagged with the same names (as root, with debootstrap and a Docker daemon).
images-offline:
	deploy/offline-images/build.sh

# docker-compose.yml run for real on a Docker daemon of its own: healthy, crawled, scaled,
# killed, stopped, accounted, monitored, removed (tests/compose/run.sh; as root).
compose-test: install
	PY=$(PY) tests/compose/run.sh

clean:
	rm -rf $(VENV) $(VENV_LATEST) .pytest_cache .mypy_cache .ruff_cache
