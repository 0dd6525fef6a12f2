# The whole developer loop: `make install`, `make demo`, `make test`, `make lint`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VENV_LATEST ?= .venv-latest
PY_LATEST := $(VENV_LATEST)/bin/python
# pywb, the replay tool the WARC replay check serves crawled pages with (tests/e2e/test_warc_replay.py),
# in a virtualenv of its own: it pins redis 2.10, which the pipeline's redis>=5 cannot live beside.
VENV_REPLAY ?= .venv-replay
# make crawl / make demo: worker processes, forked by one pool (ops/crawl_workers.py), each with
# FETCH_CONCURRENCY (24) fetches in flight: the layout the benchmark found fastest (docs/PERFORMANCE.md).
WORKERS ?= 4
# make up: worker containers, each a pool of WORKER_PROCESSES (2 in docker-compose.yml).
CONTAINERS ?= 2
SITEMAP ?=
RUN_ID ?=
FAULTS_SIZE ?= small
DEEP_URLS ?= 10000000
RECRAWL_OF ?=

.PHONY: all install replay-install demo crawl dashboard test test-browser test-latest test-renderer renderers unit integration e2e faults soak soak-short bench bench-dashboard bench-render bench-politeness lint typecheck up down \
	clean images-offline compose-test pgbouncer-up pgbouncer-down test-pgbouncer bench-pgbouncer \
	rabbitmq-cluster-up rabbitmq-cluster-down rabbitmq-cluster-status \
	redis-cluster-up redis-cluster-down faults-redis-cluster faults-rabbitmq-cluster faults-cluster \
	deep-up deep-down bench-deep bench-warc bench-before-after

all: lint typecheck test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

$(VENV_REPLAY)/.installed:
	$(PYTHON) -m venv $(VENV_REPLAY)
	$(VENV_REPLAY)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_REPLAY)/bin/python -m pip install --quiet 'pywb>=2.8,<3'
	touch $@

replay-install: $(VENV_REPLAY)/.installed

# Serve the bundled demo site on 127.0.0.2-4, crawl it with a pool of WORKERS workers, print the accounting.
demo: install
	$(PY) -m ops.crawl --demo --workers $(WORKERS)

# Crawl a sitemap (or a site root) with a pool of WORKERS workers and a dead-letter consumer until done,
# once the launch checks (python -m ops.check) pass.
# RUN_ID of an interrupted run finishes it; RECRAWL_OF=<earlier run> fetches only what changed.
crawl: install
	@test -n "$(SITEMAP)" || { echo "usage: make crawl SITEMAP=https://example.com/sitemap.xml [WORKERS=N] [RUN_ID=id] [RECRAWL_OF=id]"; exit 2; }
	$(PY) -m ops.check
	$(PY) -m ops.crawl --sitemap "$(SITEMAP)" --workers $(WORKERS) $(if $(RUN_ID),--run-id $(RUN_ID)) $(if $(RECRAWL_OF),--recrawl-of $(RECRAWL_OF))

# The run dashboard and HTTP API on http://127.0.0.1:8080/ (DASHBOARD_PORT): runs, dead letters,
# workers and queues, live; without DASHBOARD_TOKEN on loopback only (docs/OPERATING.md).
dashboard: install
	$(PY) -m ops.dashboard $(if $(DASHBOARD_PORT),--port $(DASHBOARD_PORT))

# Unit, integration and end-to-end tests. Never stops or restarts a service (the fault scenarios
# are `make faults`). First turns on the RabbitMQ management API if it is off, which is not a
# restart: some tests read queue arguments and figures from it, and skip saying why without it.
test: install replay-install
	$(PY) -m tests.prepare
	PYWB_WAYBACK=$(abspath $(VENV_REPLAY))/bin/wayback $(PY) -m pytest

# The dashboard in a real browser: Playwright for Python (the `browser` extra) driving the
# system's chromium (`apt-get install chromium`; .ci/run does it when missing), never a browser
# Playwright downloads. Screenshots are left in var/test-artifacts/.
test-browser: install
	$(PY) -m pip install --quiet -e '.[dev,browser]'
	$(PY) -m tests.prepare
	$(PY) -m pytest -m browser tests/browser --screenshot only-on-failure --output var/test-artifacts/browser

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

e2e: install replay-install
	PYWB_WAYBACK=$(abspath $(VENV_REPLAY))/bin/wayback $(PY) -m pytest -m e2e

# Renderers for pages built by scripts (docs/RENDERING.md): a pool of RENDERERS processes, each
# with one Chromium, consuming the render queue until stopped.
RENDERERS ?= 1
renderers: install
	$(PY) -m renderer --processes $(RENDERERS)

# The renderer's tests, which drive Chromium (CHROMIUM_PATH, /usr/bin/chromium by default; .ci/run
# installs Debian's): kept out of `make test`, which must pass on a machine without a browser.
test-renderer: install
	$(PY) -m tests.prepare
	$(PY) -m pytest -m renderer tests/renderer

# The fault scenarios, small by default; FAULTS_SIZE=large for the sizes docs/RELIABILITY.md
# reports. They stop and restart the local RabbitMQ, Redis and PostgreSQL: run them on a
# machine of your own.
faults: install
	$(PY) -m tests.prepare
	FAULTS_SIZE=$(FAULTS_SIZE) $(PY) -m pytest -m faults tests/faults

# The soak (docs/RELIABILITY.md, "The soak"): a crawl of SOAK_URLS URLs on local sites while a
# nemesis drawn from SOAK_SEED (random and printed when unset) kills, pauses and restarts every
# process and service for SOAK_MINUTES, then a checker. Runs on a RabbitMQ, Redis and PostgreSQL
# of its own (ports SOAK_PORT_BASE+1..+20, data in /var/tmp/crawl-soak-<base>), never the shared ones.
SOAK_MINUTES ?= 30
SOAK_URLS ?= 50000
soak: install
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_URLS=$(SOAK_URLS) SOAK_SEED=$(SOAK_SEED) $(PY) -m tests.soak

# The soak in five minutes with a fixed seed and fewer URLs: what .ci/run runs.
soak-short: install
	SOAK_MINUTES=5 SOAK_URLS=8000 SOAK_SEED=46 SOAK_DRAIN_MINUTES=10 $(PY) -m tests.soak

# Three RabbitMQ nodes clustered on this machine, on loopback ports of their own (AMQP 5681-5683),
# beside any RabbitMQ already running (docs/SCALING.md, "RabbitMQ cluster"). `down` deletes them.
rabbitmq-cluster-up:
	deploy/local/rabbitmq-cluster.sh up

rabbitmq-cluster-down:
	deploy/local/rabbitmq-cluster.sh down

rabbitmq-cluster-status:
	deploy/local/rabbitmq-cluster.sh status

# The cluster's own scenarios: quorum queues spread over the three nodes, and a crawl that loses
# two of them mid-run. Brings the cluster up, runs them, and takes it down whatever the outcome.
faults-rabbitmq-cluster: install
	deploy/local/rabbitmq-cluster.sh up
	CLUSTER_AMQP_URL="$$(deploy/local/rabbitmq-cluster.sh url)" FAULTS_SIZE=$(FAULTS_SIZE) \
		$(PY) -m pytest -m cluster tests/faults_cluster/test_quorum_spread.py \
		tests/faults_cluster/test_rabbitmq_cluster.py; status=$$?; \
		deploy/local/rabbitmq-cluster.sh down; exit $$status

# Our pipeline beside Scrapy on the same local sites, in one run; prints one table
# (docs/PERFORMANCE.md). Takes about 15 minutes; needs a quiet machine.
bench: install
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.perf
	$(PY) -m bench.warc_cost

# What WARC_DIR costs (docs/WARC.md): own CPU a page on and off on real pages, bytes on disk a
# page, and warcio against FastWARC and our own writer. A few minutes; make bench runs it too.
bench-warc: install
	$(PY) -m bench.warc_cost

# What open dashboard pages cost a crawl (docs/OPERATING.md): `make bench`'s first crawl twice
# with no dashboard and twice with 5 run pages open, in turn; pages/s of each, their ratio, the
# dashboard's CPU (about 2 minutes); then the run page's latency on a run of a million pages
# (building it takes a few minutes more).
bench-dashboard: install
	$(PY) -m bench.dashboard_cost --crawl --rounds 2 --clients 5
	$(PY) -m bench.dashboard_cost --pages 1000000 --dead 100000 --clients 5 --seconds 20

# The pipeline of an earlier commit (BEFORE, checked out under /tmp) beside this tree's, rounds
# interleaved: pages/s and CPU a page on the latency- and CPU-bound sites (docs/PERFORMANCE.md).
# About 10 minutes at the defaults; a quiet machine gives the figures worth quoting.
BEFORE ?= ac93bdc
BEFORE_AFTER_ROUNDS ?= 3
bench-before-after: install
	$(PY) -m bench.before_after --before $(BEFORE) --rounds $(BEFORE_AFTER_ROUNDS)

# What waiting for a polite slot costs (docs/POLITENESS.md): 200 pages of one host at 2/s with 3
# and with 12 workers, each paired with the same crawl unbound, and Scrapy crawling the same pages
# at the same pace and unbound beside each; small synthetic pages twice, then real pages (the
# Python docs, downloaded once by the bench) once. About 30 minutes.
# The renderer beside scrapy-playwright on the same chromium, and a plain worker (docs/RENDERING.md).
bench-render: install
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.render_bench --pages 80

bench-politeness: install
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.politeness_cost --with-unbound --with-scrapy --repeat 2
	$(PY) -m bench.politeness_cost --with-unbound --with-scrapy --bench-pages --idle-rate 0
	$(PY) -m bench.politeness_cost --with-unbound --with-scrapy --real-pages --idle-rate 0

# Topologies on this machine, all on loopback (docs/SCALING.md). PgBouncer in transaction
# pooling mode on 127.0.0.1:$(PGBOUNCER_PORT) in front of the local PostgreSQL; installs Debian's
# pgbouncer if missing. Point the services at it with DATABASE_POOLER=transaction and
# DATABASE_URL=postgresql://postgres@127.0.0.1:$(PGBOUNCER_PORT)/crawler.
PGBOUNCER_PORT ?= 6432
pgbouncer-up:
	PGBOUNCER_PORT=$(PGBOUNCER_PORT) deploy/local/pgbouncer.sh up

pgbouncer-down:
	PGBOUNCER_PORT=$(PGBOUNCER_PORT) deploy/local/pgbouncer.sh down

# The pipeline through it, accounted exactly (after `make pgbouncer-up`).
test-pgbouncer: install
	PGBOUNCER_PORT=$(PGBOUNCER_PORT) $(PY) -m pytest -m cluster tests/cluster/test_pgbouncer.py

# 16 worker processes writing directly, then through it, in alternating rounds (about 5 minutes).
bench-pgbouncer: install
	$(PY) -m bench.pgbouncer --pgbouncer-port $(PGBOUNCER_PORT)

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
	docker compose up -d --scale worker=$(CONTAINERS)

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

# A Redis Cluster (three primaries, three replicas) on 127.0.0.1:7001-7006, for cluster mode:
# REDIS_URL=redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 (docs/SCALING.md).
redis-cluster-up:
	deploy/local/redis-cluster.sh up

redis-cluster-down:
	deploy/local/redis-cluster.sh down

# Crawls against that cluster: the pipeline with exact accounting, then a primary killed mid-crawl.
faults-redis-cluster: install redis-cluster-up
	$(PY) -m tests.prepare
	$(PY) -m pytest -m cluster tests/cluster/test_redis_cluster_pipeline.py tests/faults_cluster/test_redis_cluster.py; \
		status=$$?; deploy/local/redis-cluster.sh down; exit $$status

# Every cluster scenario: the RabbitMQ cluster's, then the Redis Cluster's.
faults-cluster: faults-rabbitmq-cluster faults-redis-cluster

clean:
	rm -rf $(VENV) $(VENV_LATEST) $(VENV_REPLAY) .pytest_cache .mypy_cache .ruff_cache
