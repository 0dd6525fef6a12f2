"""The worker's part in a discovery run: a stored page's follow-able links go to the frontier
(producer/frontier.py) as one object, published and confirmed before the page's message is
acked: joined with the objects of the other pages the consumer loop settles at the same moment,
as one message (shared/links_message.py, join_pages), so a commit of many pages costs the
broker one message, not one a page. A crash between the two leaves the page's message to be
delivered again; the page is then stored again (an idempotent upsert) and its links sent again,
which the frontier finds seen: duplicates it counts, never enqueued twice.

Followed: the page's <a href> and <area href>, resolved against its <base> (worker/parse/page.py),
http(s) only, not rel="nofollow"; none at all from a page whose <meta name="robots"> or
X-Robots-Tag header says nofollow (or none).
"""

from __future__ import annotations

from shared.amqp.broker import Joining, Publication
from shared.amqp.topology import LINKS_ROUTING_KEY, Topology, discovery_exchange
from shared.consumer import Outcome
from shared.links_message import (
    MAX_LINKS_A_PAGE,
    MAX_LINKS_MESSAGE_BYTES,
    MAX_PAGES_A_MESSAGE,
    PageLinks,
    join_pages,
)
from shared.messages import CrawlTask
from worker.fetch.response import Response
from worker.parse.fast_fields import robots_says_nofollow
from worker.parse.page import ParsedPage

_STORED = Outcome.done()
# A joined message's framing is a dozen bytes: well within the frontier's bound with this margin.
PAGES_JOINED = Joining(join_pages, MAX_LINKS_MESSAGE_BYTES - 1024, MAX_PAGES_A_MESSAGE)


def after_storing(topology: Topology, task: CrawlTask, page: ParsedPage, response: Response) -> Outcome:
    """What settles the message of a page once its row is committed: an ack, after the page's
    links are confirmed on their way in a discovery run."""
    if task.depth is None or not page.follow or robots_says_nofollow(response.robots_tag):
        return _STORED
    links = PageLinks(task.run_id, task.depth + 1, task.url, page.follow[:MAX_LINKS_A_PAGE])
    return Outcome.forward(
        Publication(
            discovery_exchange(topology.namespace), LINKS_ROUTING_KEY, links.encode(), joins=PAGES_JOINED
        )
    )
