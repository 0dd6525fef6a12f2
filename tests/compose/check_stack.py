"""The compose stack, run for real: `make compose-test` (tests/compose/run.sh) runs this against
a Docker daemon of its own, with the images already built.

    all services healthy -> the demo run crawling -> scale to 6 workers mid-crawl (no new run)
    -> SIGKILL one worker container -> `stop worker` / `start worker` -> the run fully accounted
    -> `up` once more (still no new run) -> every PromQL expression of the Grafana dashboard has
    data in the stack's Prometheus -> `down -v`

It asserts that no URL was lost (stored + dead letters + skips == enqueued, queues empty) and
none duplicated (one outcome per URL, one run, the sitemaps read once), and prints the time to
healthy, the time to accounted and pages/s. Everything goes through docker-compose, as a user
would type it; the checks read PostgreSQL, Redis and RabbitMQ inside their containers and
Prometheus on its published port.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/dashboards/crawl.json"
RUN_ID = "compose-demo"  # the run the compose file's producer seeds
NAMESPACE = "crawl"  # CRAWL_NAMESPACE's default, which the compose demo keeps
WORKERS, SCALED_WORKERS = 3, 6
WORKER_PROCESSES = 2  # a pool in every worker container, so Prometheus must find every process
# Bigger and slower than `make demo`, so that scaling, killing and stopping happen mid-crawl.
DEMO_PAGES_PER_HOST = 250
DEMO_SLOW_MS = 300
HEALTHY_TIMEOUT_S = 300
ACCOUNTED_TIMEOUT_S = 900
# Metrics the demo crawl cannot move, with the reason; their expressions are reported, not
# asserted. Every other expression of the dashboard must return data.
NO_DATA_EXPECTED: dict[str, str] = {
    # The render profile is off in this stack, and the demo site has no script-built page.
    "crawl_renders_total": "no renderer runs without --profile render",
    "crawl_sent_to_render_total": "the demo site has no page built by scripts",
    "crawl_render_requests_refused_total": "no renderer runs without --profile render",
    # The stack's workers fetch directly.
    "crawl_proxy_usable": "no PROXIES in this stack",
    "crawl_proxy_failures_total": "no PROXIES in this stack",
}


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def say(message: str) -> None:
    print(f"compose-test: {message}", flush=True)


class Stack:
    """docker-compose on this checkout, with an env file of the test's own and a fixed project."""

    def __init__(self, project: str, env_file: Path) -> None:
        # COMPOSE names another Compose, e.g. a v2 binary: the file is meant for both. v2
        # without buildx falls back to a builder that asks the daemon for its `bridge` network,
        # which a daemon started with --bridge=none lacks: COMPOSE_BUILD then names the one
        # that builds (v1, which leaves the network to the daemon).
        command = shlex.split(os.environ.get("COMPOSE", "docker-compose"))
        builder = shlex.split(os.environ.get("COMPOSE_BUILD", " ".join(command)))
        self.base, self.build_base = (
            [
                *c,
                "--project-name",
                project,
                "--env-file",
                str(env_file),
                "--file",
                str(REPO / "docker-compose.yml"),
                "--project-directory",
                str(REPO),
            ]
            for c in (command, builder)
        )

    def run(self, *args: str, check_: bool = True, timeout: float = 600) -> str:
        base = self.build_base if args[:1] == ("build",) else self.base
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=timeout, check=False)
        if check_ and done.returncode != 0:
            raise CheckFailed(f"docker-compose {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def ids(self, service: str, *, every: bool = False) -> list[str]:
        args = ["ps", "-q", *(["-a"] if every else []), service]
        return self.run(*args, check_=False).split()

    def sql(self, query: str) -> list[list[str]]:
        out = self.run(
            "exec", "-T", "postgres", "psql", "-U", "postgres", "-d", "crawler", "-At", "-F", "|", "-c", query
        )
        return [line.split("|") for line in out.splitlines() if line]

    def redis(self, *command: str) -> str:
        return self.run("exec", "-T", "redis", "redis-cli", "--raw", *command).strip()


def docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise CheckFailed(f"docker {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def inspect(container: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(docker("inspect", container))[0]
    return found


def wait_for(what: str, probe: Callable[[], bool], timeout_s: float, every_s: float = 2.0) -> float:
    started = time.monotonic()
    while not probe():
        if time.monotonic() - started > timeout_s:
            raise CheckFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)
    return time.monotonic() - started


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def write_env_file(path: Path) -> dict[str, str]:
    """.env.example as a user copies it, with the passwords set and the published ports moved
    off the ones this machine's own services hold."""
    values = {
        "RABBITMQ_DEFAULT_PASS": "rabbit-" + secrets.token_hex(8),
        "POSTGRES_PASSWORD": "postgres-" + secrets.token_hex(8),
        "GRAFANA_ADMIN_PASSWORD": "grafana-" + secrets.token_hex(8),
        "RABBITMQ_MANAGEMENT_PORT": str(free_port()),
        "PROMETHEUS_PORT": str(free_port()),
        "GRAFANA_PORT": str(free_port()),
        "WORKER_PROCESSES": str(WORKER_PROCESSES),
        "DEMO_PAGES_PER_HOST": str(DEMO_PAGES_PER_HOST),
        "DEMO_SLOW_MS": str(DEMO_SLOW_MS),
        "DASHBOARD_TOKEN": secrets.token_urlsafe(32),
        "DASHBOARD_PORT": str(free_port()),
    }
    lines = []
    for line in (REPO / ".env.example").read_text(encoding="utf-8").splitlines():
        name = line.partition("=")[0]
        lines.append(f"{name}={values.pop(name)}" if name in values and not line.startswith("#") else line)
    lines += [f"{name}={value}" for name, value in values.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dict(line.partition("=")[::2] for line in lines if line and not line.startswith("#"))


# --- What the stack holds ---------------------------------------------------------------------


def producer_summary(stack: Stack) -> dict[str, Any] | None:
    """The producer's first JSON summary in its log: the seeding's."""
    for line in stack.run("logs", "--no-color", "producer").splitlines():
        _, _, text = line.partition("| ")
        if text.startswith("{"):
            found: dict[str, Any] = json.loads(text)
            return found
    return None


def accounted(stack: Stack) -> int:
    rows = stack.sql(
        f"SELECT (SELECT count(*) FROM crawl.pages WHERE run_id = '{RUN_ID}')"
        f" + (SELECT count(*) FROM crawl.dead_letters WHERE run_id = '{RUN_ID}' AND state = 'dead')"
        f" + (SELECT count(*) FROM crawl.skips WHERE run_id = '{RUN_ID}')"
    )
    return int(rows[0][0])


def tables_exist(stack: Stack) -> bool:
    query = "SELECT to_regclass('crawl.pages') IS NOT NULL AND to_regclass('crawl.skips') IS NOT NULL"
    rows = stack.sql(query)
    return rows == [["t"]]


def runs_seen(stack: Stack) -> set[str]:
    """Every run id with an outcome row or producer counters: one, if nothing seeded twice."""
    rows = stack.sql(
        "SELECT run_id FROM crawl.pages UNION SELECT run_id FROM crawl.dead_letters"
        " UNION SELECT run_id FROM crawl.skips"
    )
    in_redis = {key.split(":")[2] for key in stack.redis("--scan", "--pattern", "crawl:run:*:stats").split()}
    return {row[0] for row in rows} | in_redis


def enqueued_in_redis(stack: Stack) -> int:
    stats = stack.redis("hgetall", f"crawl:run:{RUN_ID}:stats").split("\n")
    counters = dict(zip(stats[::2], stats[1::2], strict=False))
    return sum(int(value) for name, value in counters.items() if name.startswith("enqueued."))


def sitemap_index_reads(stack: Stack) -> int:
    log = stack.run("exec", "-T", "demo_site", "cat", "/tmp/site-requests.jsonl")
    return sum(1 for line in log.splitlines() if json.loads(line).get("path") == "/sitemap_index.xml")


def queued_messages(stack: Stack) -> int:
    out = stack.run("exec", "-T", "rabbitmq", "rabbitmqctl", "-q", "list_queues", "name", "messages")
    total = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith(NAMESPACE + ".") and parts[1].isdigit():
            # crawl.parked holds what the dead-letter recorder could not store: it counts too.
            total += int(parts[1])
    return total


def duplicated_outcomes(stack: Stack) -> int:
    """URLs of the run with more than one outcome row: two pages, a page and a dead letter, ..."""
    rows = stack.sql(
        "SELECT count(*) FROM (SELECT url FROM ("
        f" SELECT url FROM crawl.pages WHERE run_id = '{RUN_ID}'"
        f" UNION ALL SELECT url FROM crawl.dead_letters WHERE run_id = '{RUN_ID}' AND state = 'dead'"
        f" UNION ALL SELECT url FROM crawl.skips WHERE run_id = '{RUN_ID}'"
        ") outcomes GROUP BY url HAVING count(*) > 1) twice"
    )
    return int(rows[0][0])


def all_healthy(stack: Stack, services: Sequence[str]) -> bool:
    for service in services:
        ids = stack.ids(service)
        if not ids:
            return False
        for container in ids:
            state = inspect(container)["State"]
            if not state["Running"]:
                return False
            if "Health" in state and state["Health"]["Status"] != "healthy":
                return False
    return True


# --- Prometheus ---------------------------------------------------------------------------------


def dashboard_expressions() -> list[str]:
    pending = list(json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"])
    found = []
    while pending:
        panel = pending.pop(0)
        pending += panel.get("panels", [])
        found += [target["expr"] for target in panel.get("targets", [])]
    return [expr.replace("$namespace", NAMESPACE) for expr in found]


def prometheus_targets(base: str) -> list[dict[str, Any]]:
    answer = requests.get(f"{base}/api/v1/targets", timeout=10).json()
    targets: list[dict[str, Any]] = answer["data"]["activeTargets"]
    return targets


def expressions_without_data(base: str, start: float, end: float) -> list[str]:
    """Expressions whose range query over the crawl returns no series at all."""
    empty = []
    for expr in dashboard_expressions():
        answer = requests.get(
            f"{base}/api/v1/query_range",
            params={"query": expr, "start": str(start), "end": str(end), "step": "15s"},
            timeout=30,
        ).json()
        check(answer.get("status") == "success", f"Prometheus refused {expr!r}: {answer}")
        if not answer["data"]["result"]:
            empty.append(expr)
    return empty


def metric_of(expr: str) -> str:
    names = re.findall(r"\b((?:crawl|rabbitmq)_[a-z_]+)", expr)
    return names[0] if names else expr


# --- The scenario -------------------------------------------------------------------------------

# The long-running services `up` starts; the frontier and the producer service only run (they
# serve no health check: they wait on their queues).
PIPELINE = (
    "rabbitmq", "redis", "postgres", "demo_site", "worker", "dlq_consumer", "dashboard",
    "frontier", "producer_service",
)  # fmt: skip


def scenario(stack: Stack, env: dict[str, str]) -> dict[str, float]:
    figures: dict[str, float] = {}
    say("building the project's image")
    stack.run("build", timeout=900)
    started = time.monotonic()
    wall_start = time.time()
    summary, figures["healthy_s"] = bring_up(stack)
    enqueued = int(summary["enqueued_total"])

    upset_mid_crawl(stack, enqueued)
    wait_for("every URL accounted for", lambda: accounted(stack) >= enqueued, ACCOUNTED_TIMEOUT_S, 3)
    figures["accounted_s"] = time.monotonic() - started
    wall_end = time.time()
    say(f"all {enqueued} URLs accounted for {figures['accounted_s']:.1f} s after `up`")

    figures["pages_per_s"] = check_nothing_lost_or_duplicated(stack, summary)
    check_up_again_seeds_nothing(stack, enqueued)
    check_the_run_dashboard(env, enqueued)
    check_dashboard_has_data(stack, f"http://127.0.0.1:{env['PROMETHEUS_PORT']}", wall_start, wall_end)
    return figures


def bring_up(stack: Stack) -> tuple[dict[str, Any], float]:
    """`up` as a user types it (Prometheus first, so it sees the crawl from its start); every
    service healthy. Returns the producer's seeding summary and the seconds to healthy."""
    started = time.monotonic()
    stack.run("up", "-d", "prometheus")
    stack.run("up", "-d", "--scale", f"worker={WORKERS}")
    services = [*PIPELINE, "prometheus"]
    wait_for("every service healthy", lambda: all_healthy(stack, services), HEALTHY_TIMEOUT_S)
    healthy_s = time.monotonic() - started
    say(f"every service healthy {healthy_s:.1f} s after `up`")
    wait_for("the producer's summary", lambda: producer_summary(stack) is not None, 120)
    summary = producer_summary(stack)
    assert summary is not None
    check(int(summary["enqueued_total"]) > 0, f"the producer enqueued nothing: {summary}")
    check(not summary["sitemaps_failed"], f"sitemaps failed: {summary['sitemaps_failed']}")
    say(
        f"producer: {summary['urls_seen']} URLs seen, {summary['enqueued_total']} enqueued "
        f"{summary['enqueued']}, {summary['duplicates']} duplicates, invalid {summary['invalid']}"
    )
    return summary, healthy_s


def upset_mid_crawl(stack: Stack, enqueued: int) -> None:
    """Scale to 6, SIGKILL a worker container, stop every worker and start them again, each
    while URLs are still waiting."""
    wait_for(
        "the crawl to get going", lambda: tables_exist(stack) and accounted(stack) >= enqueued // 10, 300
    )
    at_scale = accounted(stack)
    check(at_scale < enqueued, "the crawl ended before it could be scaled: make the demo bigger")
    stack.run("up", "-d", "--scale", f"worker={SCALED_WORKERS}")
    check(len(stack.ids("worker")) == SCALED_WORKERS, f"scaling did not give {SCALED_WORKERS} workers")
    say(f"scaled to {SCALED_WORKERS} workers at {at_scale} of {enqueued} accounted")

    victim = stack.ids("worker")[0]
    at_kill = accounted(stack)
    docker("kill", "--signal", "KILL", victim)
    say(f"SIGKILLed worker container {victim[:12]} at {at_kill} of {enqueued} accounted")
    time.sleep(5)

    at_stop = accounted(stack)
    stack.run("stop", "worker", timeout=300)
    stopped = [inspect(c)["State"] for c in stack.ids("worker", every=True)]
    check(all(not state["Running"] for state in stopped), "`stop worker` left workers running")
    codes = sorted(state["ExitCode"] for state in stopped)
    say(f"stopped every worker at {at_stop} of {enqueued} accounted; exit codes {codes}")
    check(accounted(stack) < enqueued, "the crawl ended before the workers were stopped: make it bigger")
    stack.run("start", "worker")
    say("started the workers again")


def check_nothing_lost_or_duplicated(stack: Stack, summary: dict[str, Any]) -> float:
    """Assert lost 0 and duplicated 0, print the accounting; return pages/s."""
    enqueued = int(summary["enqueued_total"])
    # Settled: nothing left in any queue (ready, unacked, parked, waiting to be retried).
    wait_for("the queues to empty", lambda: queued_messages(stack) == 0, 120)
    final = accounted(stack)
    lost = enqueued - final
    duplicated = duplicated_outcomes(stack) + max(0, final - enqueued)
    rows = stack.sql(
        "SELECT count(*), extract(epoch FROM max(fetched_at) - min(fetched_at)) FROM crawl.pages"
        f" WHERE run_id = '{RUN_ID}'"
    )
    stored, span_s = int(rows[0][0]), float(rows[0][1] or 0)
    # The accounting as `make demo` prints it, from inside the stack.
    accounting = stack.run("exec", "-T", "worker", "python", "-m", "ops.run_report", "--run", RUN_ID)
    print(f"\n{accounting}  lost {lost}, duplicated {duplicated}\n", flush=True)
    ok = re.search(rf"accounted for +{enqueued} of {enqueued}: ok", accounting)
    check(ok is not None, "ops.run_report disagrees")
    check(lost == 0, f"lost {lost} URLs")
    check(duplicated == 0, f"duplicated {duplicated} outcomes")
    return stored / span_s if span_s else 0.0


def check_up_again_seeds_nothing(stack: Stack, enqueued: int) -> None:
    """With the producer finished, `up` starts it again: it must find the run seeded."""
    producer = stack.ids("producer", every=True)
    check(len(producer) == 1, f"{len(producer)} producer containers")
    wait_for("the producer to finish", lambda: not inspect(producer[0])["State"]["Running"], 120)
    check(inspect(producer[0])["State"]["ExitCode"] == 0, "the producer did not exit 0")
    stack.run("up", "-d", "--scale", f"worker={WORKERS}")
    wait_for("the producer to finish again", lambda: not inspect(producer[0])["State"]["Running"], 120)
    check(inspect(producer[0])["State"]["ExitCode"] == 0, "the started-again producer did not exit 0")
    logs = stack.run("logs", "--no-color", "producer")
    check('"already_seeded": true' in logs, "the started-again producer did not find the run seeded")
    check(runs_seen(stack) == {RUN_ID}, f"more than one run: {runs_seen(stack)}")
    check(sitemap_index_reads(stack) == 1, f"the sitemap index was read {sitemap_index_reads(stack)} times")
    check(enqueued_in_redis(stack) == enqueued, "the run's enqueued counters changed after seeding")
    check(accounted(stack) == enqueued, "outcomes changed after the run was accounted for")
    say("`up` with the run finished: the producer found it seeded; one run, sitemaps read once")


def check_the_run_dashboard(env: dict[str, str], enqueued: int) -> None:
    """The dashboard container: its run figures are the accounting's; without the token it
    answers 401, and to a foreign Host header 400 (DNS rebinding)."""
    base = f"http://127.0.0.1:{env['DASHBOARD_PORT']}"
    token = {"Authorization": f"Bearer {env['DASHBOARD_TOKEN']}"}
    run = requests.get(f"{base}/api/v1/runs/{RUN_ID}", headers=token, timeout=30).json()
    check(run["enqueued"] == enqueued, f"dashboard: enqueued {run['enqueued']}, the producer said {enqueued}")
    check(
        run["stored"] + run["dead"] + run["skipped"] == enqueued and run["left"] == 0,
        f"dashboard: the run's figures do not add up: {run['identity']}",
    )
    check(requests.get(f"{base}/api/v1/runs", timeout=10).status_code == 401, "dashboard: no token, no 401")
    foreign = requests.get(f"{base}/healthz", headers={"Host": "evil.example"}, timeout=10)
    check(foreign.status_code == 400, f"dashboard: a foreign Host got {foreign.status_code}")
    stats = requests.get(f"{base}/stats", headers=token, timeout=30).json()
    check(set(stats) == {"workers", "tasks", "throughput"}, f"dashboard: /stats is {stats}")
    say(
        f"dashboard: {run['stored']} stored, {run['dead']} dead, {run['skipped']} skipped, 401 and 400 as due"
    )


def check_dashboard_has_data(stack: Stack, prometheus: str, start: float, end: float) -> None:
    """Every process of every worker container is a target that is up, and every expression
    of the dashboard has data over the crawl."""
    processes = WORKERS * WORKER_PROCESSES

    def worker_processes_up() -> bool:
        targets = prometheus_targets(prometheus)
        up = [t for t in targets if t["labels"]["job"] == "worker" and t["health"] == "up"]
        return len(up) == processes

    wait_for(f"Prometheus to scrape {processes} worker processes", worker_processes_up, 120)
    say(f"Prometheus scrapes {processes} worker processes ({WORKERS} containers x {WORKER_PROCESSES})")
    expressions = dashboard_expressions()
    empty = expressions_without_data(prometheus, start, end + 30)
    unexpected = [expr for expr in empty if metric_of(expr) not in NO_DATA_EXPECTED]
    for expr in empty:
        if expr not in unexpected:
            say(f"no data, as expected ({NO_DATA_EXPECTED[metric_of(expr)]}): {expr}")
    for expr in set(expressions) - set(empty):
        if metric_of(expr) in NO_DATA_EXPECTED:
            say(f"has data now, take {metric_of(expr)} out of NO_DATA_EXPECTED: {expr}")
    check(not unexpected, "dashboard expressions without data:\n  " + "\n  ".join(unexpected))
    say(f"{len(expressions) - len(empty)} of {len(expressions)} dashboard expressions return data")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", default="crawlci", help="compose project name")
    parser.add_argument("--work-dir", required=True, help="where the env file and logs go")
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    env_file = work / "env"
    env = write_env_file(env_file)
    stack = Stack(args.project, env_file)
    stack.run("--profile", "monitoring", "down", "-v", "--remove-orphans", check_=False)
    code = 0
    try:
        figures = scenario(stack, env)
        print(
            f"compose-test: ok: healthy in {figures['healthy_s']:.1f} s, accounted in "
            f"{figures['accounted_s']:.1f} s, {figures['pages_per_s']:.1f} pages/s",
            flush=True,
        )
    except (CheckFailed, subprocess.TimeoutExpired, requests.RequestException) as exc:
        say(f"FAILED: {exc}")
        (work / "compose.log").write_text(
            stack.run("--profile", "monitoring", "logs", "--no-color", check_=False), encoding="utf-8"
        )
        say(f"the services' logs are in {work / 'compose.log'}")
        code = 1
    finally:
        stack.run("--profile", "monitoring", "down", "-v", "--remove-orphans", check_=False, timeout=300)
        label = f"label=com.docker.compose.project={args.project}"
        left = (
            docker("ps", "-aq", "--filter", label).split()
            + docker("volume", "ls", "-q", "--filter", label).split()
        )
        if left:
            say(f"FAILED: `down -v` left containers or volumes: {left}")
            code = 1
        else:
            say("`down -v` removed every container, network and volume of the stack")
    return code


if __name__ == "__main__":
    sys.exit(main())
