"""One exception root for the whole pipeline.

    PipelineError
    ├── ConfigError            a user mistake in settings or a config file: one line, exit 2
    ├── ServiceUnavailable     RabbitMQ, Redis or PostgreSQL cannot be reached: pause, never blame the URL
    └── TaskError              something went wrong with one URL
        ├── TransientError     worth retrying later (timeouts, connection resets, 429, 5xx)
        └── PermanentError     retrying cannot help (bad URL, 404, unsupported content, bad message)
            ├── DecodeError    a message body that is not a valid task ('undecodable')
            │   └── InvalidMessage  one that decodes, but a field or header is out of bounds
            ├── UnstorableRow  PostgreSQL refused a row for its data (too long, out of range)
            └── BlockedAddress a URL whose host is, or resolves to, an address we must not reach

Raised and caught inside one part of the pipeline, never charged to a URL on their own:

    PipelineError
    ├── TryLater            worker: the domain cannot take the URL now; deferred, not failed
    ├── ParseLimitExceeded  worker: a page went past its parse budget (becomes 'parse_limit')
    ├── DiskFull            worker: a WARC write found no room; the write waits for room
    ├── FetchFailed         producer: a sitemap or robots.txt could not be had
    ├── SitemapError        producer: a sitemap document cannot be (fully) read
    ├── PublishFailed       the broker nacked or could not route a message
    └── CrawlFailed         `crawl`: the run cannot finish (one line, exit 1)

TaskError's subclasses Throttled (worker/fetch/verdicts.py), ProxyFailed (shared/http/proxies.py) and
InvalidURL (shared/urls.py) live beside the code that raises them. The one class outside this
tree is crawl_processes.Terminated, a KeyboardInterrupt on purpose: SIGTERM must unwind a crawl
as Ctrl-C does, past every `except Exception`.

Library errors (requests, pika, psycopg, redis) are translated into these where they enter,
so the rest of the code never catches a third-party exception.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigError(PipelineError):
    """Bad setting or config file; the message names what and where."""


class ServiceUnavailable(PipelineError):
    """A backing service is down. Work waits for it; no URL is charged a failure."""

    def __init__(self, service: str, address: str, detail: str, hint: str = "") -> None:
        self.service = service
        self.address = address
        self.detail = detail
        self.hint = hint
        text = f"cannot reach {service} at {address}: {detail}"
        super().__init__(f"{text} ({hint})" if hint else text)


class TaskError(PipelineError):
    """A failure attributable to one URL. `reason` is a short stable code stored with it."""

    def __init__(self, reason: str, detail: str = "", http_status: int | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.http_status = http_status
        super().__init__(f"{reason}: {detail}" if detail else reason)


class TransientError(TaskError):
    """Retry with a growing delay; dead-letter after the last attempt."""


class PermanentError(TaskError):
    """Dead-letter at once."""


class DecodeError(PermanentError):
    """A message body that does not decode into a task."""

    def __init__(self, detail: str, reason: str = "undecodable") -> None:
        super().__init__(reason, detail)


class InvalidMessage(DecodeError):
    """A message whose body is a JSON object, but a field or one of our headers is missing, of
    the wrong type or out of bounds (a run id of a megabyte, an attempt of 10**18)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, "invalid_message")


class UnstorableRow(PermanentError):
    """PostgreSQL refused a row for what it holds (SQLSTATE classes 22, 23, 54: a value out of
    range, an index row too large, bad text). Retrying cannot help, and the row must not hold
    back the rows stored beside it."""

    def __init__(self, detail: str) -> None:
        super().__init__("unstorable", detail)


class BlockedAddress(PermanentError):
    """The host is, or resolves to, an address the fetch guard refuses (loopback, private,
    link-local, ...): see shared/http/netguard.py. Raised before any connection is made to it."""

    def __init__(self, detail: str) -> None:
        super().__init__("blocked_address", detail)


def one_line(exc: BaseException) -> str:
    """The first line of an error's text, or its class's name if it has none: what a log line
    that must stay one line says of it."""
    text = str(exc).strip() or exc.__class__.__name__
    return text.splitlines()[0]
