"""Static checks of docker-compose.yml, Dockerfile, .dockerignore and .env.example: nothing here
needs a container engine, so a broken deployment file fails in the unit tests."""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from shared.settings import Settings

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
BACKING_SERVICES = ("rabbitmq", "redis", "postgres")
PIPELINE_SERVICES = ("producer", "worker", "dlq_consumer")
APP_MODULES = {"producer", "worker", "dlq_consumer", "demo_site"}
# Variables only compose reads (to configure RabbitMQ and PostgreSQL and build the URLs).
COMPOSE_CREDENTIALS = {"RABBITMQ_DEFAULT_USER", "RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD"}
SETTINGS_VARS = {f.name.upper() for f in dataclasses.fields(Settings)}
REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)[^}]*\}")


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


def interpolate(text: str) -> str:
    """Compose's ${NAME...} substitution, fed from .env.example."""
    values = env_example()
    return REFERENCE.sub(lambda match: values[match["name"]], text)


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
    assert "127.0.0.1:15672:15672" in services["rabbitmq"]["ports"]


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
        assert words[2] in APP_MODULES, f"{name}: unexpected module {words[2]}"
        assert (REPO / words[2] / "__main__.py").is_file(), f"{name}: {words[2]}/__main__.py missing"


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
    of this repository that it runs (`-m shared.crawl`). `-m` also runs tools (pytest, mypy) and
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
    in_compose = {command(service)[2] for service in app_services(services).values()}
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
        assert services[name]["env_file"] in (".env", [".env"]), f"{name}: reads no .env"
        assert urlsplit(env["AMQP_URL"]).hostname == "rabbitmq"
        assert urlsplit(env["REDIS_URL"]).hostname == "redis"
        assert urlsplit(env["DATABASE_URL"]).hostname == "postgres"
        # The credentials come from .env, the same ones the backing services are given.
        amqp = urlsplit(env["AMQP_URL"])
        assert (amqp.username, amqp.password) == (
            env_example()["RABBITMQ_DEFAULT_USER"],
            env_example()["RABBITMQ_DEFAULT_PASS"],
        )
        assert urlsplit(env["DATABASE_URL"]).password == env_example()["POSTGRES_PASSWORD"]


def test_compose_names_only_known_variables(services: dict[str, dict[str, Any]]) -> None:
    known = SETTINGS_VARS | COMPOSE_CREDENTIALS
    for name, service in app_services(services).items():
        unknown = set(environment(service)) - known
        assert not unknown, f"{name}: environment has variables no setting reads: {unknown}"
    referenced = {match["name"] for match in REFERENCE.finditer(compose_text())}
    assert referenced <= COMPOSE_CREDENTIALS


def test_env_example_names_only_known_variables() -> None:
    unknown = set(env_example()) - SETTINGS_VARS - COMPOSE_CREDENTIALS
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
    for name in ("RABBITMQ_DEFAULT_PASS", "POSTGRES_PASSWORD"):
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
    assert any(re.search(r"pip install (\S+ )*\.(\s|$)", run) for run in runs)


def test_dockerfile_runs_as_a_non_root_user() -> None:
    users = [rest for keyword, rest in dockerfile_instructions() if keyword == "USER"]
    assert users, "no USER: the services would run as root"
    assert users[-1].split(":")[0] not in ("root", "0")


def test_dockerignore_keeps_secrets_and_history_out() -> None:
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    assert ".env" in ignored
    assert ".git" in ignored
