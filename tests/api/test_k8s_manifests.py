"""The Kubernetes manifests (deploy/k8s): each overlay renders with ``kubectl kustomize`` and
every object validates against the Kubernetes schemas (kubernetes-validate, strict: no unknown
fields); the parts that refer to each other (probes, the router's DNS name, the HPA's metric
and the adapter's rule, selectors, the servers' own command lines) agree. Without kubectl the
files themselves are validated: whole resources fully, patches for everything but the
required fields a patch leaves to its target."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

from pagedserve.cli import serve
from pagedserve.router import cli as router_cli
from pagedserve.server.models.model_path import SMOLLM2_NAME
from tests.api.test_metrics import GAUGES

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "tp-multinode")
KUBERNETES_VERSION = "1.32"
REPLICA = "pagedserve-replica"
ROUTER = "pagedserve-router"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


def render(overlay: str) -> list[dict[str, Any]]:
    done = subprocess.run([KUBECTL, "kustomize", str(K8S / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}


def as_pod_templates(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A LeaderWorkerSet's pod templates as core PodTemplates (its CRD schema is not among
    the Kubernetes schemas; its pods are what must be right)."""
    spec = doc["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        yield {"apiVersion": "v1", "kind": "PodTemplate",
               "metadata": {"name": f"{doc['metadata']['name']}-{role}"},
               "template": spec[role]}


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] == "LeaderWorkerSet":
        assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        for template in as_pod_templates(doc):
            kubernetes_validate.validate(template, KUBERNETES_VERSION, strict=True)
        return
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def container(pod_spec: dict[str, Any], name: str = "server") -> dict[str, Any]:
    (found,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return found


def parse(add_arguments: Any, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(argv)


def probes_go_to_the_health_port(pod: dict[str, Any], server: dict[str, Any],
                                 health_port: int | None) -> None:
    """Every probe of ``server`` asks the port its own command line serves /health and
    /metrics on outside the connection caps, and Prometheus scrapes that port."""
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert health_port is not None and ports["health"] == health_port
    probes = [server[name] for name in ("readinessProbe", "livenessProbe", "startupProbe")
              if name in server]
    assert probes
    for probe in probes:
        check = probe.get("httpGet") or probe["tcpSocket"]
        assert check["port"] == "health"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(health_port)


def trusts_the_routers(config: Any) -> None:
    """Replicas take the client from the routers' X-Forwarded-For: pod addresses."""
    proxies = config.trusted_proxies()
    assert all(proxies.trusts(pod) for pod in ("10.244.1.7", "172.17.0.4", "192.168.3.9"))
    assert not proxies.trusts("203.0.113.5")


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(overlay: str) -> None:
    docs = render(overlay)
    for doc in docs:
        validate(doc)
    kinds = by_kind(docs)
    router = kinds[("Deployment", ROUTER)]
    args = container(router["spec"]["template"]["spec"], "router")["args"]
    config = router_cli.config_from_args(parse(router_cli.add_arguments, args[1:]))
    router_pod = router["spec"]["template"]
    router_container = container(router_pod["spec"], "router")
    probes_go_to_the_health_port(router_pod, router_container, config.health_port)
    # The replicas' key, for the router's own /load checks.
    (env,) = router_container["env"]
    assert env["name"] == serve.API_KEY_ENV
    assert env["valueFrom"]["secretKeyRef"]["name"] == "pagedserve-api-key"
    only_routers_reach_the_main_port(kinds)
    service = kinds[("Service", REPLICA)]
    # The router finds the replicas through the headless Service's name and port.
    assert service["spec"]["clusterIP"] == "None"
    assert config.replica_dns == f"{REPLICA}:{service['spec']['ports'][0]['port']}"
    assert kinds[("Service", ROUTER)]["spec"]["ports"][0]["targetPort"] == "http"
    for name in (REPLICA, ROUTER):
        selector = kinds[("PodDisruptionBudget", name)]["spec"]["selector"]["matchLabels"]
        assert selector == {"app.kubernetes.io/name": name}


@needs_kubectl
@pytest.mark.parametrize("overlay", ("cpu", "gpu"))
def test_replicas_probe_health_drain_and_serve_their_command_line(overlay: str) -> None:
    kinds = by_kind(render(overlay))
    pod = kinds[("Deployment", REPLICA)]["spec"]["template"]
    server = container(pod["spec"])
    assert server["readinessProbe"]["httpGet"]["path"] == "/health"
    assert server["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    args = server["args"]
    assert args[0] == "serve"
    config = serve.config_from_args(parse(serve.add_arguments, args[1:]))
    assert config.engine_args.enable_prefix_caching
    if overlay == "cpu":  # the real model, which the image holds
        assert (config.engine_args.model, config.served_model_names) == (
            SMOLLM2_NAME, [SMOLLM2_NAME])
    probes_go_to_the_health_port(pod, server, config.health_port)
    trusts_the_routers(config)
    # The grace period covers the preStop wait and the whole drain.
    pre_stop = int(server["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["spec"]["terminationGracePeriodSeconds"] > pre_stop + config.drain_timeout
    assert kinds[("Service", REPLICA)]["spec"]["selector"] == pod["metadata"]["labels"]


def only_routers_reach_the_main_port(kinds: dict[tuple[str, str], dict[str, Any]]) -> None:
    policy = kinds[("NetworkPolicy", REPLICA)]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": REPLICA}
    assert policy["policyTypes"] == ["Ingress"]
    by_port: dict[str | None, list[Any]] = {}
    for rule in policy["ingress"]:
        for port in rule.get("ports", [{"port": None}]):
            by_port.setdefault(port["port"], []).append(rule.get("from"))
    router_pods = [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": ROUTER}}}]
    replica_pods = [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": REPLICA}}}]
    assert by_port == {"http": [router_pods], "health": [None], None: [replica_pods]}


@needs_kubectl
def test_hpa_scales_on_the_adapter_metric() -> None:
    kinds = by_kind(render("cpu"))
    hpa = kinds[("HorizontalPodAutoscaler", REPLICA)]
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    (metric,) = hpa["spec"]["metrics"]
    rules = yaml.safe_load(
        kinds[("ConfigMap", "pagedserve-adapter-config")]["data"]["config.yaml"])["rules"]
    (rule,) = rules
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    # The series the adapter reads is one the server exports (test_metrics checks it live).
    assert rule["seriesQuery"].split("{")[0] in GAUGES


@needs_kubectl
def test_tensor_parallel_overlay_runs_groups_under_torchrun() -> None:
    kinds = by_kind(render("tp-multinode"))
    assert ("Deployment", REPLICA) not in kinds
    lws = kinds[("LeaderWorkerSet", REPLICA)]
    group = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        server = container(group[role]["spec"])
        assert server["command"] == ["torchrun"]
        args = server["args"]
        split = args.index("-m")
        torchrun = dict(a.lstrip("-").split("=", 1) for a in args[:split])
        assert args[split + 1:split + 3] == ["pagedserve", "serve"]
        config = serve.config_from_args(parse(serve.add_arguments, args[split + 3:]))
        if role == "leaderTemplate":  # the one that serves HTTP
            probes_go_to_the_health_port(group[role], server, config.health_port)
            trusts_the_routers(config)
        # Every GPU of every pod in the group is one tensor-parallel rank.
        world = group["size"] * int(torchrun["nproc-per-node"])
        assert config.engine_args.tensor_parallel_size == world
        assert torchrun["master-addr"] == "$(LWS_LEADER_ADDRESS)"
        assert int(server["resources"]["limits"]["nvidia.com/gpu"]) == int(
            torchrun["nproc-per-node"])
    # Only leaders serve HTTP, so only they are behind the router's name.
    selector = kinds[("Service", REPLICA)]["spec"]["selector"]
    assert selector["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    target = kinds[("HorizontalPodAutoscaler", REPLICA)]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("LeaderWorkerSet", REPLICA)


def manifest_files() -> Iterator[Path]:
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            yield path


def patch_errors(doc: dict[str, Any]) -> list[str]:
    """Schema errors of a strategic-merge patch, but for the required fields it leaves out."""
    version = next(v for v in reversed(kubernetes_validate.utils.all_versions())
                   if v.startswith(KUBERNETES_VERSION + "."))
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group = doc["apiVersion"].split("/")[0].split(".")[0] if "/" in doc["apiVersion"] else ""
    api = f"{group}-{doc['apiVersion'].split('/')[-1]}" if group else doc["apiVersion"]
    schema = schema_contents(f"{folder}/{doc['kind'].lower()}-{api}.json", version)
    definitions = schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [e.message for e in validator.iter_errors(doc) if e.validator != "required"]


@pytest.mark.parametrize("path", list(manifest_files()), ids=lambda p: str(p.relative_to(K8S)))
def test_each_file_validates(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc.get("$patch") == "delete":
            assert (doc["kind"], doc["metadata"]["name"]) == ("Deployment", REPLICA)
        elif path.parent.name == "base" or doc["kind"] == "LeaderWorkerSet":
            validate(doc)
        else:
            assert patch_errors(doc) == []


def test_every_file_is_used() -> None:
    used = set()
    for kustomization in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        for entry in spec.get("resources", []) + [p.get("path") for p in spec.get("patches", [])]:
            if entry and entry.endswith(".yaml"):
                used.add((kustomization.parent / entry).resolve())
    assert set(p.resolve() for p in manifest_files()) == used
