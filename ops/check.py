"""python -m ops.check: what a crawl needs, checked before it starts, one line each.

    ok    settings      valid (CRAWL_SETTINGS_FILE crawl.toml)
    ok    rabbitmq      amqp://crawler:***@127.0.0.1:5672/%2f
    FAIL  management    http://127.0.0.1:15672: not answering; rabbitmq-plugins enable rabbitmq_management
    ...

It checks the settings, RabbitMQ, its management plugin (ops.status and the tests read it),
Redis, PostgreSQL, every proxy (a TCP connection to it), the routing, politeness and
extraction-profile files (read the way the producer and the worker read them) and WARC_DIR
(a file can be made there). Exit 0 when every line is ok, 2 otherwise. `make crawl` runs it
first. Credentials never appear: URLs are redacted, proxies shown by host and port.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Sequence
from typing import IO

from ops import management
from shared.amqp import broker
from shared.cli import EXIT_USER_ERROR, configure_logging
from shared.errors import ConfigError, PipelineError, one_line
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.settings import Settings, redact

Check = tuple[str, Callable[[], str]]  # (what, a function that says how it is or raises)
PROXY_CONNECT_TIMEOUT_S = 3.0


def main(argv: Sequence[str] | None = None, out: IO[str] = sys.stdout) -> int:
    del argv  # no options: the environment says everything
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"FAIL  {'settings':<13} {exc}", file=out)
        return EXIT_USER_ERROR
    configure_logging("ERROR", "check", settings.log_format)
    file_note = (
        f" (CRAWL_SETTINGS_FILE {settings.crawl_settings_file})" if settings.crawl_settings_file else ""
    )
    print(f"ok    {'settings':<13} valid{file_note}", file=out)
    return run_checks(checks_for(settings), out)


def run_checks(checks: Sequence[Check], out: IO[str]) -> int:
    failed = 0
    for what, check in checks:
        try:
            print(f"ok    {what:<13} {check()}", file=out)
        except Exception as exc:  # every failure is a line of the report, never a traceback
            failed += 1
            print(f"FAIL  {what:<13} {redact(one_line(exc))[:300]}", file=out)
    return EXIT_USER_ERROR if failed else 0


def checks_for(settings: Settings) -> list[Check]:
    checks: list[Check] = [
        ("rabbitmq", lambda: _rabbitmq(settings)),
        ("management", lambda: _management(settings)),
        ("redis", lambda: _redis(settings)),
        ("postgresql", lambda: _postgresql(settings)),
    ]
    if settings.proxies or settings.proxy_file:
        try:
            labels = _proxy_labels(settings)
            checks.append(("proxies", lambda: f"{len(labels)} listed"))
            checks += [(f"proxy {label}", _proxy(label)) for label in labels]
        except ConfigError as exc:
            checks.append(("proxies", _fails(exc)))
    checks += [
        ("routing", lambda: _routing(settings)),
        ("politeness", lambda: _politeness(settings)),
        ("profiles", lambda: _profiles(settings)),
    ]
    if settings.warc_dir:
        checks.append(("warc_dir", lambda: _warc_dir(settings.warc_dir)))
    return checks


def _rabbitmq(settings: Settings) -> str:
    connection = broker.connect(settings, "check")
    connection.close()
    return redact(settings.amqp_url)


def _management(settings: Settings) -> str:
    if not management.answers(settings):
        raise PipelineError(
            f"{settings.rabbitmq_management_url}: not answering; "
            "enable it with `rabbitmq-plugins enable rabbitmq_management`"
        )
    return settings.rabbitmq_management_url


def _redis(settings: Settings) -> str:
    client = connect_redis(settings, OPERATOR, ping=True)
    client.close()
    return redact(settings.redis_url)


def _postgresql(settings: Settings) -> str:
    with db.translate(settings), db.connect(settings) as conn:
        conn.execute("SELECT 1")
    return redact(settings.database_url)


def _proxy_labels(settings: Settings) -> list[str]:
    from shared.http.proxies import proxies_of

    return [proxy.label for proxy in proxies_of(settings)]


def _fails(error: Exception) -> Callable[[], str]:
    def check() -> str:
        raise error

    return check


def _proxy(label: str) -> Callable[[], str]:
    def check() -> str:
        host_port = label.split("://", 1)[1]
        host, _, port = host_port.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROXY_CONNECT_TIMEOUT_S):
            return "accepts connections"

    return check


def _routing(settings: Settings) -> str:
    from producer.routing import load_router

    load_router(settings.routing_file)
    return settings.routing_file or "the built-in rules"


def _politeness(settings: Settings) -> str:
    from worker.politeness.config import PolitenessConfig

    PolitenessConfig.from_settings(settings)
    return settings.politeness_file or "none (RATE_LIMIT_RPS for every domain)"


def _profiles(settings: Settings) -> str:
    if not settings.extraction_profiles_file:
        return "none"
    from worker.parse.profiles import load_profiles

    load_profiles(settings.extraction_profiles_file)
    return settings.extraction_profiles_file


def _warc_dir(directory: str) -> str:
    """The worker's own check at its start: a folder, writable, with room."""
    from worker.warc.archive import check_directory

    check_directory(directory)
    return f"{directory} is writable"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
