"""Static checks of the Kubernetes manifests in deploy/k8s: no cluster needed, so a manifest that
names the wrong Deployment, queue, setting or image fails in the unit tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.amqp.topology import work_queue
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
MANIFEST_PATTERNS = ("*.yaml", "*.yml", "*.yaml.template")
SERVICE_MODULES = {"worker", "producer", "dlq_consumer"}
# A workload is named by its module and, for the producer, by what it serves: crawl requests
# (--serve) or the links of discovery runs (--frontier).
WORKLOADS = {"worker", "producer", "producer --serve", "producer --frontier", "dlq_consumer"}
SETTINGS_VARS = {f.name.upper() for f in dataclasses.fields(Settings)}
WORKLOAD_KINDS = {"Deployment", "Job"}


def manifest_files() -> list[Path]:
    return sorted({path for pattern in MANIFEST_PATTERNS for path in K8S.glob(pattern)})


@pytest.fixture(scope="module")
def documents() -> list[dict[str, Any]]:
    found = []
    for path in manifest_files():
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is not None:
                found.append(document)
    return found


def of_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == kind]


def one(documents: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in of_kind(documents, kind) if name is None or d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def containers(documents: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of every Deployment and Job."""
    for workload in documents:
        if workload["kind"] in WORKLOAD_KINDS:
            for container in workload["spec"]["template"]["spec"]["containers"]:
                yield workload, container


def module_of(container: dict[str, Any]) -> str:
    command = container["command"]
    assert command[:2] == ["python", "-m"] and len(command) == 3, f"command {command}"
    module: str = command[2]
    return module


def service_of(container: dict[str, Any]) -> str:
    """The module, with ` --serve` for the producer service and ` --frontier` for the frontier
    (a Job's producer seeds one crawl)."""
    module = module_of(container)
    for role in ("--serve", "--frontier"):
        if role in container.get("args", []):
            return f"{module} {role}"
    return module


def workload_running(documents: list[dict[str, Any]], service: str) -> dict[str, Any]:
    found = [w for w, c in containers(documents) if service_of(c) == service]
    assert len(found) == 1, f"expected one workload running {service}, found {len(found)}"
    return found[0]


def config(documents: list[dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = one(documents, "ConfigMap")["data"]
    return data


def secret_keys(documents: list[dict[str, Any]]) -> set[str]:
    secret = one(documents, "Secret")
    return set(secret.get("stringData", {})) | set(secret.get("data", {}))


def test_there_are_manifests_and_the_secret_is_only_a_template() -> None:
    names = {path.name for path in manifest_files()}
    assert "secret.yaml.template" in names
    # kubectl apply -f deploy/k8s/ reads .yaml, .yml and .json: a real secret must not sit here.
    assert not [n for n in names if n.endswith((".yaml", ".yml")) and "secret" in n]


def test_every_document_names_its_kind_and_lives_in_the_namespace(documents: list[dict[str, Any]]) -> None:
    namespace = one(documents, "Namespace")["metadata"]["name"]
    for document in documents:
        assert document.get("apiVersion"), document
        assert document.get("kind"), document
        assert document.get("metadata", {}).get("name"), document
        if document["kind"] != "Namespace":
            assert document["metadata"].get("namespace") == namespace, document["metadata"]["name"]


def test_the_configmap_is_valid_settings(documents: list[dict[str, Any]]) -> None:
    values = config(documents)
    assert set(values) <= SETTINGS_VARS, f"not settings: {set(values) - SETTINGS_VARS}"
    settings = Settings.from_env(values)  # raises ConfigError on a bad value
    assert settings.queue_type == "quorum", "a three-node cluster needs replicated queues"
    assert settings.metrics_port > 0 and settings.metrics_host == "0.0.0.0"
    assert settings.log_format == "json"


def test_every_environment_variable_is_a_setting(documents: list[dict[str, Any]]) -> None:
    assert secret_keys(documents) <= SETTINGS_VARS
    assert {"AMQP_URL", "REDIS_URL", "DATABASE_URL"} <= secret_keys(documents)
    for workload, container in containers(documents):
        names = {variable["name"] for variable in container.get("env", [])}
        assert names <= SETTINGS_VARS, f"{workload['metadata']['name']}: {names - SETTINGS_VARS}"


def test_workloads_read_the_configmap_and_the_secret(documents: list[dict[str, Any]]) -> None:
    configmap = one(documents, "ConfigMap")["metadata"]["name"]
    secret = one(documents, "Secret")["metadata"]["name"]
    for workload, container in containers(documents):
        sources = container.get("envFrom", [])
        assert {"configMapRef": {"name": configmap}} in sources, workload["metadata"]["name"]
        assert {"secretRef": {"name": secret}} in sources, workload["metadata"]["name"]


def test_containers_run_the_services_of_this_repository(documents: list[dict[str, Any]]) -> None:
    services = [service_of(c) for _, c in containers(documents)]
    assert sorted(services) == sorted(WORKLOADS)
    assert {module_of(c) for _, c in containers(documents)} == SERVICE_MODULES
    for module in SERVICE_MODULES:
        assert (REPO / module / "__main__.py").is_file()
    assert workload_running(documents, "producer")["kind"] == "Job"
    for service in ("worker", "dlq_consumer", "producer --serve", "producer --frontier"):
        assert workload_running(documents, service)["kind"] == "Deployment", service


def test_one_pinned_image_for_every_service(documents: list[dict[str, Any]]) -> None:
    images = {c["image"] for _, c in containers(documents)}
    assert len(images) == 1, f"the services run different images: {images}"
    pulled = [*images, *(d["spec"]["image"] for d in of_kind(documents, "RabbitmqCluster"))]
    for image in pulled:
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{image!r} has no tag"
        assert tag != "latest" and any(ch.isdigit() for ch in tag), f"{image!r} is not pinned"


def test_workers_get_time_to_finish_their_fetches(documents: list[dict[str, Any]]) -> None:
    deadline_s = Settings.from_env(config(documents)).fetch_deadline_s
    worker = workload_running(documents, "worker")["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] > deadline_s


def test_long_running_services_are_ready_and_alive_while_their_metrics_answer(
    documents: list[dict[str, Any]],
) -> None:
    port = Settings.from_env(config(documents)).metrics_port
    for module in ("worker", "dlq_consumer", "producer --serve"):
        (container,) = workload_running(documents, module)["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for kind in ("readinessProbe", "livenessProbe"):
            probe = container[kind]["httpGet"]
            assert probe["path"] == "/metrics", (module, kind)
            assert ports[probe["port"]] == port, (module, kind)
        liveness = container["livenessProbe"]
        # Slow to give up: a restart hands the worker's messages back to be fetched again.
        assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60, module


def test_every_container_has_cpu_and_memory_requests_and_limits(documents: list[dict[str, Any]]) -> None:
    for workload, container in containers(documents):
        resources = container["resources"]
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[bound]), (workload["metadata"]["name"], bound)
        assert cpu_cores(resources["limits"]["cpu"]) >= cpu_cores(resources["requests"]["cpu"])


def cpu_cores(quantity: str | int | float) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def test_the_producer_job_has_a_deadline_and_no_probe_on_its_metrics(documents: list[dict[str, Any]]) -> None:
    job = workload_running(documents, "producer")
    deadline_s = job["spec"]["activeDeadlineSeconds"]
    linger_s = Settings.from_env(config(documents)).metrics_linger_s
    assert isinstance(deadline_s, int) and deadline_s > 10 * 60 + linger_s
    (container,) = job["spec"]["template"]["spec"]["containers"]
    # After its run the producer serves /metrics until scraped once: a probe would end that.
    assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(container)
    assert job["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_keda_scales_the_worker_deployment_on_the_work_queues(documents: list[dict[str, Any]]) -> None:
    scaled = one(documents, "ScaledObject")["spec"]
    worker = workload_running(documents, "worker")
    target = scaled["scaleTargetRef"]
    assert target["name"] == worker["metadata"]["name"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert "replicas" not in worker["spec"], "KEDA owns the replica count"

    namespace = Settings.from_env(config(documents)).crawl_namespace
    queues = {t["metadata"]["queueName"] for t in scaled["triggers"]}
    assert {work_queue(namespace, "bulk"), work_queue(namespace, "priority")} <= queues
    assert queues <= {work_queue(namespace, kind) for kind in ("priority", "ttl", "bulk")}
    for trigger in scaled["triggers"]:
        assert trigger["type"] == "rabbitmq"
        assert trigger["metadata"]["mode"] == "QueueLength" and int(trigger["metadata"]["value"]) > 0


def test_keda_counts_ready_and_unacknowledged_messages(documents: list[dict[str, Any]]) -> None:
    """Over AMQP KEDA sees only ready messages; the management API's count includes the ones
    each worker holds unacknowledged (its prefetch), so the scaler sees the whole load."""
    settings = Settings.from_env(config(documents))
    prefetch = 2 * settings.fetch_concurrency  # shared/consumer/connection_thread.py: basic_qos
    for trigger in one(documents, "ScaledObject")["spec"]["triggers"]:
        metadata = trigger["metadata"]
        assert metadata["protocol"] == "http"
        assert metadata.get("excludeUnacknowledged", "false") == "false"
        assert metadata["host"] == settings.rabbitmq_management_url + "/"
        assert metadata["vhostName"] == "/"
        # One worker's own prefetch must not call for a second worker.
        assert int(metadata["value"]) > prefetch, metadata["queueName"]
        auth = one(documents, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        refs = {ref["parameter"]: ref for ref in auth["spec"]["secretTargetRef"]}
        assert set(refs) == {"username", "password"}
        for parameter, ref in refs.items():  # the user the RabbitMQ cluster operator keeps
            cluster = one(documents, "RabbitmqCluster")["metadata"]["name"]
            assert (ref["name"], ref["key"]) == (f"{cluster}-default-user", parameter)


def test_rabbitmq_is_a_three_node_operator_cluster(documents: list[dict[str, Any]]) -> None:
    cluster = one(documents, "RabbitmqCluster")
    assert cluster["apiVersion"].startswith("rabbitmq.com/")
    assert cluster["spec"]["replicas"] == 3
    host = "{name}.{ns}.svc".format(name=cluster["metadata"]["name"], ns=cluster["metadata"]["namespace"])
    template = one(documents, "Secret")["stringData"]
    assert f"@{host}:5672/" in template["AMQP_URL"]
    assert config(documents)["RABBITMQ_MANAGEMENT_URL"] == f"http://{host}:15672"


def test_the_producer_service_gives_a_stopped_seeding_time_to_settle(documents: list[dict[str, Any]]) -> None:
    """Told to stop, the service settles the publishes in flight and hands its request back to
    the queue; compose gives it 30 s (stop_grace_period), and so must the pod."""
    service = workload_running(documents, "producer --serve")
    (container,) = service["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["--serve"], "--serve takes no other option"
    assert service["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30
    assert service["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_the_frontier_finishes_the_page_it_holds_and_has_no_probe_on_metrics_it_lacks(
    documents: list[dict[str, Any]],
) -> None:
    """The frontier serves no metrics (its counts are the run's, in Redis): a probe on a port
    nobody listens on would restart it for ever."""
    frontier = workload_running(documents, "producer --frontier")
    (container,) = frontier["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["--frontier"]
    assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(container)
    assert "ports" not in container
    assert frontier["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30
