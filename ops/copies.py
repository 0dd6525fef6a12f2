"""How many messages the broker got from a run's producers, from the run's own counters.

A producer killed with SIGKILL cannot count what it sent before it died, so no producer figure
says how many messages the broker received. Two counts together do:

    enqueued.<queue>   each URL once for the whole run, when a producer marks it confirmed
                       (producer/in_flight.py): the first copies
    copies_received    each producer message at its first delivery to a worker
                       (worker/handling/handled.py), second copies included

Once the run's work queues are drained, the broker received `copies_received` messages from
producers, of which `enqueued` first copies and the rest second copies: URLs a producer
published and died before marking, then published again by the run that took its claim over.
A copy that arrives after its URL is settled is acked unfetched
(`duplicate_deliveries.copy` at its first delivery, `.forwarded` when it comes back from a
defer or retry queue); one that arrives while the other copy is still being handled, or of a URL
that ended dead, is handled again (fetched again, still one outcome). Before the queues are
drained these are the copies delivered so far.

One case leaves the figure a bound instead: a worker that lost its connection before it had
looked at messages it held (its prefetch) gives them back `redelivered`, uncounted. Then the
broker received between `copies_received` and that plus `copies_redelivered`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Copies:
    first: int  # URLs enqueued, each counted once
    delivered: int  # producer messages delivered to a worker at least once
    redelivered: int  # producer messages delivered again (a worker lost its connection)
    # Producer messages acked unfetched because their URL was settled: at their first delivery
    # (`duplicate_deliveries.copy`), or coming back from a defer or retry queue
    # (`.forwarded`). Without lost workers, each is a second copy, or a first copy whose
    # second copy was handled first.
    second_acked: int
    taken_over: int  # claims of a dead producer taken over
    republished: int  # of those, published again by the run that took them

    @classmethod
    def from_counters(cls, counters: Mapping[str, object]) -> Copies:
        def count(name: str) -> int:
            value = counters.get(name, 0)
            return value if isinstance(value, int) else 0

        return cls(
            first=sum(
                n for name, n in counters.items() if name.startswith("enqueued.") and isinstance(n, int)
            ),
            delivered=count("copies_received"),
            redelivered=count("copies_redelivered"),
            second_acked=count("duplicate_deliveries.copy") + count("duplicate_deliveries.forwarded"),
            taken_over=count("taken_over"),
            republished=count("republished"),
        )

    @property
    def second(self) -> int:
        """Second copies delivered so far (0 until more than the first copies were delivered)."""
        return max(0, self.delivered - self.first)

    @property
    def second_handled_again(self) -> int:
        """Second copies that were not acked unfetched: handled while their first copy was in
        flight, or of a URL that ended dead (dead letters are not marked). Each costs at most
        the fetches of one URL."""
        return max(0, self.second - self.second_acked)

    def figures(self) -> dict[str, int]:
        """For `status --json`: the counts and what follows from them."""
        return {
            **dataclasses.asdict(self),
            "second": self.second,
            "second_handled_again": self.second_handled_again,
        }

    def lines(self, width: int = 18) -> list[str]:
        """The report's lines: takeovers, then the broker's copies."""
        lines = []
        if self.taken_over or self.republished:
            lines.append(
                f"  {'taken over':<{width}}{self.taken_over:6d}   claims of a dead producer; "
                f"{self.republished} re-published (fate unknown: the broker may hold an earlier copy)"
            )
        if self.delivered:
            bound = f" (+ up to {self.redelivered} redelivered uncounted)" if self.redelivered else ""
            lines.append(
                f"  {'broker copies':<{width}}{self.delivered:6d}   delivered so far{bound}: "
                f"{min(self.delivered, self.first)} first + {self.second} second copies "
                f"({self.second_acked} acked unfetched, {self.second_handled_again} handled again); "
                "all the broker received once the queues are drained"
            )
        return lines
