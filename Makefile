# The whole developer loop: `make install`, `make demo`, `make test`, `make lint`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKERS ?= 3
SITEMAP ?=
RUN_ID ?=
RECRAWL_OF ?=

.PHONY: all install demo crawl test unit integration e2e faults bench lint typecheck up down clean

all: lint typecheck test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Serve the bundled demo site on 127.0.0.2-4, crawl it with several workers, print the accounting.
demo: install
	$(PY) -m shared.crawl --demo --workers $(WORKERS)

# Crawl a sitemap (or a site root) with WORKERS workers and a dead-letter consumer until done.
# RUN_ID of an interrupted run finishes it; RECRAWL_OF=<earlier run> fetches only what changed.
crawl: install
	@test -n "$(SITEMAP)" || { echo "usage: make crawl SITEMAP=https://example.com/sitemap.xml [WORKERS=N] [RUN_ID=id] [RECRAWL_OF=id]"; exit 2; }
	$(PY) -m shared.crawl --sitemap "$(SITEMAP)" --workers $(WORKERS) $(if $(RUN_ID),--run-id $(RUN_ID)) $(if $(RECRAWL_OF),--recrawl-of $(RECRAWL_OF))

test: install
	$(PY) -m pytest

unit: install
	$(PY) -m pytest -m unit

integration: install
	$(PY) -m pytest -m integration

e2e: install
	$(PY) -m pytest -m e2e

# The fault scenarios at the sizes docs/RELIABILITY.md reports (`make test` runs them small).
# They stop and restart the local RabbitMQ, Redis and PostgreSQL: run them on a machine of your own.
faults: install
	FAULTS_SIZE=large $(PY) -m pytest -m faults

# Our pipeline beside Scrapy on the same local sites, in one run; prints one table
# (docs/PERFORMANCE.md). Takes about 15 minutes; needs a quiet machine.
bench: install
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.perf

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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
