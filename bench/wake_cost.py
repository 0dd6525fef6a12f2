"""What the same work costs after a pause, on this machine: the yardstick for a polite crawl.

A crawl held to 2 pages a second does each page's steps alone, every thread waking from a
pause of about half a second; an unbound crawl does them back to back. This times three
kinds of work in one process, back to back and then each after a sleep, and prints the CPU a
call (`time.process_time`, every thread of the process):

- python: a little pure-Python work (a JSON round trip of a page-sized record and a regex
  over it), standing for the parse and the bookkeeping;
- socket: ten 100-byte round trips over a local socket pair, standing for the Redis,
  PostgreSQL and AMQP round trips;
- hand-off: a token handed to another thread and back, standing for the hand-offs between a
  worker's threads (the broker's thread, a handler, the hold timer, the result writer).

The difference between the columns is what a wake-up after a pause costs, whatever the
pipeline does. Nothing here talks to anything but itself.

    python -m bench.wake_cost                    # pauses of 5 ms, 50 ms and 500 ms
    python -m bench.wake_cost --pauses 0.5 --calls 60
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import threading
import time
from collections.abc import Callable

HOT_CALLS = 400  # back to back: enough for a steady figure, over in about a second
RECORD = {
    "url": "http://a.test/page",
    "links": [f"http://a.test/{i}" for i in range(40)],
    "text": "lorem " * 500,
}
WORD = re.compile(r"\w+")


def python_work() -> None:
    for _ in range(20):
        text = json.dumps(RECORD)
        json.loads(text)
        WORD.findall(text, 0, 2000)


class SocketWork:
    def __init__(self) -> None:
        self.near, self.far = socket.socketpair()

    def __call__(self) -> None:
        for _ in range(10):
            self.near.sendall(b"x" * 100)
            self.far.recv(100)
            self.far.sendall(b"y" * 100)
            self.near.recv(100)

    def close(self) -> None:
        self.near.close()
        self.far.close()


class HandOff:
    """A token to another thread and back, as a worker hands a message to a handler thread and
    gets its outcome back."""

    def __init__(self) -> None:
        self.there, self.back = threading.Event(), threading.Event()
        threading.Thread(target=self._other, daemon=True).start()

    def _other(self) -> None:
        while True:
            self.there.wait()
            self.there.clear()
            self.back.set()

    def __call__(self) -> None:
        self.there.set()
        self.back.wait()
        self.back.clear()


def cpu_us_per_call(work: Callable[[], object], calls: int, pause_s: float) -> float:
    work()  # warm: lazy set-up, first-call paths
    spent = 0
    for _ in range(calls):
        if pause_s:
            time.sleep(pause_s)
        started = time.process_time_ns()
        work()
        spent += time.process_time_ns() - started
    return spent / calls / 1000


def pauses_s(text: str) -> list[float]:
    """An argparse type: comma-separated pauses in seconds, each above 0."""
    try:
        pauses = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of seconds: {text!r}") from None
    if any(not p > 0 for p in pauses):
        raise argparse.ArgumentTypeError(f"every pause must be above 0 s: {text!r}")
    return pauses


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.wake_cost", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pauses",
        type=pauses_s,
        default="0.005,0.05,0.5",
        help="comma-separated pauses, seconds (default 0.005,0.05,0.5)",
    )
    parser.add_argument("--calls", type=int, default=40, help="calls after each pause (default 40)")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("need --calls >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sockets = SocketWork()
    kinds: dict[str, Callable[[], None]] = {"python": python_work, "socket": sockets, "hand-off": HandOff()}
    header = ["work", "back to back", *(f"after {p * 1000:g} ms" for p in args.pauses)]
    print(" | ".join(header))
    for name, work in kinds.items():
        hot = cpu_us_per_call(work, HOT_CALLS, 0.0)
        cold = [cpu_us_per_call(work, args.calls, pause) for pause in args.pauses]
        cells = [f"{hot:.0f} us", *(f"{c:.0f} us ({c / hot:.1f}x)" for c in cold)]
        print(" | ".join([name, *cells]), flush=True)
    sockets.close()
    print("CPU a call, every thread of this process; a pause is a sleep before each call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
