"""The local stack's files (Docker cannot run here): each parses, and each reference between
them (commands, targets, mounts, metric names, datasource) resolves."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from pagedserve.loadgen import cli as bench_cli
from pagedserve.server.cli import serve
from tests.api.test_metrics import COUNTERS, GAUGES, HISTOGRAMS

ROOT = Path(__file__).resolve().parents[2]
SERVERS = ("server-1", "server-2")


def load_yaml(relative: str) -> Any:
    return yaml.safe_load((ROOT / relative).read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml("docker-compose.yml")


def parse(add_arguments: Any, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(argv)


def test_compose_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {*SERVERS, "loadgen", "prometheus", "grafana"}
    for name in SERVERS:
        service = compose["services"][name]
        assert service["build"] == "."
        command = service["command"]
        assert command[0] == "serve"
        config = serve.config_from_args(parse(serve.add_arguments, command[1:]))
        assert (config.port, config.served_model_names) == (8000, ["tiny"])
        # Docker must give the drain its time before it kills the container.
        assert int(service["stop_grace_period"].rstrip("s")) > config.drain_timeout


def test_loadgen_drives_every_replica(compose: dict[str, Any]) -> None:
    service = compose["services"]["loadgen"]
    assert set(service["depends_on"]) == set(SERVERS)
    assert all(v["condition"] == "service_healthy" for v in service["depends_on"].values())
    (script,) = service["command"]
    urls = re.search(r"for url in (.*?); do", script).group(1).split()
    assert urls == [f"http://{name}:8000" for name in SERVERS]
    bench = re.search(r"do (pagedserve bench .*?) & done", script).group(1)
    argv = shlex.split(bench.replace("$$url", urls[0]))[2:]
    args = parse(bench_cli.add_arguments, argv)
    assert (args.model, args.base_url) == ("tiny", urls[0])


def test_prometheus_scrapes_both_replicas() -> None:
    config = load_yaml("deploy/prometheus.yml")
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (static,) = job["static_configs"]
    assert static["targets"] == [f"{name}:8000" for name in SERVERS]


def test_grafana_mounts_and_datasource(compose: dict[str, Any]) -> None:
    for mount in compose["services"]["grafana"]["volumes"] + \
            compose["services"]["prometheus"]["volumes"]:
        host_path = mount.split(":")[0]
        assert (ROOT / host_path).exists(), host_path
    (source,) = load_yaml("deploy/grafana/provisioning/datasources/prometheus.yml")[
        "datasources"]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")
    (provider,) = load_yaml("deploy/grafana/provisioning/dashboards/pagedserve.yml")[
        "providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/pagedserve.json").read_text())
    uid = load_yaml("deploy/grafana/provisioning/datasources/prometheus.yml")[
        "datasources"][0]["uid"]
    exported = GAUGES | {f"{c}_total" for c in COUNTERS} | {
        f"{h}_{suffix}" for h in HISTOGRAMS for suffix in ("bucket", "sum", "count")}
    used = set()
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == uid
        for target in panel["targets"]:
            used |= set(re.findall(r"(?:vllm|pagedserve):[a-z0-9_]+", target["expr"]))
    # test_metrics checks these names against a live server's /metrics.
    assert used <= exported, used - exported
    assert {re.sub(r"_(total|bucket)$", "", name) for name in used} == (
        GAUGES | COUNTERS | HISTOGRAMS)


def test_dockerfile_installs_with_constraints() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "-c constraints.txt" in dockerfile
    for package in ("server", "client", "kernels", "loadgen"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert 'ENTRYPOINT ["pagedserve"]' in dockerfile
    assert 'CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]' in dockerfile
