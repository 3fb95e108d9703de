"""Offline validation of the Kubernetes manifests (deploy/k8s): every overlay renders
with ``kubectl kustomize``, every manifest validates against the Kubernetes 1.32 schemas
(``kubernetes-validate``, strict: unknown fields fail), CRDs without a bundled schema are
checked for shape, and every workload passes the policy: probes, resource requests and
limits, non-root, read-only root filesystem, no privilege escalation. The gateway
config in each overlay loads with llmso's own schema, and ``replicas:`` matches the
engine StatefulSet it points at."""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from config.schema import AppConfig, OpenAIModelConfig

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if p.is_dir())
K8S_VERSION = "1.32.0"
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


def _replicas_tool() -> Any:
    spec = importlib.util.spec_from_file_location("k8s_replicas", K8S / "replicas.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool() -> Any:
    if shutil.which("kubectl") is None:
        if os.environ.get("LLMSO_REQUIRE_ENGINES") == "1":
            raise RuntimeError("kubectl is not installed (it ships with the machine image)")
        pytest.skip("kubectl is not installed")
    return _replicas_tool()


@pytest.fixture(scope="module")
def rendered(tool: Any) -> dict[str, list[dict[str, Any]]]:
    return {overlay.name: tool.render(str(overlay)) for overlay in OVERLAYS}


def policy_problems(doc: dict[str, Any]) -> list[str]:
    """What a workload manifest lacks; empty when it passes."""
    if doc.get("kind") not in WORKLOADS:
        return []
    name = f"{doc['kind']}/{doc['metadata']['name']}"
    pod = doc["spec"]["template"]["spec"]
    pod_security = pod.get("securityContext") or {}
    problems = []
    for container in pod.get("containers", []):
        where = f"{name}/{container['name']}"
        for probe in ("livenessProbe", "readinessProbe"):
            if not container.get(probe):
                problems.append(f"{where}: no {probe}")
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in (resources.get(kind) or {}):
                    problems.append(f"{where}: no {resource} in resources.{kind}")
        security = {**pod_security, **(container.get("securityContext") or {})}
        if not security.get("runAsNonRoot") or security.get("runAsUser", 1) == 0:
            problems.append(f"{where}: may run as root")
        if not security.get("readOnlyRootFilesystem"):
            problems.append(f"{where}: writable root filesystem")
        if security.get("allowPrivilegeEscalation", True):
            problems.append(f"{where}: allows privilege escalation")
    return problems


def _service_monitor_shape(doc: dict[str, Any]) -> None:
    spec = doc["spec"]
    assert spec["selector"]["matchLabels"], doc
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}, endpoint
        assert endpoint["port"] and endpoint["path"].startswith("/"), endpoint


def test_every_overlay_renders_and_validates(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert set(rendered) == {"cpu-demo", "gpu"}
    for overlay, docs in rendered.items():
        kinds = {doc["kind"] for doc in docs}
        assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds, overlay
        assert {"HorizontalPodAutoscaler", "ServiceMonitor"} <= kinds, overlay
        for doc in docs:
            if doc["apiVersion"].startswith("monitoring.coreos.com/"):
                _service_monitor_shape(doc)  # a CRD: no schema bundled, check its shape
                continue
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            assert not policy_problems(doc), (overlay, policy_problems(doc))


def test_gateway_probes_and_drain(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for docs in rendered.values():
        gateway = next(d for d in docs if d["kind"] == "Deployment")
        pod = gateway["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert "preStop" in container["lifecycle"]
        config = _config(docs)
        drain = config.server.drain_grace + config.server.drain_timeout
        assert pod["terminationGracePeriodSeconds"] >= drain


def test_policy_catches_what_it_should(rendered: dict[str, list[dict[str, Any]]]) -> None:
    gateway = next(d for d in rendered["gpu"] if d["kind"] == "Deployment")
    assert not policy_problems(gateway)
    for breakage, expected in (
        (lambda c, p: c.pop("readinessProbe"), "no readinessProbe"),
        (lambda c, p: c["resources"].pop("limits"), "no memory in resources.limits"),
        (lambda c, p: c["securityContext"].update(runAsUser=0), "may run as root"),
        (lambda c, p: (c["securityContext"].pop("runAsNonRoot"), p.pop("securityContext")), "root"),
    ):
        broken = copy.deepcopy(gateway)
        pod = broken["spec"]["template"]["spec"]
        breakage(pod["containers"][0], pod)
        assert any(expected in problem for problem in policy_problems(broken)), expected


def _config(docs: list[dict[str, Any]]) -> AppConfig:
    config_map = next(d for d in docs if d["metadata"]["name"] == "llmso-config")
    return AppConfig.model_validate(yaml.safe_load(config_map["data"]["llmso.yaml"]))


def test_gateway_config_loads_and_replicas_match_the_engines(
    tool: Any, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    for overlay, docs in rendered.items():
        config = _config(docs)
        assert config.server.host == "0.0.0.0", overlay
        engines = tool.replica_urls(docs)
        proxies = [m for m in config.models if isinstance(m, OpenAIModelConfig)]
        if overlay == "gpu":
            assert engines == {"vllm": ["http://vllm-0.vllm:8000/v1", "http://vllm-1.vllm:8000/v1"]}
        for model in proxies:  # every engine URL the gateway names is one the overlay runs
            assert list(model.upstream_urls) in engines.values(), (overlay, model.name)
        gpu_requests = [
            c["resources"]["limits"].get("nvidia.com/gpu")
            for d in docs
            if d["kind"] == "StatefulSet"
            for c in d["spec"]["template"]["spec"]["containers"]
        ]
        assert all(gpu_requests), overlay


def test_adapter_rules_name_gateway_metrics(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["gpu"]
    adapter = next(d for d in docs if d["metadata"]["name"] == "llmso-prometheus-adapter-rules")
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    served = {rule["name"]["as"] for rule in rules}
    hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] == "Pods":
            assert metric["pods"]["metric"]["name"] in served
