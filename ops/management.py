"""The RabbitMQ management API, for what AMQP cannot tell: the queues that exist, their unacked
counts and their arguments. It is a plugin that may be off, so every caller has a fallback or
says why it cannot go on; `answers` tells which."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import requests

from shared.settings import Settings, amqp_urls

MANAGEMENT_TIMEOUT_S = (1.0, 3.0)  # connect, read: callers must answer fast even if the API hangs
QUEUE_COLUMNS = "name,messages_ready,messages_unacknowledged,consumers"

HttpGet = Callable[[str], Any]  # URL → decoded JSON, or raises requests.RequestException


def amqp_part(settings: Settings, part: str) -> str:
    """User, password or vhost of AMQP_URL (of its first node, if it names several), with the
    AMQP defaults (guest, guest, '/')."""
    url = urlsplit(amqp_urls(settings.amqp_url)[0])
    if part == "vhost":
        return unquote(url.path[1:]) if len(url.path) > 1 else "/"
    value = url.username if part == "user" else url.password
    return unquote(value) if value else "guest"


def getter(settings: Settings, session: requests.Session | None = None) -> HttpGet:
    """GET with the broker's credentials; raises requests.RequestException on any failure.
    Through `session` when given, so that a caller asking again and again (the dashboard's
    sampler) keeps its HTTP connection open instead of opening one a request."""
    auth = (amqp_part(settings, "user"), amqp_part(settings, "password"))
    send = session.get if session is not None else requests.get

    def get(url: str) -> Any:
        response = send(url, auth=auth, timeout=MANAGEMENT_TIMEOUT_S)
        response.raise_for_status()
        return response.json()

    return get


def api_url(settings: Settings, path: str) -> str:
    return f"{settings.rabbitmq_management_url.rstrip('/')}/api/{path}"


def queues_url(settings: Settings) -> str:
    """Every queue of AMQP_URL's vhost, with the figures status shows."""
    vhost = quote(amqp_part(settings, "vhost"), safe="")
    return api_url(settings, f"queues/{vhost}?columns={QUEUE_COLUMNS}")


def list_queues(settings: Settings, get: HttpGet) -> list[dict[str, Any]] | None:
    """The queues of the vhost as the API lists them; None if it cannot be asked."""
    try:
        listed = get(queues_url(settings))
    except (requests.RequestException, ValueError, TypeError):
        return None
    if not isinstance(listed, list):
        return None
    return [q for q in listed if isinstance(q, dict) and isinstance(q.get("name"), str)]


def answers(settings: Settings, get: HttpGet | None = None) -> bool:
    try:
        (get or getter(settings))(api_url(settings, "overview"))
    except (requests.RequestException, ValueError):
        return False
    return True


def published_into(settings: Settings, get: HttpGet, queues: list[str]) -> int | None:
    """Messages the broker has routed into these queues since they were declared, by its own
    count (`message_stats.publish`, refreshed every few seconds); None if it cannot be asked."""
    vhost = quote(amqp_part(settings, "vhost"), safe="")
    total = 0
    for name in queues:
        try:
            queue = get(api_url(settings, f"queues/{vhost}/{quote(name, safe='')}"))
        except (requests.RequestException, ValueError, TypeError):
            return None
        stats = queue.get("message_stats") if isinstance(queue, dict) else None
        published = stats.get("publish", 0) if isinstance(stats, dict) else 0  # absent: none yet
        total += published if isinstance(published, int) else 0
    return total
