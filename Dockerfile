# One image for every service; docker-compose.yml picks the service with its command
# (python -m producer | worker | dlq_consumer | demo_site | ops.dashboard); the operator commands (python -m
# ops.status, ops.run_report, ...) run in any of them.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package build needs, so edits to tests or docs do not rebuild the image.
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY producer ./producer
COPY worker ./worker
COPY dlq_consumer ./dlq_consumer
COPY demo_site ./demo_site
COPY ops ./ops
COPY renderer ./renderer
# WITH_RENDERER=1 (compose's renderer service) adds Debian's chromium and Playwright; Playwright
# never downloads a browser of its own (CHROMIUM_PATH=/usr/bin/chromium). Playwright's own driver
# (a node binary in its wheel) needs libatomic1, which neither chromium nor the base image brings.
ARG WITH_RENDERER=0
RUN if [ "$WITH_RENDERER" = 1 ]; then \
      apt-get update && apt-get install -y --no-install-recommends chromium libatomic1 \
      && rm -rf /var/lib/apt/lists/*; \
    fi
# A regular (not editable) install: the code runs from site-packages and /src can go.
# Every image carries the dashboard's extra (compose's dashboard service runs from it).
RUN if [ "$WITH_RENDERER" = 1 ]; then pip install '.[dashboard,render]'; else pip install '.[dashboard]'; fi \
    && rm -rf /src

# The services need no privileges; a fixed uid keeps file ownership predictable on volumes.
RUN useradd --create-home --uid 10001 --user-group crawler \
    && mkdir -p /var/lib/crawl/warc && chown crawler:crawler /var/lib/crawl/warc
USER crawler
WORKDIR /home/crawler
