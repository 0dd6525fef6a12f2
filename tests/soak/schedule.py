"""The nemesis's schedule, drawn from one seed: the same seed and length give the same faults at
the same moments, so a failing soak is replayed with SOAK_SEED.

Each fault has a kind, a target, a start (seconds into the soak) and how long it holds:

    kill      SIGKILL a pipeline process; it is started again after `hold_s`
    pause     SIGSTOP a process for `hold_s` (past its heartbeat), then SIGCONT
    outage    stop one of the soak's own services (amqp, redis, postgres) for `hold_s`
    delay     add `delay_ms` of latency, each way, to the link to a service, for `hold_s`
    stall     forward nothing on the link to a service (packets dropped) for `hold_s`
    reset     reset every connection on the link to a service (instant)

Every (kind, target) pair comes at least once; the rest are drawn at random. Faults on one target
never overlap (one cannot restart Redis while it is down), faults on different targets do: some
are placed on purpose inside a fault already under way.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass

PROCESSES = (
    "worker",  # a lone worker process
    "pool-child",  # one worker of the pool, which the pool forks again
    "pool-parent",  # the pool's parent: its workers die with it
    "producer-service",
    "frontier",
    "dlq_consumer",
    "renderer",
    "dashboard",
)
# What a pause can starve past its heartbeat: the processes with a broker connection or a
# Redis liveness key (the dashboard has neither; a pool's parent only supervises).
PAUSABLE = ("worker", "pool-child", "producer-service", "frontier", "dlq_consumer", "renderer")
SERVICES = ("amqp", "redis", "postgres")
LINK_KINDS = ("delay", "stall", "reset")
KINDS = ("kill", "pause", "outage", *LINK_KINDS)

# Seconds a fault holds, by kind: (least, most).
HOLD_S = {
    "kill": (0.0, 5.0),
    "pause": (14.0, 24.0),  # HEARTBEAT_S is 5 in the soak: the broker gives up after 2 missed
    "outage": (2.0, 15.0),
    "delay": (3.0, 20.0),
    "stall": (1.0, 12.0),
    "reset": (0.0, 0.0),
}
DELAY_MS = (20, 400)
GAP_S = 1.0  # between two faults on one target
OVERLAPPING_SHARE = 0.3  # of the drawn faults, placed to start inside another one


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: str
    hold_s: float
    delay_ms: int = 0

    @property
    def ends_s(self) -> float:
        return self.at_s + self.hold_s

    def describe(self) -> str:
        extra = f" +{self.delay_ms} ms" if self.kind == "delay" else ""
        return f"{self.at_s:8.1f}s  {self.kind:<6} {self.target:<16} for {self.hold_s:5.1f}s{extra}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def targets_of(kind: str) -> tuple[str, ...]:
    return {"kill": PROCESSES, "pause": PAUSABLE, "outage": SERVICES}.get(kind, SERVICES)


def every_pair() -> list[tuple[str, str]]:
    return [(kind, target) for kind in KINDS for target in targets_of(kind)]


def draw(seed: int, window_s: float, faults_per_minute: float = 4.0, warmup_s: float = 20.0) -> list[Fault]:
    """The schedule of a soak whose faults fall within (warmup_s, window_s), sorted by start."""
    if window_s <= warmup_s:
        raise ValueError(f"a fault window of {window_s} s leaves no time after the {warmup_s} s warm-up")
    chaos = random.Random(seed)
    pairs = every_pair()
    chaos.shuffle(pairs)
    wanted = max(len(pairs), round(faults_per_minute * window_s / 60))
    pairs += [_pair(chaos) for _ in range(wanted - len(pairs))]
    span = (warmup_s, window_s)
    faults: list[Fault] = []
    for kind, target in pairs:
        host = chaos.choice(faults) if faults and chaos.random() < OVERLAPPING_SHARE else None
        fault = _fault(chaos, kind, target, span, inside=host)
        faults.append(_free_slot(fault, faults, span))
    return sorted((f for f in faults if f.at_s < window_s), key=lambda f: (f.at_s, f.kind, f.target))


def _pair(chaos: random.Random) -> tuple[str, str]:
    kind = chaos.choice(KINDS)
    return kind, chaos.choice(targets_of(kind))


def _fault(
    chaos: random.Random, kind: str, target: str, span: tuple[float, float], inside: Fault | None
) -> Fault:
    least, most = HOLD_S[kind]
    hold = round(chaos.uniform(least, most), 1)
    if inside is not None and inside.hold_s > 0:
        at = chaos.uniform(inside.at_s, inside.ends_s)  # starts while `inside` holds
    else:
        at = chaos.uniform(*span)
    delay_ms = chaos.randint(*DELAY_MS) if kind == "delay" else 0
    return Fault(round(min(at, span[1] - 1), 1), kind, target, hold, delay_ms)


def _free_slot(fault: Fault, placed: list[Fault], span: tuple[float, float]) -> Fault:
    """`fault` at its drawn moment if nothing it collides with holds then; else at the first
    free moment after it, or failing that (past the window) the first free one in the window."""
    same = [f for f in placed if _collide(f, fault)]

    def free(at: float) -> bool:
        return all(at > f.ends_s + GAP_S or at + fault.hold_s + GAP_S < f.at_s for f in same)

    later = sorted(f.ends_s + GAP_S + 0.1 for f in same if f.ends_s >= fault.at_s)
    earlier = [span[0], *sorted(f.ends_s + GAP_S + 0.1 for f in same)]
    for at in [fault.at_s, *later, *earlier]:
        if free(at) and span[0] <= at < span[1] - 1:
            return Fault(round(at, 1), fault.kind, fault.target, fault.hold_s, fault.delay_ms)
    return fault  # the window is full on this target: it overlaps, which _at() tolerates


def _collide(a: Fault, b: Fault) -> bool:
    """Faults that cannot hold at once: on one target, or two on the same process role
    (a paused process cannot also be killed and restarted)."""
    return a.target == b.target and (a.kind in LINK_KINDS) == (b.kind in LINK_KINDS)


def overlapping(faults: list[Fault]) -> list[tuple[Fault, Fault]]:
    """Pairs of faults that hold at the same moment (a reset counts at its instant)."""
    pairs = []
    ordered = sorted(faults, key=lambda f: f.at_s)
    for i, first in enumerate(ordered):
        for second in ordered[i + 1 :]:
            if second.at_s > first.ends_s:
                break
            pairs.append((first, second))
    return pairs


def load(text: str) -> list[Fault]:
    """A schedule as printed by a soak (one JSON object a line), to read back."""
    return [Fault(**json.loads(line)) for line in text.splitlines() if line.strip().startswith("{")]
