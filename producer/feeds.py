"""RSS and Atom feeds read as lists of URLs: sites list their feeds among their sitemaps.

    RSS 2.0   <rss><channel><item><link>URL</link><pubDate>RFC 822 date</pubDate></item>
    RSS 1.0   <rdf:RDF><item><link>URL</link><dc:date>W3C date</dc:date></item>
    Atom 1.0  <feed><entry><link rel="alternate" href="URL"/><updated>date</updated></entry>

An Atom <link> without `rel` is an alternate one (RFC 4287); other relations (self, edit,
enclosure, ...) name no page of the entry's own. The first alternate link of an entry counts.
Links resolve against the feed's URL, as relative ones are allowed in feeds.

The sitemap reader's streaming rules hold here too: expat's events are taken as they come, no
tree is built, and only the few fields an entry needs are kept, a bounded number of them.
"""

from __future__ import annotations

from typing import NoReturn, Protocol

FEED_ROOTS = frozenset({"rss", "feed", "RDF"})
ITEM_NAMES = frozenset({"item", "entry"})
ITEM_PARENTS = frozenset({"rss", "feed", "RDF", "channel"})
DATE_FIELDS = ("updated", "pubDate", "published", "date")  # the first one present dates the item
LINK_RELATIONS = frozenset({"", "alternate"})


class FeedSink(Protocol):
    """Where a feed's items go: the sitemap reader's builder, which also counts expat's events
    and learns when the root element ends."""

    events: int
    root_ended: bool

    def add_feed_item(self, link: str, date: str | None, date_is_rss: bool) -> None: ...
    def nested_too_deep(self) -> NoReturn: ...


class FeedBuilder:
    """Takes expat's element events for a feed (from its root element on) and hands each item's
    link and date to the sink."""

    def __init__(self, sink: FeedSink, max_depth: int, max_fields: int) -> None:
        self._sink = sink
        self._max_depth = max_depth
        self._max_fields = max_fields
        self._names: list[str] = []  # local names of the open elements, root first
        self._item_depth = 0  # depth of the item being read, 0 outside items
        self._fields: dict[str, str] = {}
        self._fields_seen = 0
        self._field = ""  # the field element being read, just inside the item
        self._text: list[str] = []
        self._reading = False  # a field's text ends where a child element begins

    def start(self, tag: str, attributes: list[str]) -> None:
        self._sink.events += 1
        name = tag.rpartition("}")[2]
        parent = self._names[-1] if self._names else ""
        self._names.append(name)
        depth = len(self._names)
        self._reading = False
        if depth > self._max_depth:
            self._sink.nested_too_deep()
        if self._item_depth == 0:
            if name in ITEM_NAMES and parent in ITEM_PARENTS:
                self._item_depth, self._fields, self._fields_seen = depth, {}, 0
        elif depth == self._item_depth + 1:
            self._fields_seen += 1
            if self._fields_seen <= self._max_fields:
                self._start_field(name, attributes)

    def _start_field(self, name: str, attributes: list[str]) -> None:
        if name == "link":
            # ordered attributes: [name, value, name, value, ...]; namespaced ones are 'ns}rel'
            pairs = dict(zip(attributes[::2], attributes[1::2], strict=True))
            if "href" in pairs:  # Atom: the link is an attribute
                if pairs.get("rel", "").strip() in LINK_RELATIONS and "link" not in self._fields:
                    self._fields["link"] = pairs["href"].strip()
                return
        if (name == "link" or name in DATE_FIELDS) and name not in self._fields:
            self._field, self._text, self._reading = name, [], True

    def data(self, text: str) -> None:
        if self._reading:
            self._text.append(text)

    def end(self, _tag: str) -> None:
        self._sink.events += 1
        depth = len(self._names)
        self._names.pop()
        self._reading = False
        if self._field and depth == self._item_depth + 1:
            self._fields[self._field] = "".join(self._text).strip()
            self._field = ""
        elif depth == self._item_depth:
            self._item_depth = 0
            self._end_item()
        if depth == 1:
            self._sink.root_ended = True

    def _end_item(self) -> None:
        link = self._fields.get("link")
        if not link:
            return
        date_field = next((name for name in DATE_FIELDS if self._fields.get(name)), "")
        self._sink.add_feed_item(link, self._fields.get(date_field), date_field == "pubDate")

    def close(self) -> None:
        pass
