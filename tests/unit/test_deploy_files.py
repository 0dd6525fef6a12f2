"""Static checks of docker-compose.yml, Dockerfile, .dockerignore, .env.example and the monitoring
files under deploy/: nothing here needs a container engine, so a broken deployment file fails in
the unit tests."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from ops.dashboard.config import DashboardSettings
from shared import metrics
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
BACKING_SERVICES = ("rabbitmq", "redis", "postgres")
PIPELINE_SERVICES = ("producer", "producer_service", "worker", "dlq_consumer")
APP_MODULES = {"producer", "worker", "dlq_consumer", "demo_site", "renderer"}
# Operator commands compose runs as services beside the pipeline.
OPERATOR_MODULES = {"ops.dashboard"}
# Variables only compose reads (to configure RabbitMQ, PostgreSQL and Grafana, and build the URLs).
COMPOSE_CREDENTIALS = {
    "RABBITMQ_DEFAULT_USER",
    "RABBITMQ_DEFAULT_PASS",
    "POSTGRES_PASSWORD",
    "GRAFANA_ADMIN_PASSWORD",
}
# Variables only compose reads besides those: published ports and the demo site's size.
COMPOSE_ONLY = COMPOSE_CREDENTIALS | {
    "RABBITMQ_MANAGEMENT_PORT",
    "PROMETHEUS_PORT",
    "GRAFANA_PORT",
    "DEMO_PAGES_PER_HOST",
    "DEMO_SLOW_MS",
}
# The passwords each container may see, and no others.
SECRETS_NEEDED = {
    "rabbitmq": {"RABBITMQ_DEFAULT_PASS"},
    "postgres": {"POSTGRES_PASSWORD"},
    "grafana": {"GRAFANA_ADMIN_PASSWORD"},
    "dashboard": {"RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD", "DASHBOARD_TOKEN"},
    "producer": {"RABBITMQ_DEFAULT_PASS"},
    "producer_service": {"RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD"},
    "frontier": {"RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD"},
    "worker": {"RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD"},
    "worker-priority": {"RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD"},
    "dlq_consumer": {"RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD"},
    "renderer": {"RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD"},
}
# The service addresses, which compose builds for each pipeline service itself.
SERVICE_URLS = {"AMQP_URL", "REDIS_URL", "DATABASE_URL"}
MONITORING_SERVICES = ("prometheus", "grafana")
# Pools that serve some of the work queues only (python -m worker --queues), beside the
# general workers, under a profile of their own.
DEDICATED_WORKERS = {"worker-priority": ["priority"]}
RABBITMQ_PROMETHEUS_PORT = 15692
# Per-queue metrics of the rabbitmq_prometheus plugin the dashboard may use, with the family of
# /metrics/detailed that returns each.
RABBITMQ_QUEUE_METRICS = {
    "rabbitmq_detailed_queue_messages_ready": "queue_coarse_metrics",
    "rabbitmq_detailed_queue_messages_unacked": "queue_coarse_metrics",
    "rabbitmq_detailed_queue_messages": "queue_coarse_metrics",
    "rabbitmq_detailed_queue_consumers": "queue_consumer_count",
}
SETTINGS_VARS = {f.name.upper() for f in dataclasses.fields(Settings)}
# The dashboard's own settings (ops/dashboard/config.py): only its container gets them.
DASHBOARD_VARS = {f"DASHBOARD_{f.name.upper()}" for f in dataclasses.fields(DashboardSettings)}
DASHBOARD_SECRETS = {"DASHBOARD_TOKEN", "DASHBOARD_VIEW_TOKEN"}
REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<rule>:[-?])?(?P<word>[^}]*)\}")


def compose_text() -> str:
    return (REPO / "docker-compose.yml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(compose_text())
    found: dict[str, dict[str, Any]] = document["services"]
    return found


def env_example() -> dict[str, str]:
    """The variables of .env.example, values unquoted the way compose and a shell read them."""
    values: dict[str, str] = {}
    for line in (REPO / ".env.example").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        assert name not in values, f"{name} is set twice in .env.example"
        values[name] = value
    return values


def interpolate(text: str, values: dict[str, str] | None = None) -> str:
    """Compose's ${NAME}, ${NAME:-default} and ${NAME:?error} substitution, fed from .env.example."""
    given = env_example() if values is None else values

    def value(match: re.Match[str]) -> str:
        found = given.get(match["name"], "")
        if match["rule"] == ":-" and not found:
            return match["word"]
        assert found or match["rule"] != ":?", f"{match['name']} must be set"
        return found

    return REFERENCE.sub(value, text)


def environment(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment", {})
    if isinstance(raw, list):
        return dict(item.partition("=")[::2] for item in raw)
    return {str(k): str(v) for k, v in raw.items()}


def command(service: dict[str, Any]) -> list[str]:
    raw = service["command"]
    return shlex.split(raw) if isinstance(raw, str) else [str(part) for part in raw]


def app_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services running this project's image: the ones built from the Dockerfile."""
    return {name: service for name, service in services.items() if "build" in service}


def project_packages() -> set[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*") for pattern in patterns}


def test_compose_has_every_service(services: dict[str, dict[str, Any]]) -> None:
    assert {*BACKING_SERVICES, *PIPELINE_SERVICES, "demo_site"} <= set(services)


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        image = service.get("image")
        assert image or "build" in service, f"{name}: neither image nor build"
        if not image:
            continue
        repository, _, tag = image.rpartition(":")
        assert repository and tag, f"{name}: image {image!r} has no tag"
        assert "latest" not in tag, f"{name}: image {image!r} is not pinned"
        if "build" not in service:
            # A pulled image needs a version in its tag, not only a name like "alpine".
            assert re.search(r"[0-9]", tag), f"{name}: image {image!r} has no version"


def test_worker_can_be_scaled(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker
    assert not worker.get("ports")


def test_pipeline_services_wait_for_healthy_backing_services(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in PIPELINE_SERVICES:
        depends_on = services[name]["depends_on"]
        assert isinstance(depends_on, dict), f"{name}: depends_on needs conditions"
        for backing in BACKING_SERVICES:
            assert depends_on.get(backing, {}).get("condition") == "service_healthy", (
                f"{name} must wait for {backing} to be healthy"
            )


def test_every_awaited_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        depends_on = service.get("depends_on", {})
        conditions = depends_on if isinstance(depends_on, dict) else {}
        for target, rule in conditions.items():
            if rule.get("condition") == "service_healthy":
                assert services[target].get("healthcheck", {}).get("test"), (
                    f"{name} waits for {target} to be healthy, but {target} has no healthcheck"
                )
    for backing in BACKING_SERVICES:
        assert services[backing]["healthcheck"]["test"]


def test_published_ports_bind_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name}: port {port!r} is reachable from other machines"


def test_management_ui_is_published(services: dict[str, dict[str, Any]]) -> None:
    assert [interpolate(port) for port in services["rabbitmq"]["ports"]] == ["127.0.0.1:15672:15672"]


def test_published_host_ports_can_be_moved(services: dict[str, dict[str, Any]]) -> None:
    """The machine may already run RabbitMQ, Prometheus or Grafana on their usual ports."""
    for name, service in services.items():
        for port in service.get("ports", []):
            assert re.fullmatch(r"127\.0\.0\.1:\$\{[A-Z_]+_PORT:-\d+\}:\d+", str(port)), (
                f"{name}: host port {port!r} is fixed"
            )
    moved = {"RABBITMQ_MANAGEMENT_PORT": "25672"}
    assert interpolate(services["rabbitmq"]["ports"][0], moved) == "127.0.0.1:25672:15672"


def test_backing_services_restart(services: dict[str, dict[str, Any]]) -> None:
    for name in BACKING_SERVICES:
        assert services[name].get("restart") in ("unless-stopped", "always"), f"{name} has no restart policy"


def test_rabbitmq_is_healthy_only_when_it_takes_connections(services: dict[str, dict[str, Any]]) -> None:
    """`rabbitmq-diagnostics ping` answers before the AMQP listener accepts connections."""
    test = services["rabbitmq"]["healthcheck"]["test"]
    assert test[-1] == "check_port_connectivity" and "ping" not in test
    amqp = urlsplit(interpolate(environment(services["worker"])["AMQP_URL"]))
    # ... and a service started a moment too early tries again before it gives up.
    assert "connection_attempts=" in amqp.query and "retry_delay=" in amqp.query


def test_producer_seeds_one_fixed_run_once(services: dict[str, dict[str, Any]]) -> None:
    """`up --scale worker=N` starts a finished producer again: it must find its run seeded."""
    words = command(services["producer"])
    assert words[words.index("--run-id") + 1]
    assert "--once" in words
    assert services["producer"]["restart"].startswith("on-failure"), "a finished seeding must not restart"


def test_the_demo_hosts_pass_the_address_guard(services: dict[str, dict[str, Any]]) -> None:
    """site-a... resolve to private addresses of the compose network, which the guard refuses."""
    from shared.http.addresses import parse_allowlist

    names = next(w for w in command(services["demo_site"]) if w.startswith("--public-names="))
    for name in ("producer", "worker"):
        allowlist = parse_allowlist(interpolate(environment(services[name])["FETCH_ALLOWLIST"]))
        for host in names.partition("=")[2].split(","):
            assert allowlist.allows_host(host), f"{name}: the guard refuses the demo host {host}"


def test_each_container_gets_only_the_passwords_it_needs(services: dict[str, dict[str, Any]]) -> None:
    values = env_example()
    for name, service in services.items():
        assert "env_file" not in service, f"{name}: env_file hands it every password in .env"
        seen = json.dumps({k: interpolate(v) for k, v in environment(service).items()})
        passwords = (COMPOSE_CREDENTIALS | DASHBOARD_SECRETS) - {"RABBITMQ_DEFAULT_USER"}
        given = {secret for secret in passwords if values[secret] and values[secret] in seen}
        assert given == SECRETS_NEEDED.get(name, set()), f"{name} gets {given}"


def test_pipeline_services_pass_every_setting_through(services: dict[str, dict[str, Any]]) -> None:
    """A setting in .env reaches every pipeline service, under its own name."""
    for name in PIPELINE_SERVICES:
        env = environment(services[name])
        missing = SETTINGS_VARS - SERVICE_URLS - set(env)
        assert not missing, f"{name}: settings in .env that never reach it: {missing}"
        for variable, value in env.items():
            for match in REFERENCE.finditer(value):
                if variable not in SERVICE_URLS:
                    assert match["name"] == variable, f"{name}: {variable} reads ${{{match['name']}}}"


def test_no_default_guest_credentials() -> None:
    assert "guest" not in compose_text().lower()


def test_redis_never_evicts_state(services: dict[str, dict[str, Any]]) -> None:
    words = command(services["redis"])
    assert words[words.index("--maxmemory-policy") + 1] == "noeviction"


def test_app_commands_run_a_package_of_this_repository(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in app_services(services).items():
        words = command(service)
        assert words[:2] == ["python", "-m"], f"{name}: command {words} is not python -m <package>"
        assert words[2] in APP_MODULES | OPERATOR_MODULES, f"{name}: unexpected module {words[2]}"
        assert module_source(words[2]).is_file(), f"{name}: {words[2]} has no __main__.py"


def module_source(module: str) -> Path:
    base = REPO.joinpath(*module.split("."))
    return base / "__main__.py" if base.is_dir() else base.with_suffix(".py")


def service_modules_named_in(source: Path) -> set[str]:
    """Service packages a launcher module starts: named as strings or imported from."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and node.value in APP_MODULES:
            found.add(node.value)
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module.split(".")[0]} & APP_MODULES
    return found


def modules_started_by_makefile(text: str) -> set[str]:
    """Service packages the Makefile starts: directly (`-m worker`) or through a launcher module
    of this repository that it runs (`-m ops.crawl`). `-m` also runs tools (pytest, mypy) and
    selects pytest markers; those are not the project's and are left out."""
    named = set(re.findall(r"-m\s+([A-Za-z_][A-Za-z0-9_.]*)", text))
    started = named & APP_MODULES
    for module in named - APP_MODULES:
        if module.split(".")[0] in project_packages() and module_source(module).is_file():
            started |= service_modules_named_in(module_source(module))
    return started


def test_compose_runs_the_same_modules_as_the_makefile(
    services: dict[str, dict[str, Any]],
) -> None:
    in_compose = {command(service)[2] for service in app_services(services).values()} - OPERATOR_MODULES
    assert in_compose == APP_MODULES
    makefile = REPO / "Makefile"
    if not makefile.exists():
        pytest.skip("no Makefile yet")
    assert modules_started_by_makefile(makefile.read_text(encoding="utf-8")) == in_compose


def test_pipeline_services_reach_the_compose_services(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in PIPELINE_SERVICES:
        env = {key: interpolate(value) for key, value in environment(services[name]).items()}
        assert urlsplit(env["AMQP_URL"]).hostname == "rabbitmq"
        assert urlsplit(env.get("REDIS_URL", "redis://redis")).hostname == "redis"
        assert urlsplit(env.get("DATABASE_URL", "postgresql://postgres")).hostname == "postgres"
        # The credentials come from .env, the same ones the backing services are given.
        amqp = urlsplit(env["AMQP_URL"])
        assert (amqp.username, amqp.password) == (
            env_example()["RABBITMQ_DEFAULT_USER"],
            env_example()["RABBITMQ_DEFAULT_PASS"],
        )
        if "DATABASE_URL" in env:
            assert urlsplit(env["DATABASE_URL"]).password == env_example()["POSTGRES_PASSWORD"]


def test_compose_names_only_known_variables(services: dict[str, dict[str, Any]]) -> None:
    known = SETTINGS_VARS | COMPOSE_CREDENTIALS | DASHBOARD_VARS
    for name, service in app_services(services).items():
        unknown = set(environment(service)) - known
        assert not unknown, f"{name}: environment has variables no setting reads: {unknown}"
    referenced = {match["name"] for match in REFERENCE.finditer(compose_text())}
    allowed = SETTINGS_VARS | COMPOSE_ONLY | DASHBOARD_VARS
    assert referenced <= allowed, referenced - allowed
    assert referenced >= COMPOSE_ONLY


def test_env_example_names_only_known_variables() -> None:
    unknown = set(env_example()) - SETTINGS_VARS - COMPOSE_ONLY - DASHBOARD_VARS
    assert not unknown, f".env.example has variables no setting reads: {unknown}"


def test_env_example_lists_every_setting_with_its_default() -> None:
    values = env_example()
    missing = SETTINGS_VARS - set(values)
    assert not missing, f".env.example lacks {missing}"
    assert values["WORKER_ID"] == "", "an empty WORKER_ID keeps the per-process default"
    from_example = dataclasses.asdict(Settings.from_env(values))
    defaults = dataclasses.asdict(Settings())
    from_example.pop("worker_id")
    defaults.pop("worker_id")
    assert from_example == defaults


def test_env_example_credentials_are_placeholders_to_change() -> None:
    values = env_example()
    assert set(values) >= COMPOSE_CREDENTIALS
    for name in ("RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD"):
        assert "change" in values[name].lower()
        assert "guest" not in values[name].lower()
    assert values["RABBITMQ_DEFAULT_USER"] != "guest"


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def test_dockerfile_base_image_is_pinned() -> None:
    bases = [rest for keyword, rest in dockerfile_instructions() if keyword == "FROM"]
    assert bases, "no FROM"
    for base in bases:
        image = base.split()[0]
        repository, _, tag = image.partition(":")
        assert repository == "python"
        assert tag.startswith("3.11"), f"base image {image!r} is not pinned to Python 3.11"
        assert "latest" not in tag


def test_dockerfile_installs_the_project_from_pyproject() -> None:
    instructions = dockerfile_instructions()
    copied = " ".join(rest for keyword, rest in instructions if keyword == "COPY")
    assert "pyproject.toml" in copied
    # Every package pyproject installs must be in the build context that `pip install .` sees.
    for package in project_packages():
        assert re.search(rf"(^|\s){package}(\s|$)", copied), f"{package} is not copied"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["readme"] in copied
    runs = [rest for keyword, rest in instructions if keyword == "RUN"]
    # `.` or `.[extras]`, quoted or not: the project itself, with the dashboard's extra.
    assert any(re.search(r"pip install (\S+ )*'?\.(\[[a-z,]+\])?'?(\s|;|$)", run) for run in runs)


def test_dockerfile_runs_as_a_non_root_user() -> None:
    users = [rest for keyword, rest in dockerfile_instructions() if keyword == "USER"]
    assert users, "no USER: the services would run as root"
    assert users[-1].split(":")[0] not in ("root", "0")


def test_dockerignore_keeps_secrets_and_history_out() -> None:
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    assert ".env" in ignored
    assert ".git" in ignored


# --- Monitoring: the compose profile, Prometheus, Grafana --------------------------------------


def deploy_yaml(path: str) -> Any:
    return yaml.safe_load((REPO / "deploy" / path).read_text(encoding="utf-8"))


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads((REPO / "deploy/grafana/dashboards/crawl.json").read_text("utf-8"))
    return found


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard, in panels and in panels nested in rows."""
    queries = []
    pending = list(dashboard()["panels"])
    while pending:
        panel = pending.pop()
        pending += panel.get("panels", [])
        queries += [target["expr"] for target in panel.get("targets", [])]
    return queries


def sample_names_defined_in_metrics_module() -> dict[str, str]:
    """Series name → metric family, for every metric shared/metrics.py defines."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names: dict[str, str] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                names |= {family.name + suffix: family.name for suffix in suffixes[family.type]}
    return names


def volume_targets(service: dict[str, Any]) -> dict[str, str]:
    """Container path → host path of the service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith("./"):
            mounts[target] = source
    return mounts


def test_monitoring_services_run_only_under_their_profile(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if name in MONITORING_SERVICES:
            assert service.get("profiles") == ["monitoring"], f"{name} must run only with the profile"
        elif name == "renderer":
            # Optional: its image carries a browser, built only when pages need rendering.
            assert service.get("profiles") == ["render"], "the renderer runs only with its profile"
        elif name in DEDICATED_WORKERS:
            assert service.get("profiles") == ["dedicated"], f"{name} must run only with the profile"
        else:
            assert "profiles" not in service, f"{name}: the pipeline must start without a profile"
        for dependency in service.get("depends_on", {}):
            if name not in MONITORING_SERVICES:
                assert dependency not in MONITORING_SERVICES, f"{name} must not need {dependency}"


def test_a_dedicated_pool_serves_its_queues_with_the_workers_settings(
    services: dict[str, dict[str, Any]],
) -> None:
    from worker.__main__ import parse_args, queue_kinds

    for name, kinds in DEDICATED_WORKERS.items():
        service = services[name]
        words = command(service)
        assert words[:3] == ["python", "-m", "worker"], f"{name}: {words}"
        assert list(queue_kinds(parse_args(words[3:]).queues)) == kinds
        assert environment(service) == environment(services["worker"]), f"{name}: not the workers' settings"
        Settings.from_env({"WORKER_QUEUES": ",".join(kinds)})  # kinds a worker accepts


def test_monitoring_images_are_pinned_releases(services: dict[str, dict[str, Any]]) -> None:
    for name in MONITORING_SERVICES:
        image = services[name]["image"]
        assert re.fullmatch(r"[a-z/]+:v?\d+\.\d+\.\d+", image), f"{name}: {image!r} is not a pinned release"


def test_pipeline_services_serve_metrics_inside_the_compose_network(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in PIPELINE_SERVICES:
        env = environment(services[name])
        assert int(env["METRICS_PORT"]) > 0, f"{name}: no metrics port"
        assert env["METRICS_HOST"] == "0.0.0.0", f"{name}: Prometheus in another container cannot reach it"
        assert not services[name].get("ports"), f"{name}: metrics need no published port"


def test_prometheus_scrapes_every_pipeline_service_and_rabbitmq(
    services: dict[str, dict[str, Any]],
) -> None:
    mounts = volume_targets(services["prometheus"])
    assert mounts["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus/prometheus.yml"
    config = deploy_yaml("prometheus/prometheus.yml")
    scraped: dict[str, set[int]] = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            for host in sd["names"]:
                scraped.setdefault(host, set()).add(int(sd["port"]))
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                scraped.setdefault(host, set()).add(int(port))
    assert set(scraped) <= set(services), f"targets name services compose does not have: {set(scraped)}"
    for name in PIPELINE_SERVICES:
        assert scraped.get(name) == {int(environment(services[name])["METRICS_PORT"])}, name
    assert scraped["rabbitmq"] == {RABBITMQ_PROMETHEUS_PORT}


def test_rabbitmq_enables_the_management_and_prometheus_plugins(
    services: dict[str, dict[str, Any]],
) -> None:
    mounts = volume_targets(services["rabbitmq"])
    source = mounts["/etc/rabbitmq/enabled_plugins"]
    text = (REPO / source).read_text(encoding="utf-8").strip()
    # An Erlang term: a list of atoms ended by a full stop.
    assert re.fullmatch(r"\[[a-z_, ]+\]\.", text), f"{source} is not an Erlang list: {text!r}"
    plugins = {name.strip() for name in text[1:-2].split(",")}
    assert plugins >= {"rabbitmq_management", "rabbitmq_prometheus"}


def test_dashboard_queries_only_metrics_that_exist() -> None:
    defined = sample_names_defined_in_metrics_module()
    requested_families = set()
    for job in deploy_yaml("prometheus/prometheus.yml")["scrape_configs"]:
        requested_families |= set(job.get("params", {}).get("family", []))
    queries = dashboard_queries()
    assert queries
    for query in queries:
        names = re.findall(r"\b((?:crawl|rabbitmq)_[a-z0-9_]+)", query)
        assert names, f"query uses no pipeline or broker metric: {query}"
        for name in names:
            if name.startswith("crawl_"):
                assert name in defined, f"{name} is not defined in shared/metrics.py ({query})"
            else:
                assert name in RABBITMQ_QUEUE_METRICS, f"{name} is not a known broker metric"
                assert RABBITMQ_QUEUE_METRICS[name] in requested_families, f"{name} is never scraped"


def test_dashboard_shows_every_metric_the_services_define() -> None:
    defined = sample_names_defined_in_metrics_module()
    shown = {
        defined.get(name, name)
        for query in dashboard_queries()
        for name in re.findall(r"\bcrawl_[a-z0-9_]+", query)
    }
    assert shown == set(defined.values())


def test_grafana_is_provisioned_with_the_dashboard_and_its_datasource(
    services: dict[str, dict[str, Any]],
) -> None:
    mounts = volume_targets(services["grafana"])
    datasources = deploy_yaml("grafana/provisioning/datasources/prometheus.yml")["datasources"]
    providers = deploy_yaml("grafana/provisioning/dashboards/crawl.yml")["providers"]
    assert mounts[providers[0]["options"]["path"]] == "./deploy/grafana/dashboards"
    assert mounts["/etc/grafana/provisioning/datasources"] == "./deploy/grafana/provisioning/datasources"
    assert mounts["/etc/grafana/provisioning/dashboards"] == "./deploy/grafana/provisioning/dashboards"
    (source,) = datasources
    assert urlsplit(source["url"]).hostname == "prometheus"
    used = {
        json.dumps(panel["datasource"], sort_keys=True)
        for panel in dashboard()["panels"]
        if panel.get("targets")
    }
    assert used == {json.dumps({"type": "prometheus", "uid": source["uid"]}, sort_keys=True)}
