"""Static checks of what runs the compose file where no registry can be reached: the offline
image build (deploy/offline-images), Prometheus's start script, and `make compose-test`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
OFFLINE = REPO / "deploy/offline-images"
# Debian has no Grafana: the compose test leaves it out, and the unit tests check its files.
NOT_BUILT = {"grafana/grafana"}


def built_tags() -> dict[str, str]:
    """Folder -> tag, from build.sh's `tags` table."""
    text = (OFFLINE / "build.sh").read_text(encoding="utf-8")
    table = text[text.index("declare -A tags=(") :]
    table = table[: table.index(")\n")]
    return dict(re.findall(r'\[(\w+)\]="([^"]+)"', table))


def compose_images() -> set[str]:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))["services"]
    return {s["image"] for s in services.values() if "build" not in s}


def test_every_image_the_compose_file_pulls_is_built_offline() -> None:
    tags = set(built_tags().values())
    lines = (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines()
    from_line = next(line for line in lines if line.startswith("FROM "))
    wanted = {image for image in compose_images() if image.split(":")[0] not in NOT_BUILT}
    assert wanted | {from_line.split()[1]} == tags


def test_each_offline_image_has_its_folder() -> None:
    for folder in built_tags():
        dockerfile = (OFFLINE / folder / "Dockerfile").read_text(encoding="utf-8")
        # Built on the debootstrapped base build.sh imports, never on a pulled image.
        assert re.search(r"^ARG BASE\nFROM \$BASE$", dockerfile, re.MULTILINE), folder
        for line in dockerfile.splitlines():
            if line.startswith("COPY "):
                source = line.split()[1]
                made_by_the_build = source in ("debs", "wheels", "archive")
                assert made_by_the_build or (OFFLINE / folder / source).exists(), (folder, source)


def test_the_renderers_image_is_built_offline_with_chromium_from_a_local_archive() -> None:
    """Compose's renderer image comes from the project's Dockerfile, whose `apt-get install
    chromium` the python stand-in answers from its own archive, its only apt source."""
    text = (OFFLINE / "build.sh").read_text(encoding="utf-8")
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))["services"]
    (renderer_tag,) = re.findall(r"^renderer_tag=(\S+)", text, re.MULTILINE)
    assert services["renderer"]["image"] == renderer_tag
    assert services["renderer"]["build"]["args"]["WITH_RENDERER"] == "1"
    assert re.search(r"docker build --build-arg WITH_RENDERER=1 -t \"\$renderer_tag\" \"\$repo\"", text)
    archives = text[text.index("declare -A archives=(") :]
    assert re.search(r'\[python\]="chromium libatomic1"', archives[: archives.index(")\n")])
    python = (OFFLINE / "python" / "Dockerfile").read_text(encoding="utf-8")
    assert "COPY archive /opt/debs" in python
    assert "echo 'deb [trusted=yes] file:/opt/debs ./' >/etc/apt/sources.list" in python
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    # libatomic1: Playwright's driver needs it (seen in an image built without it).
    assert "apt-get install -y --no-install-recommends chromium libatomic1" in dockerfile


def worker_ports(tmp_path: Path, processes: str) -> tuple[int, set[int]]:
    out = tmp_path / f"prometheus-{processes}.yml"
    done = subprocess.run(
        ["sh", str(REPO / "deploy/prometheus/start.sh")],
        env={
            **os.environ,
            "WORKER_PROCESSES": processes,
            "PROMETHEUS_CONFIG_IN": str(REPO / "deploy/prometheus/prometheus.yml"),
            "PROMETHEUS_CONFIG_OUT": str(out),
        },
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return done.returncode, set()
    config: dict[str, Any] = yaml.safe_load(out.read_text(encoding="utf-8"))
    (worker,) = [job for job in config["scrape_configs"] if job["job_name"] == "worker"]
    return 0, {int(sd["port"]) for sd in worker["dns_sd_configs"]}


def test_prometheus_scrapes_every_process_of_a_worker_pool(tmp_path: Path) -> None:
    """Pool process n serves its metrics on METRICS_PORT + n (worker/__main__.py)."""
    assert worker_ports(tmp_path, "1") == (0, {9100})
    assert worker_ports(tmp_path, "4") == (0, {9100, 9101, 9102, 9103})
    assert worker_ports(tmp_path, "") == (0, {9100})  # unset in .env: one process
    assert worker_ports(tmp_path, "two")[0] == 2


def test_compose_passes_the_pool_size_to_prometheus() -> None:
    """The same figure for both, and a pool of 2 in each worker container unless .env says
    otherwise (.env.example leaves it empty)."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))["services"]
    pool_size = services["worker"]["environment"]["WORKER_PROCESSES"]
    assert services["prometheus"]["environment"]["WORKER_PROCESSES"] == pool_size == "${WORKER_PROCESSES:-2}"
    example = (REPO / ".env.example").read_text(encoding="utf-8")
    assert re.search(r"^WORKER_PROCESSES=$", example, re.MULTILINE), "a copied .env would override the 2"


def test_ci_runs_the_compose_test_after_the_tests() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^images-offline:\n\tdeploy/offline-images/build\.sh$", makefile, re.MULTILINE)
    assert re.search(r"^compose-test: install\n\t.*tests/compose/run\.sh$", makefile, re.MULTILINE)
    lines = (REPO / ".ci/run").read_text(encoding="utf-8").splitlines()
    assert lines.index("make compose-test") > lines.index("make test")
